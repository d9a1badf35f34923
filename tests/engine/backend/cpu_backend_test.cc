#include "engine/backend/cpu/cpu_backend.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <random>
#include <vector>

#include <cblas.h>
#include <gtest/gtest.h>

#include "engine/backend/kernel_math.h"

namespace tandem::engine {
namespace {

std::string lowerAscii(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Plain RoPE's inverse frequencies (what ropeInverseFrequencies gives without rope_scaling).
std::vector<float> invFreq(int head_dim, float theta) {
  std::vector<float> f(static_cast<size_t>(head_dim / 2));
  for (int i = 0; i < head_dim / 2; ++i) f[static_cast<size_t>(i)] = kmath::ropeInvFreq(i, head_dim, theta);
  return f;
}

std::vector<float> randomVector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// y[m, n] = x[m, k] · w[n, k]ᵀ in double, the textbook triple loop.
std::vector<double> naiveGemm(const std::vector<float>& x, const std::vector<float>& w, int m, int n, int k) {
  std::vector<double> y(static_cast<size_t>(m) * static_cast<size_t>(n), 0.0);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double acc = 0;
      for (int l = 0; l < k; ++l) {
        acc += static_cast<double>(x[static_cast<size_t>(i * k + l)]) * w[static_cast<size_t>(j * k + l)];
      }
      y[static_cast<size_t>(i * n + j)] = acc;
    }
  }
  return y;
}

TEST(CpuBackendGemm, MatchesNaiveTripleLoop) {
  CpuBackend backend;
  struct Shape {
    int m, n, k;
  };
  for (Shape s : {Shape{1, 1, 1}, Shape{1, 256, 256}, Shape{3, 64, 256}, Shape{37, 100, 256}, Shape{5, 7, 300},
                  Shape{64, 688, 256}, Shape{2, 1500, 33}}) {
    const auto x = randomVector(static_cast<size_t>(s.m * s.k), 1);
    const auto w = randomVector(static_cast<size_t>(s.n * s.k), 2);
    const auto want = naiveGemm(x, w, s.m, s.n, s.k);
    std::vector<float> y(static_cast<size_t>(s.m * s.n), 123.0f);
    backend.gemm(x.data(), w.data(), y.data(), s.m, s.n, s.k, /*accumulate=*/false);
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_NEAR(y[i], want[i], 2e-6 * s.k) << "m=" << s.m << " n=" << s.n << " k=" << s.k << " i=" << i;
    }
    // Accumulate adds onto what is there.
    const auto base = randomVector(y.size(), 3);
    std::vector<float> acc = base;
    backend.gemm(x.data(), w.data(), acc.data(), s.m, s.n, s.k, /*accumulate=*/true);
    for (size_t i = 0; i < acc.size(); ++i) {
      ASSERT_NEAR(acc[i], want[i] + base[i], 2e-6 * s.k) << "accumulate, m=" << s.m << " i=" << i;
    }
  }
}

// gemm.h's order, spelled out in scalar code: one fused multiply-add per
// p, in order, from +0; accumulate adds the sum to y.
float documentedOrder(const float* x, const float* w, int k, float y, bool accumulate) {
  float s = 0.0f;
  for (int p = 0; p < k; ++p) s = std::fma(x[p], w[p], s);
  return accumulate ? y + s : s;
}

std::vector<SimdLevel> supportedLevels() {
  std::vector<SimdLevel> levels;
  for (SimdLevel level : {SimdLevel::kPortable, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (simdLevelSupported(level)) {
      levels.push_back(level);
    } else {
      std::printf("SIMD level %s: not supported by this CPU, skipped\n", std::string(simdLevelName(level)).c_str());
    }
  }
  return levels;
}

// Every output element, on every SIMD level the CPU runs and on 1 or 2
// threads, is exactly the documented order: so a row's bits cannot depend
// on the batch, and an AVX2 and an AVX-512 machine compute the same bits.
TEST(CpuBackendGemm, EveryLevelAndThreadCountComputesTheDocumentedOrder) {
  struct Shape {
    int m, n, k;
  };
  // n around multiples of 16 (partial last panels), edges of every tile
  // shape, and one big enough to run on the pool (>= 4M multiply-adds).
  const Shape shapes[] = {{1, 1, 1},   {1, 5, 15},    {3, 7, 16},    {5, 9, 17},      {2, 3, 33},
                          {7, 13, 64}, {9, 66, 100},  {4, 4, 256},   {33, 70, 300},   {1, 256, 256},
                          {6, 5, 688}, {130, 200, 257}};
  for (SimdLevel level : supportedLevels()) {
    for (int threads : {1, 2}) {
      CpuBackend backend(CpuBackendOptions{.num_threads = threads, .simd = level});
      ASSERT_EQ(backend.simdLevel(), level);
      for (const Shape& s : shapes) {
        const auto x = randomVector(static_cast<size_t>(s.m * s.k), 21);
        const auto w = randomVector(static_cast<size_t>(s.n * s.k), 22);
        const auto base = randomVector(static_cast<size_t>(s.m * s.n), 23);
        for (bool accumulate : {false, true}) {
          std::vector<float> y = base;
          backend.gemm(x.data(), w.data(), y.data(), s.m, s.n, s.k, accumulate);
          for (int i = 0; i < s.m; ++i) {
            for (int j = 0; j < s.n; ++j) {
              const size_t at = static_cast<size_t>(i * s.n + j);
              const float want = documentedOrder(x.data() + i * s.k, w.data() + j * s.k, s.k, base[at], accumulate);
              ASSERT_EQ(std::memcmp(&y[at], &want, sizeof(float)), 0)
                  << simdLevelName(level) << " threads=" << threads << " m=" << s.m << " n=" << s.n << " k=" << s.k
                  << " accumulate=" << accumulate << " at (" << i << ", " << j << "): " << y[at] << " vs " << want;
            }
          }
        }
      }
    }
  }
}

// A weight prepared once (as the model does) and a plain one packed per
// call give the same bits, and so do two backends' preparations.
TEST(CpuBackendGemm, PreparedWeightEqualsPlainWeight) {
  CpuBackend backend;
  CpuBackend other(CpuBackendOptions{.num_threads = 1});
  const int m = 37, n = 70, k = 45;
  const auto x = randomVector(static_cast<size_t>(m * k), 41);
  const auto w = randomVector(static_cast<size_t>(n * k), 42);
  const auto base = randomVector(static_cast<size_t>(m * n), 43);
  const std::unique_ptr<PreparedWeight> prepared = backend.prepareWeight(w.data(), n, k);
  EXPECT_EQ(prepared->n(), n);
  EXPECT_EQ(prepared->k(), k);
  for (bool accumulate : {false, true}) {
    std::vector<float> plain = base, with_prepared = base, on_other = base;
    backend.gemm(x.data(), w.data(), plain.data(), m, n, k, accumulate);
    backend.gemm(x.data(), *prepared, with_prepared.data(), m, accumulate);
    const std::unique_ptr<PreparedWeight> again = other.prepareWeight(w.data(), n, k);
    other.gemm(x.data(), *again, on_other.data(), m, accumulate);
    EXPECT_TRUE(plain == with_prepared) << "accumulate=" << accumulate;
    EXPECT_TRUE(plain == on_other) << "accumulate=" << accumulate;
  }
}

// GemmDtype::kBfloat16: a prepared weight's GEMM is the fp32 GEMM of x and
// w rounded to bf16 (the same bits), accumulating into y as fp32; a plain
// weight's GEMM stays fp32; and the result is not the fp32 one.
TEST(CpuBackendGemm, Bf16ModeRoundsThePreparedGemmsInputsAndWeights) {
  CpuBackend fp32;
  CpuBackend bf16(CpuBackendOptions{.gemm_dtype = GemmDtype::kBfloat16});
  EXPECT_EQ(bf16.gemmDtype(), GemmDtype::kBfloat16);
  const int m = 9, n = 70, k = 45;
  const auto x = randomVector(static_cast<size_t>(m * k), 51);
  const auto w = randomVector(static_cast<size_t>(n * k), 52);
  const auto base = randomVector(static_cast<size_t>(m * n), 53);
  std::vector<float> x_rounded(x.size()), w_rounded(w.size());
  for (size_t i = 0; i < x.size(); ++i) x_rounded[i] = kmath::roundToBf16(x[i]);
  for (size_t i = 0; i < w.size(); ++i) w_rounded[i] = kmath::roundToBf16(w[i]);
  const std::unique_ptr<PreparedWeight> prepared = bf16.prepareWeight(w.data(), n, k);
  for (bool accumulate : {false, true}) {
    std::vector<float> got = base, want = base, plain = base, plain_fp32 = base, full = base;
    bf16.gemm(x.data(), *prepared, got.data(), m, accumulate);
    fp32.gemm(x_rounded.data(), w_rounded.data(), want.data(), m, n, k, accumulate);
    EXPECT_TRUE(got == want) << "accumulate=" << accumulate;
    bf16.gemm(x.data(), w.data(), plain.data(), m, n, k, accumulate);
    fp32.gemm(x.data(), w.data(), plain_fp32.data(), m, n, k, accumulate);
    EXPECT_TRUE(plain == plain_fp32) << "a plain weight's GEMM is fp32 in every mode";
    fp32.gemm(x.data(), w.data(), full.data(), m, n, k, accumulate);
    EXPECT_FALSE(got == full) << "bf16 inputs should change some bits";
  }
}

// The determinism the engine depends on: a row's result is bitwise the same
// whether computed alone (a decode step, the last piece of a chunked
// prefill) or inside batches of 2, 7, 32 and 256 rows, at the first, a
// middle and the last place. Shapes are the tiny model's projections and a
// few others; the 256-row batches run on the pool.
TEST(CpuBackendGemm, BatchCompositionIsBitwiseStable) {
  CpuBackend backend;
  struct Shape {
    int n, k;
  };
  const int kRows = 300;
  for (Shape s : {Shape{256, 256}, Shape{64, 256}, Shape{688, 256}, Shape{256, 688}, Shape{100, 256}, Shape{32, 64},
                  Shape{8, 300}, Shape{1201, 40}}) {
    const auto x = randomVector(static_cast<size_t>(kRows * s.k), 11);
    const auto w = randomVector(static_cast<size_t>(s.n * s.k), 12);
    const auto base = randomVector(static_cast<size_t>(kRows * s.n), 13);
    for (bool accumulate : {false, true}) {
      // Each row alone.
      std::vector<float> alone = base;
      for (int r = 0; r < kRows; ++r) {
        backend.gemm(x.data() + r * s.k, w.data(), alone.data() + r * s.n, 1, s.n, s.k, accumulate);
      }
      for (int batch : {2, 7, 32, 256}) {
        for (int offset : {0, (kRows - batch) / 2, kRows - batch}) {
          std::vector<float> part(base.begin() + offset * s.n, base.begin() + (offset + batch) * s.n);
          backend.gemm(x.data() + offset * s.k, w.data(), part.data(), batch, s.n, s.k, accumulate);
          for (int r = 0; r < batch; ++r) {
            ASSERT_EQ(std::memcmp(part.data() + r * s.n, alone.data() + (offset + r) * s.n, s.n * sizeof(float)), 0)
                << "n=" << s.n << " k=" << s.k << " batch=" << batch << " offset=" << offset << " row " << r
                << " accumulate=" << accumulate;
          }
        }
      }
    }
  }
}

// Against an independent implementation: OpenBLAS's sgemm, with whichever
// core's kernels this CPU or OPENBLAS_CORETYPE picks (the CTest variants
// run this under each core type). They sum in other orders, so they agree
// within rounding: |ours - blas| <= 2 k eps sum_p |x_p w_p| per element.
TEST(CpuBackendGemm, AgreesWithOpenBlasWithinRounding) {
  const std::string core = openblas_get_corename();
  std::printf("OpenBLAS core: %s\n", core.c_str());
  if (const char* want = std::getenv("OPENBLAS_CORETYPE"); want != nullptr && *want != '\0') {
    EXPECT_EQ(lowerAscii(core), lowerAscii(want)) << "OPENBLAS_CORETYPE did not take effect";
  }
  CpuBackend backend;
  struct Shape {
    int m, n, k;
  };
  for (Shape s : {Shape{512, 256, 256}, Shape{1, 688, 256}, Shape{7, 256, 688}, Shape{32, 64, 256},
                  Shape{13, 100, 37}, Shape{3, 1500, 33}}) {
    const auto x = randomVector(static_cast<size_t>(s.m * s.k), 31);
    const auto w = randomVector(static_cast<size_t>(s.n * s.k), 32);
    std::vector<float> ours(static_cast<size_t>(s.m * s.n)), blas(ours.size());
    backend.gemm(x.data(), w.data(), ours.data(), s.m, s.n, s.k, /*accumulate=*/false);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s.m, s.n, s.k, 1.0f, x.data(), s.k, w.data(), s.k, 0.0f,
                blas.data(), s.n);
    for (int i = 0; i < s.m; ++i) {
      for (int j = 0; j < s.n; ++j) {
        double magnitude = 0;
        for (int p = 0; p < s.k; ++p) magnitude += std::abs(double{x[static_cast<size_t>(i * s.k + p)]} * w[static_cast<size_t>(j * s.k + p)]);
        const size_t at = static_cast<size_t>(i * s.n + j);
        ASSERT_LE(std::abs(double{ours[at]} - blas[at]), 2.0 * s.k * 0x1p-24 * magnitude)
            << core << " m=" << s.m << " n=" << s.n << " k=" << s.k << " at (" << i << ", " << j << ")";
      }
    }
  }
}

TEST(CpuBackendGemm, StatsCountCallsFlopsAndTime) {
  CpuBackend backend;
  EXPECT_EQ(backend.stats().gemm_calls, 0);
  const auto x = randomVector(4 * 64, 1), w = randomVector(32 * 64, 2);
  std::vector<float> y(4 * 32);
  backend.gemm(x.data(), w.data(), y.data(), 4, 32, 64, false);
  backend.gemm(x.data(), w.data(), y.data(), 1, 32, 64, true);
  std::vector<float> logits(2 * 32);
  const std::unique_ptr<PreparedWeight> lm_head = backend.prepareWeight(w.data(), 32, 64);
  backend.logits(x.data(), *lm_head, logits.data(), 2);
  const BackendStats stats = backend.stats();
  EXPECT_EQ(stats.gemm_calls, 3);
  EXPECT_DOUBLE_EQ(stats.gemm_flops, 2.0 * 64 * 32 * (4 + 1 + 2));
  EXPECT_GT(stats.gemm_time.count(), 0);
  EXPECT_EQ(stats.attention_time.count(), 0);
  EXPECT_EQ(stats.elementwise_time.count(), 0);
  // Element-wise kernels count apart from the GEMMs.
  std::vector<float> norm(4 * 64);
  const std::vector<float> weight(64, 1.0f);
  backend.rmsNorm(x.data(), weight.data(), norm.data(), 4, 64, 1e-5f);
  EXPECT_GT(backend.stats().elementwise_time.count(), 0);
  EXPECT_EQ(backend.stats().gemm_time, stats.gemm_time);
  backend.resetStats();
  EXPECT_EQ(backend.stats().gemm_calls, 0);
  EXPECT_EQ(backend.stats().gemm_time.count(), 0);
  EXPECT_EQ(backend.stats().gemm_flops, 0.0);
  EXPECT_EQ(backend.stats().elementwise_time.count(), 0);
}

TEST(CpuBackend, RmsNormMatchesFormula) {
  CpuBackend backend;
  const int rows = 3, dim = 37;
  const auto x = randomVector(rows * dim, 5, 3.0f);
  const auto weight = randomVector(dim, 6);
  std::vector<float> out(rows * dim);
  backend.rmsNorm(x.data(), weight.data(), out.data(), rows, dim, 1e-5f);
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
    for (int i = 0; i < dim; ++i) {
      const double want = x[r * dim + i] * inv * weight[i];
      EXPECT_NEAR(out[r * dim + i], want, 1e-5 * (1 + std::abs(want))) << r << "," << i;
    }
  }
  // In place gives the same bits.
  std::vector<float> in_place = x;
  backend.rmsNorm(in_place.data(), weight.data(), in_place.data(), rows, dim, 1e-5f);
  EXPECT_EQ(in_place, out);
}

TEST(CpuBackend, RopeMatchesFormulaPerRowPosition) {
  CpuBackend backend;
  const int rows = 4, heads = 3, head_dim = 16;
  const float theta = 10000.0f;
  const auto x = randomVector(rows * heads * head_dim, 7);
  const std::vector<int32_t> positions = {0, 1, 17, 250};
  std::vector<float> y = x;
  backend.rope(y.data(), rows, heads, head_dim, positions.data(), invFreq(head_dim, theta));
  const int half = head_dim / 2;
  for (int r = 0; r < rows; ++r) {
    for (int h = 0; h < heads; ++h) {
      const float* in = x.data() + (r * heads + h) * head_dim;
      const float* out = y.data() + (r * heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const double angle = positions[r] * std::pow(static_cast<double>(theta), -2.0 * i / head_dim);
        const double a = in[i], b = in[i + half];
        EXPECT_NEAR(out[i], a * std::cos(angle) - b * std::sin(angle), 1e-4) << r << " " << h << " " << i;
        EXPECT_NEAR(out[i + half], b * std::cos(angle) + a * std::sin(angle), 1e-4) << r << " " << h << " " << i;
      }
    }
  }
}

// rope caches cos/sin per position; the bits must be kmath's, in any order
// of positions, beyond the cache's range, and after the frequencies change
// (theta, or a scaled set like rope_scaling llama3's).
TEST(CpuBackend, RopeIsBitwiseKernelMath) {
  CpuBackend backend;
  const int heads = 2, head_dim = 8, half = head_dim / 2;
  const std::vector<int32_t> positions = {300, 0, 7, 299, 100000, 7};
  std::vector<float> scaled = invFreq(head_dim, 500000.0f);
  for (size_t i = 1; i < scaled.size(); ++i) scaled[i] /= 8.0f;
  for (const auto& freq : {invFreq(head_dim, 10000.0f), invFreq(head_dim, 500000.0f), scaled}) {
    const auto x = randomVector(positions.size() * heads * head_dim, 12);
    std::vector<float> got = x;
    backend.rope(got.data(), static_cast<int32_t>(positions.size()), heads, head_dim, positions.data(), freq);
    std::vector<float> want = x;
    for (size_t r = 0; r < positions.size(); ++r) {
      float c[half], sn[half];
      for (int i = 0; i < half; ++i) kmath::ropeCosSinFreq(positions[r], freq[static_cast<size_t>(i)], &c[i], &sn[i]);
      for (int h = 0; h < heads; ++h) kmath::ropeRotateHead(want.data() + (r * heads + h) * head_dim, c, sn, head_dim);
    }
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << freq[1];
  }
  // Plain frequencies give kmath::ropeCosSin's bits (the Llama 2 path is unchanged).
  float c1, s1, c2, s2;
  kmath::ropeCosSin(299, 3, head_dim, 10000.0f, &c1, &s1);
  kmath::ropeCosSinFreq(299, invFreq(head_dim, 10000.0f)[3], &c2, &s2);
  EXPECT_EQ(c1, c2);
  EXPECT_EQ(s1, s2);
}

TEST(CpuBackend, AddBiasAddsToEveryRow) {
  CpuBackend backend;
  std::vector<float> y = {1, 2, 3, 4, 5, 6};
  const std::vector<float> bias = {0.5f, -1, 2};
  backend.addBias(y.data(), bias.data(), 2, 3);
  EXPECT_EQ(y, (std::vector<float>{1.5f, 1, 5, 4.5f, 4, 8}));
}

TEST(CpuBackend, SwigluMatchesFormula) {
  CpuBackend backend;
  const auto gate = randomVector(100, 8, 6.0f), up = randomVector(100, 9, 2.0f);
  std::vector<float> out(100);
  backend.swiglu(gate.data(), up.data(), out.data(), 100);
  for (size_t i = 0; i < out.size(); ++i) {
    const double g = gate[i];
    const double want = g / (1 + std::exp(-g)) * up[i];
    EXPECT_NEAR(out[i], want, 1e-6 * (1 + std::abs(want))) << i;
  }
}

// Extreme gates too: the exp's clamping must keep the formula's limits.
TEST(CpuBackend, SwigluMatchesFormulaAtExtremes) {
  CpuBackend backend;
  const std::vector<float> gate = {-200.0f, -90.0f, -87.5f, -30.0f, -1e-3f, 0.0f, 1e-3f, 30.0f, 87.5f, 90.0f, 200.0f};
  const std::vector<float> up(gate.size(), 1.5f);
  std::vector<float> out(gate.size());
  backend.swiglu(gate.data(), up.data(), out.data(), static_cast<int64_t>(gate.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    const double g = gate[i];
    const double want = g / (1 + std::exp(-g)) * up[i];
    EXPECT_NEAR(out[i], want, 1e-6 * (1 + std::abs(want))) << g;
  }
}

// The engine's determinism needs an element's result to be independent of
// where it sits in the call (vector body or remainder) and of the SIMD level.
TEST(CpuBackend, SwigluIsBitwiseStableAcrossOffsetsAndLevels) {
  const auto gate = randomVector(1000, 10, 12.0f), up = randomVector(1000, 11, 2.0f);
  CpuBackend backend;
  std::vector<float> whole(gate.size());
  backend.swiglu(gate.data(), up.data(), whole.data(), static_cast<int64_t>(gate.size()));
  for (size_t offset : {1, 3, 17}) {
    std::vector<float> part(gate.size() - offset);
    backend.swiglu(gate.data() + offset, up.data() + offset, part.data(), static_cast<int64_t>(part.size()));
    EXPECT_EQ(std::memcmp(part.data(), whole.data() + offset, part.size() * sizeof(float)), 0) << offset;
  }
  for (size_t i = 0; i < gate.size(); i += 97) {
    float one = 0;
    backend.swiglu(&gate[i], &up[i], &one, 1);
    EXPECT_EQ(std::memcmp(&one, &whole[i], sizeof(float)), 0) << i;
  }
  for (SimdLevel level : {SimdLevel::kPortable, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (!simdLevelSupported(level)) continue;
    CpuBackend at_level(CpuBackendOptions{.simd = level});
    std::vector<float> out(gate.size());
    at_level.swiglu(gate.data(), up.data(), out.data(), static_cast<int64_t>(gate.size()));
    EXPECT_EQ(std::memcmp(out.data(), whole.data(), out.size() * sizeof(float)), 0) << static_cast<int>(level);
  }
}

// RMSNorm and RoPE rows: the same bits on every SIMD level, alone or in a
// call large enough to be shared out over the worker pool, and for RMSNorm
// the bits of the plain loop (8 partial sums combined pairwise) it replaced.
TEST(CpuBackend, RmsNormAndRopeAreBitwiseStableAcrossCallsAndLevels) {
  const int rows = 300, dim = 256, heads = 8, head_dim = 32;
  const auto x = randomVector(rows * dim, 12, 3.0f), weight = randomVector(dim, 13);
  std::vector<int32_t> positions(rows);
  for (int r = 0; r < rows; ++r) positions[static_cast<size_t>(r)] = (r * 37) % 1000;
  std::vector<float> want_norm(x.size());
  for (int r = 0; r < rows; ++r) {
    const float* xr = x.data() + r * dim;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < dim; i += 8) {
      for (int l = 0; l < 8; ++l) acc[l] += xr[i + l] * xr[i + l];
    }
    const float ss = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + 0.0f;
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(dim) + 1e-5f);
    for (int i = 0; i < dim; ++i) want_norm[static_cast<size_t>(r * dim + i)] = (xr[i] * inv) * weight[i];
  }
  CpuBackend reference;
  std::vector<float> want_rope = x;
  for (int r = 0; r < rows; ++r) {
    reference.rope(want_rope.data() + r * dim, 1, heads, head_dim, &positions[static_cast<size_t>(r)],
                   invFreq(head_dim, 10000.0f));
  }
  for (SimdLevel level : {SimdLevel::kAuto, SimdLevel::kPortable, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (!simdLevelSupported(level)) continue;
    CpuBackend backend(CpuBackendOptions{.simd = level});
    std::vector<float> norm(x.size());
    backend.rmsNorm(x.data(), weight.data(), norm.data(), rows, dim, 1e-5f);
    EXPECT_EQ(std::memcmp(norm.data(), want_norm.data(), norm.size() * sizeof(float)), 0) << static_cast<int>(level);
    std::vector<float> rotated = x;
    backend.rope(rotated.data(), rows, heads, head_dim, positions.data(), invFreq(head_dim, 10000.0f));
    EXPECT_EQ(std::memcmp(rotated.data(), want_rope.data(), rotated.size() * sizeof(float)), 0)
        << static_cast<int>(level);
  }
}

TEST(CpuBackend, GatherRows) {
  CpuBackend backend;
  const std::vector<float> src = {0, 1, 10, 11, 20, 21, 30, 31};  // [4, 2]
  const std::vector<int32_t> rows = {3, 0, 3};
  std::vector<float> dst(6);
  backend.gatherRows(src.data(), rows.data(), 3, 2, dst.data());
  EXPECT_EQ(dst, (std::vector<float>{30, 31, 0, 1, 30, 31}));
}

TEST(CpuBackend, WriteKvScattersRowsThroughBlockTables) {
  CpuBackend backend;
  KvLayout layout{.num_layers = 2, .num_blocks = 6, .block_size = 3, .num_kv_heads = 2, .head_dim = 2};
  KvStorage kv(layout);
  const int width = 4;
  // Two chunks: sequence A positions 2..5 (4 rows), sequence B position 0 (1 row).
  const std::vector<BlockId> table_a = {BlockId(5), BlockId(1)};
  const std::vector<BlockId> table_b = {BlockId(3)};
  const std::vector<ChunkDesc> chunks = {{.row_begin = 0, .num_rows = 4, .start_pos = 2, .block_table = table_a},
                                         {.row_begin = 4, .num_rows = 1, .start_pos = 0, .block_table = table_b}};
  std::vector<float> k(5 * width), v(5 * width);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<float>(i + 1);
    v[i] = -static_cast<float>(i + 1);
  }
  backend.writeKv(1, k.data(), v.data(), chunks, kv);
  struct Where {
    int row;
    BlockId block;
    int slot;
  };
  // A: pos 2 -> block 5 slot 2; pos 3,4,5 -> block 1 slots 0,1,2. B: pos 0 -> block 3 slot 0.
  for (Where w : {Where{0, BlockId(5), 2}, Where{1, BlockId(1), 0}, Where{2, BlockId(1), 1}, Where{3, BlockId(1), 2},
                  Where{4, BlockId(3), 0}}) {
    EXPECT_EQ(std::memcmp(kv.key(1, w.block, w.slot), k.data() + w.row * width, width * sizeof(float)), 0) << w.row;
    EXPECT_EQ(std::memcmp(kv.value(1, w.block, w.slot), v.data() + w.row * width, width * sizeof(float)), 0) << w.row;
  }
  // Layer 0 untouched.
  for (int b = 0; b < layout.num_blocks; ++b) {
    for (int s = 0; s < layout.block_size; ++s) EXPECT_EQ(kv.key(0, BlockId(b), s)[0], 0.0f);
  }
}

}  // namespace
}  // namespace tandem::engine
