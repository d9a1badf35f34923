#pragma once
// Index and scalar math shared by every backend's kernels.
//
// Everything here is a pure function of its arguments and marked TANDEM_HD, so
// the CUDA kernels call exactly the code that the CPU backend runs and that the
// CPU tests cover (DESIGN.md §6: the GPU cannot be exercised here). Keep it
// header-only, free of the standard library beyond <cmath>/<cstdint>/<cstring>, and free
// of anything that allocates or throws.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TANDEM_HD __host__ __device__
// Not __forceinline__: it expands to `__inline__ __attribute__((always_inline))`,
// and the uses also say `inline` (for the host), which nvcc rejects as a
// duplicate specifier.
#define TANDEM_HD_ALWAYS_INLINE __host__ __device__ __attribute__((always_inline))
#else
#define TANDEM_HD
#define TANDEM_HD_ALWAYS_INLINE [[gnu::always_inline]]
#endif

namespace tandem::engine::kmath {

// ---- Paged KV addressing -------------------------------------------------
// Position p of a sequence lives in block block_table[p / block_size] at slot
// p % block_size. Positions are never negative, so truncating division is floor.

// Index into the block table of the block holding position `pos`.
TANDEM_HD inline int32_t blockIndexOf(int32_t pos, int32_t block_size) { return pos / block_size; }
// Slot of position `pos` inside its block.
TANDEM_HD inline int32_t slotOf(int32_t pos, int32_t block_size) { return pos % block_size; }
// Blocks needed to hold `num_tokens` positions [0, num_tokens).
TANDEM_HD inline int32_t blocksFor(int32_t num_tokens, int32_t block_size) {
  return (num_tokens + block_size - 1) / block_size;
}

// Float offset of K (`is_value` false) or V (`is_value` true) of token `slot`,
// KV head `kv_head`, in block `block` of layer `layer`, in KvStorage's layout
// [num_layers][num_blocks][2][block_size][num_kv_heads][head_dim]. A device
// kernel indexes the raw region with it; a test pins it to KvStorage::key/value.
TANDEM_HD inline size_t kvOffset(int32_t layer, int32_t block, bool is_value, int32_t slot, int32_t kv_head,
                                 int32_t num_blocks, int32_t block_size, int32_t num_kv_heads, int32_t head_dim) {
  size_t layer_block = static_cast<size_t>(layer) * static_cast<size_t>(num_blocks) + static_cast<size_t>(block);
  size_t kv = layer_block * 2 + (is_value ? 1 : 0);
  size_t token = kv * static_cast<size_t>(block_size) + static_cast<size_t>(slot);
  return (token * static_cast<size_t>(num_kv_heads) + static_cast<size_t>(kv_head)) * static_cast<size_t>(head_dim);
}

// ---- Attention -------------------------------------------------------------

// Grouped-query attention: query head `q_head` reads KV head q_head / group,
// where group = num_heads / num_kv_heads (consecutive query heads share a KV
// head, as in HF's repeat_kv). Requires num_heads % num_kv_heads == 0.
TANDEM_HD inline int32_t kvHeadFor(int32_t q_head, int32_t num_heads, int32_t num_kv_heads) {
  return q_head / (num_heads / num_kv_heads);
}

// Keys visible to row `row` (0-based) of a chunk starting at `start_pos`:
// causal, so positions [0, start_pos + row] inclusive.
TANDEM_HD inline int32_t visibleKeys(int32_t start_pos, int32_t row) { return start_pos + row + 1; }

// Softmax scale of scaled dot-product attention.
TANDEM_HD inline float attentionScale(int32_t head_dim) {
  return static_cast<float>(1.0 / sqrt(static_cast<double>(head_dim)));
}

// ---- RoPE (Llama / HF "rotate_half") ---------------------------------------
// Dimension i (0 <= i < head_dim/2) is rotated together with i + head_dim/2 by
// angle pos * inv_freq(i), inv_freq(i) = theta^(-2i/head_dim):
//   x'[i]        = x[i] * cos - x[i + half] * sin
//   x'[i + half] = x[i + half] * cos + x[i] * sin
// HF computes inv_freq and the angle in fp32; we round at the same points so
// long positions drift the same way, and take cos/sin of that fp32 angle in
// double (torch's fp32 cos/sin are accurate to ~1 ulp, so this matches it
// closely and is the same on host and device).

TANDEM_HD inline float ropeInvFreq(int32_t i, int32_t head_dim, float theta) {
  return static_cast<float>(1.0 / pow(static_cast<double>(theta), 2.0 * i / static_cast<double>(head_dim)));
}

TANDEM_HD inline float ropeAngle(int32_t pos, int32_t i, int32_t head_dim, float theta) {
  return static_cast<float>(pos) * ropeInvFreq(i, head_dim, theta);
}

// cos and sin of the angle pos * inv_freq (rounded to fp32 like HF's
// position · inv_freq product); one pair serves every head of the token.
// inv_freq may be ropeInvFreq's or a scaled one (rope_scaling llama3).
TANDEM_HD inline void ropeCosSinFreq(int32_t pos, float inv_freq, float* c, float* s) {
  const double angle = static_cast<float>(pos) * inv_freq;
  *c = static_cast<float>(cos(angle));
  *s = static_cast<float>(sin(angle));
}

// cos and sin of the angle for (pos, i) of plain RoPE.
TANDEM_HD inline void ropeCosSin(int32_t pos, int32_t i, int32_t head_dim, float theta, float* c, float* s) {
  ropeCosSinFreq(pos, ropeInvFreq(i, head_dim, theta), c, s);
}

// Rotates one head's vector x[head_dim] in place, given cos[head_dim/2] and
// sin[head_dim/2] of its position (from ropeCosSin).
TANDEM_HD inline void ropeRotateHead(float* x, const float* cos_t, const float* sin_t, int32_t head_dim) {
  const int32_t half = head_dim / 2;
  for (int32_t i = 0; i < half; ++i) {
    const float a = x[i];
    const float b = x[i + half];
    x[i] = a * cos_t[i] - b * sin_t[i];
    x[i + half] = b * cos_t[i] + a * sin_t[i];
  }
}

// ---- Activations ---------------------------------------------------------------

// SiLU(gate) * up, the SwiGLU of Llama's MLP.
TANDEM_HD inline float swiglu(float gate, float up) { return gate / (1.0f + expf(-gate)) * up; }

// ---- e^x from IEEE operations only -------------------------------------------
// + - * / and fma are exactly rounded everywhere, so this gives the same bits
// on every CPU, at every SIMD width and on a GPU, unlike the libraries' expf
// (glibc's scalar and vector variants round differently from each other and
// from CUDA's). The CPU backend's SwiGLU and the portable kernels use it.
// x is clamped to [-87, 88] (results in [1.6e-38, 1.7e38]: no overflow, no
// subnormals; e^-inf is therefore 1.6e-38, not 0: callers that mask use 0
// themselves). Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2, Cephes
// expf's polynomial for e^r (relative error ~1e-7), 2^n added to the exponent.

TANDEM_HD_ALWAYS_INLINE inline int32_t floatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_int(f);
#else
  int32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
#endif
}

TANDEM_HD_ALWAYS_INLINE inline float floatFromBits(int32_t bits) {
#if defined(__CUDA_ARCH__)
  return __int_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
#endif
}

TANDEM_HD_ALWAYS_INLINE inline float expIeee(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = fmaf(x, 1.44269504088896341f, kRound) - kRound;
  float r = fmaf(n, -0.693359375f, x);  // ln 2 = 0.693359375 - 2.12194440e-4, the first part exact in n * it
  r = fmaf(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = fmaf(p, r, 1.3981999507e-3f);
  p = fmaf(p, r, 8.3334519073e-3f);
  p = fmaf(p, r, 4.1665795894e-2f);
  p = fmaf(p, r, 1.6666665459e-1f);
  p = fmaf(p, r, 5.0000001201e-1f);
  const float e_r = fmaf(p, r * r, r) + 1.0f;
  const int32_t bits =
      floatBits(e_r) + static_cast<int32_t>(static_cast<uint32_t>(static_cast<int32_t>(n)) << 23);
  return floatFromBits(bits);
}

// ---- bfloat16 ------------------------------------------------------------------
// The top 16 bits of an fp32, rounded to nearest, ties to even (what
// PyTorch and the GPU's conversions do); NaN stays NaN (quiet), infinities
// stay infinities, and a finite value past bf16's largest becomes infinity.
// Widening back is exact. The safetensors reader and writer, the CPU
// backend's bf16 GEMM inputs and the GPU's conversion kernel all use these.
TANDEM_HD_ALWAYS_INLINE inline uint16_t bf16Bits(float x) {
  const auto bits = static_cast<uint32_t>(floatBits(x));
  // A NaN's payload could carry into the exponent when rounded; setting the
  // top mantissa bit keeps it a (quiet) NaN.
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
TANDEM_HD_ALWAYS_INLINE inline float bf16Value(uint16_t h) {
  return floatFromBits(static_cast<int32_t>(static_cast<uint32_t>(h) << 16));
}
// x rounded to the nearest bf16, as an fp32.
TANDEM_HD_ALWAYS_INLINE inline float roundToBf16(float x) { return bf16Value(bf16Bits(x)); }

}  // namespace tandem::engine::kmath
