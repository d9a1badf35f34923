#pragma once
// Vec: 16 float lanes, one type per SIMD level (simd.h), for the CPU
// backend's vector kernels (GEMM, attention). A kernel is written once
// against Vec and compiled per level: a .cc includes its kernel inside
// `namespace <level> { using Vec = simd_vec::<level>::Vec; ... }`, under
// the same `#pragma GCC target` as the level here.
//
// Every operation is the same IEEE operation on every level, lane by lane,
// and the horizontal ones reduce in one fixed tree, so a kernel gives the
// same bits on every level:
//   zero, set1, load, store (unaligned), add, sub, mul,
//   fma(a, b, c)             a * b + c rounded once
//   max(a, b)                lane-wise a > b ? a : b
//   keepFirst(a, n, fill)    lanes [0, n) of a, `fill` in the others
//   anyGreater(a, b)         whether a > b in some lane
//   first(a)                 lane 0
//   fractionalPart(x)        x - floor(x) (one rounding)
//   scaleByPow2Floor(p, x)   p * 2^floor(x) for x in [-125, 1), p in [0.5, 2) (exact)
//   hmax, hsum               fold halves: lane i with lane i + 8, then + 4, + 2, + 1
//
// Plain pointers and builtins only (no standard-library templates): a
// template instantiated under a level's target could be emitted with that
// level's instructions and picked by the linker for callers of another level.

// GCC 12's AVX-512 intrinsics initialise their "undefined" operands from
// themselves and trip -Wuninitialized once inlined (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cmath>
#include <cstdint>
#include <cstring>

namespace tandem::engine::simd_vec {

constexpr int kLanes = 16;

namespace portable {

struct Vec {
  float x[kLanes];

  static Vec zero() { return set1(0.0f); }
  static Vec set1(float a) {
    Vec r;
    for (int i = 0; i < kLanes; ++i) r.x[i] = a;
    return r;
  }
  static Vec load(const float* p) {
    Vec r;
    std::memcpy(r.x, p, sizeof(r.x));
    return r;
  }
  static void store(float* p, Vec a) { std::memcpy(p, a.x, sizeof(a.x)); }
  static Vec add(Vec a, Vec b) {
    for (int i = 0; i < kLanes; ++i) a.x[i] += b.x[i];
    return a;
  }
  static Vec sub(Vec a, Vec b) {
    for (int i = 0; i < kLanes; ++i) a.x[i] -= b.x[i];
    return a;
  }
  static Vec mul(Vec a, Vec b) {
    for (int i = 0; i < kLanes; ++i) a.x[i] *= b.x[i];
    return a;
  }
  static Vec fma(Vec a, Vec b, Vec c) {
    for (int i = 0; i < kLanes; ++i) c.x[i] = std::fma(a.x[i], b.x[i], c.x[i]);
    return c;
  }
  static Vec max(Vec a, Vec b) {
    for (int i = 0; i < kLanes; ++i) a.x[i] = a.x[i] > b.x[i] ? a.x[i] : b.x[i];
    return a;
  }
  static Vec keepFirst(Vec a, int32_t n, float fill) {
    for (int i = n; i < kLanes; ++i) a.x[i] = fill;
    return a;
  }
  static bool anyGreater(Vec a, Vec b) {
    bool any = false;
    for (int i = 0; i < kLanes; ++i) any = any || a.x[i] > b.x[i];
    return any;
  }
  static float first(Vec a) { return a.x[0]; }
  static Vec fractionalPart(Vec a) {
    for (int i = 0; i < kLanes; ++i) a.x[i] = a.x[i] - __builtin_floorf(a.x[i]);
    return a;
  }
  static Vec scaleByPow2Floor(Vec p, Vec x) {
    for (int i = 0; i < kLanes; ++i) {
      int32_t bits;
      std::memcpy(&bits, &p.x[i], sizeof(bits));
      bits += static_cast<int32_t>(static_cast<uint32_t>(static_cast<int32_t>(__builtin_floorf(x.x[i]))) << 23);
      std::memcpy(&p.x[i], &bits, sizeof(bits));
    }
    return p;
  }
  static float hmax(Vec a) {
    for (int half = kLanes / 2; half >= 1; half /= 2) {
      for (int i = 0; i < half; ++i) a.x[i] = a.x[i] > a.x[i + half] ? a.x[i] : a.x[i + half];
    }
    return a.x[0];
  }
  static float hsum(Vec a) {
    for (int half = kLanes / 2; half >= 1; half /= 2) {
      for (int i = 0; i < half; ++i) a.x[i] = a.x[i] + a.x[i + half];
    }
    return a.x[0];
  }
};

}  // namespace portable

#pragma GCC push_options
#pragma GCC target("avx2,fma")

// 128-bit tail of hmax/hsum shared by the AVX levels: x holds lanes i op i+4
// of the previous fold; returns (x0 op x2) op (x1 op x3).
inline float hmax128(__m128 x) {
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_max_ss(x, _mm_shuffle_ps(x, x, 1)));
}
inline float hsum128(__m128 x) {
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_shuffle_ps(x, x, 1)));
}

namespace avx2 {

// Two 8-lane halves: lanes 0-7 and 8-15.
struct Vec {
  __m256 lo, hi;

  static Vec zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static Vec set1(float a) { return {_mm256_set1_ps(a), _mm256_set1_ps(a)}; }
  static Vec load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static void store(float* p, Vec a) {
    _mm256_storeu_ps(p, a.lo);
    _mm256_storeu_ps(p + 8, a.hi);
  }
  static Vec add(Vec a, Vec b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
  static Vec sub(Vec a, Vec b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
  static Vec mul(Vec a, Vec b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
  static Vec fma(Vec a, Vec b, Vec c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
  static Vec max(Vec a, Vec b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
  static Vec keepFirst(Vec a, int32_t n, float fill) {
    const __m256i bound = _mm256_set1_epi32(n);
    const __m256 keep_lo = _mm256_castsi256_ps(_mm256_cmpgt_epi32(bound, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
    const __m256 keep_hi =
        _mm256_castsi256_ps(_mm256_cmpgt_epi32(bound, _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15)));
    const __m256 f = _mm256_set1_ps(fill);
    return {_mm256_blendv_ps(f, a.lo, keep_lo), _mm256_blendv_ps(f, a.hi, keep_hi)};
  }
  static bool anyGreater(Vec a, Vec b) {
    const __m256 gt = _mm256_or_ps(_mm256_cmp_ps(a.lo, b.lo, _CMP_GT_OQ), _mm256_cmp_ps(a.hi, b.hi, _CMP_GT_OQ));
    return _mm256_movemask_ps(gt) != 0;
  }
  static float first(Vec a) { return _mm256_cvtss_f32(a.lo); }
  static Vec fractionalPart(Vec a) {
    return {_mm256_sub_ps(a.lo, _mm256_floor_ps(a.lo)), _mm256_sub_ps(a.hi, _mm256_floor_ps(a.hi))};
  }
  static __m256 scaleHalf(__m256 p, __m256 x) {
    const __m256i e = _mm256_slli_epi32(_mm256_cvttps_epi32(_mm256_floor_ps(x)), 23);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
  }
  static Vec scaleByPow2Floor(Vec p, Vec x) { return {scaleHalf(p.lo, x.lo), scaleHalf(p.hi, x.hi)}; }
  static float hmax(Vec a) {
    const __m256 x = _mm256_max_ps(a.lo, a.hi);
    return hmax128(_mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1)));
  }
  static float hsum(Vec a) {
    const __m256 x = _mm256_add_ps(a.lo, a.hi);
    return hsum128(_mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1)));
  }
};

}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
namespace avx512 {

struct Vec {
  __m512 x;

  static Vec zero() { return {_mm512_setzero_ps()}; }
  static Vec set1(float a) { return {_mm512_set1_ps(a)}; }
  static Vec load(const float* p) { return {_mm512_loadu_ps(p)}; }
  static void store(float* p, Vec a) { _mm512_storeu_ps(p, a.x); }
  static Vec add(Vec a, Vec b) { return {_mm512_add_ps(a.x, b.x)}; }
  static Vec sub(Vec a, Vec b) { return {_mm512_sub_ps(a.x, b.x)}; }
  static Vec mul(Vec a, Vec b) { return {_mm512_mul_ps(a.x, b.x)}; }
  static Vec fma(Vec a, Vec b, Vec c) { return {_mm512_fmadd_ps(a.x, b.x, c.x)}; }
  static Vec max(Vec a, Vec b) { return {_mm512_max_ps(a.x, b.x)}; }
  static Vec keepFirst(Vec a, int32_t n, float fill) {
    const __mmask16 keep = static_cast<__mmask16>((1u << n) - 1u);
    return {_mm512_mask_blend_ps(keep, _mm512_set1_ps(fill), a.x)};
  }
  static bool anyGreater(Vec a, Vec b) { return _mm512_cmp_ps_mask(a.x, b.x, _CMP_GT_OQ) != 0; }
  static float first(Vec a) { return _mm512_cvtss_f32(a.x); }
  // (Not vreduceps: its result for x in (-1, 0) is rounded differently from x - floor(x).)
  static Vec fractionalPart(Vec a) {
    return {_mm512_sub_ps(a.x, _mm512_roundscale_ps(a.x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC))};
  }
  // vscalefps (scales by 2^floor(x)); exact, and so equal to the other levels' exponent add, for these arguments.
  static Vec scaleByPow2Floor(Vec p, Vec x) { return {_mm512_scalef_ps(p.x, x.x)}; }
  static __m256 lowHalf(__m512 a) { return _mm512_castps512_ps256(a); }
  static __m256 highHalf(__m512 a) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)); }
  static float hmax(Vec a) {
    const __m256 x = _mm256_max_ps(lowHalf(a.x), highHalf(a.x));
    return hmax128(_mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1)));
  }
  static float hsum(Vec a) {
    const __m256 x = _mm256_add_ps(lowHalf(a.x), highHalf(a.x));
    return hsum128(_mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1)));
  }
};

}  // namespace avx512
#pragma GCC pop_options

}  // namespace tandem::engine::simd_vec
