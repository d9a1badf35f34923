#include "engine/backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "engine/backend/host_buffer.h"
#include "engine/backend/kernel_math.h"
#include "engine/backend/scoped_timer.h"

namespace tandem::engine {
namespace {

// Dot product with a fixed association (8 partial sums, lane l taking the
// elements i = l mod 8 in order, combined pairwise), so every caller gets
// the same bits for the same inputs. The sums are an 8-lane vector (GCC's
// vector extension: one ymm register, or two xmm ones on the baseline ISA),
// spelled out because GCC vectorised the equivalent scalar loop for
// AVX-512 with shuffles that made it 2x slower than for the baseline ISA.
[[gnu::always_inline]] inline float dot(const float* a, const float* b, int32_t n) {
  using Lanes8 = float __attribute__((vector_size(32)));
  Lanes8 acc = {0, 0, 0, 0, 0, 0, 0, 0};
  int32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    Lanes8 x, y;
    std::memcpy(&x, a + i, sizeof(x));
    std::memcpy(&y, b + i, sizeof(y));
    acc += x * y;  // no contraction: this file is compiled with -ffp-contract=off
  }
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

template <typename T>
void growTo(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

// ---- SwiGLU ----------------------------------------------------------------
// kmath::swiglu's formula, gate / (1 + e^-gate) * up, with e^x from
// kmath::expIeee (IEEE operations only), so that the vectorised loop, its
// scalar remainder and every SIMD level below give the same bits for the same
// element: a row's result never depends on where it sits in the batch; and
// the portable CUDA kernels' SwiGLU gives the same bits too. (glibc's scalar
// expf was most of the MLP's non-GEMM time, and its vector variants round
// differently from it. Results differ from kmath::swiglu in the last bits.)

[[gnu::always_inline]] inline void swigluLoop(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + kmath::expIeee(-g)) * up[i];
  }
}

// ---- RMSNorm and RoPE rows --------------------------------------------------
// The row loops, written once and compiled per SIMD level like swiglu. Each
// is the plain per-element arithmetic (this file is compiled with
// -ffp-contract=off, so no level fuses a multiply and an add), so every level
// gives the same bits; the levels differ in vector width only. (Compiled for
// the baseline ISA alone they ran 2-4 floats per instruction.)

[[gnu::always_inline]] inline void rmsNormLoop(const float* x, const float* weight, float* out, int32_t r0, int32_t r1,
                                               int32_t dim, float eps) {
  for (int32_t r = r0; r < r1; ++r) {
    const float* xr = x + static_cast<size_t>(r) * static_cast<size_t>(dim);
    float* outr = out + static_cast<size_t>(r) * static_cast<size_t>(dim);
    const float mean_sq = dot(xr, xr, dim) / static_cast<float>(dim);
    const float inv = 1.0f / std::sqrt(mean_sq + eps);
    // HF order: (x * rsqrt(var + eps)) * weight.
    for (int32_t i = 0; i < dim; ++i) outr[i] = (xr[i] * inv) * weight[i];
  }
}

// Rows [r0, r1) of x [rows][num_heads * head_dim], row r at positions[r],
// cos/sin from the table ([position][head_dim / 2], kmath::ropeCosSin's bits);
// kmath::ropeRotateHead's arithmetic.
[[gnu::always_inline]] inline void ropeLoop(float* x, int32_t r0, int32_t r1, int32_t num_heads, int32_t head_dim,
                                            const int32_t* positions, const float* cos_table, const float* sin_table) {
  const int32_t half = head_dim / 2;
  const size_t row_width = static_cast<size_t>(num_heads) * static_cast<size_t>(head_dim);
  for (int32_t r = r0; r < r1; ++r) {
    const float* cos_t = cos_table + static_cast<size_t>(positions[r]) * static_cast<size_t>(half);
    const float* sin_t = sin_table + static_cast<size_t>(positions[r]) * static_cast<size_t>(half);
    float* xr = x + static_cast<size_t>(r) * row_width;
    for (int32_t h = 0; h < num_heads; ++h) {
      float* xh = xr + static_cast<size_t>(h) * static_cast<size_t>(head_dim);
      for (int32_t i = 0; i < half; ++i) {
        const float a = xh[i];
        const float b = xh[i + half];
        xh[i] = a * cos_t[i] - b * sin_t[i];
        xh[i + half] = b * cos_t[i] + a * sin_t[i];
      }
    }
  }
}

// Each loop compiled for each level; fma is one instruction there.
#define TANDEM_ELEMENTWISE_LEVEL(name, ...)                                                                            \
  __VA_ARGS__ void swiglu##name(const float* gate, const float* up, float* out, int64_t n) {                           \
    swigluLoop(gate, up, out, n);                                                                                      \
  }                                                                                                                    \
  __VA_ARGS__ void rmsNorm##name(const float* x, const float* weight, float* out, int32_t r0, int32_t r1, int32_t dim, \
                                 float eps) {                                                                          \
    rmsNormLoop(x, weight, out, r0, r1, dim, eps);                                                                     \
  }                                                                                                                    \
  __VA_ARGS__ void rope##name(float* x, int32_t r0, int32_t r1, int32_t num_heads, int32_t head_dim,                   \
                              const int32_t* positions, const float* cos_table, const float* sin_table) {              \
    ropeLoop(x, r0, r1, num_heads, head_dim, positions, cos_table, sin_table);                                         \
  }
TANDEM_ELEMENTWISE_LEVEL(Avx512, [[gnu::target("avx512f,avx2,fma")]])
TANDEM_ELEMENTWISE_LEVEL(Avx2, [[gnu::target("avx2,fma")]])
TANDEM_ELEMENTWISE_LEVEL(Portable)
#undef TANDEM_ELEMENTWISE_LEVEL

}  // namespace

struct CpuBackend::ElementwiseKernels {
  void (*swiglu)(const float* gate, const float* up, float* out, int64_t n);
  void (*rms_norm)(const float* x, const float* weight, float* out, int32_t r0, int32_t r1, int32_t dim, float eps);
  void (*rope)(float* x, int32_t r0, int32_t r1, int32_t num_heads, int32_t head_dim, const int32_t* positions,
               const float* cos_table, const float* sin_table);
};

namespace {

const CpuBackend::ElementwiseKernels* elementwiseFor(SimdLevel level) {
  static constexpr CpuBackend::ElementwiseKernels kAvx512{&swigluAvx512, &rmsNormAvx512, &ropeAvx512};
  static constexpr CpuBackend::ElementwiseKernels kAvx2{&swigluAvx2, &rmsNormAvx2, &ropeAvx2};
  static constexpr CpuBackend::ElementwiseKernels kPortable{&swigluPortable, &rmsNormPortable, &ropePortable};
  return forSimdLevel(level, &kPortable, &kAvx2, &kAvx512);
}

// SwiGLU calls below this many floats run on the calling thread alone:
// waking the pool's workers costs more than sharing them saves (decode
// steps). A prefill chunk's SwiGLU (512 x 688 for the tiny model, ~0.2 ms,
// bound by reading gate and up from beyond L2) runs ~1.5x faster on two
// cores. RMSNorm and RoPE of a 512-row chunk take ~20 us each, about what a
// parallelFor's hand-off costs, so they stay on the calling thread.
constexpr int64_t kMinParallelFloats = int64_t{1} << 15;

// Calls fn(begin, end) on pieces covering [0, n) units of `floats_per_unit`
// floats each: inline for small n, else spread over the pool. The kernels
// compute each element (row) on its own, so the split does not change a bit.
void forRanges(WorkerPool& pool, int64_t n, int64_t floats_per_unit,
               absl::FunctionRef<void(int64_t begin, int64_t end)> fn) {
  if (pool.numThreads() == 1 || n * floats_per_unit < kMinParallelFloats) {
    if (n > 0) fn(0, n);
    return;
  }
  const int64_t pieces = std::min<int64_t>(n, 4 * static_cast<int64_t>(pool.numThreads()));
  pool.parallelFor(pieces, [&](int64_t i, int /*thread*/) { fn(n * i / pieces, n * (i + 1) / pieces); });
}

int threadsFor(const CpuBackendOptions& options) {
  if (options.num_threads > 0) return options.num_threads;
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace

CpuBackend::CpuBackend(const CpuBackendOptions& options)
    : pool_(threadsFor(options)),
      gemm_(options.simd, &pool_),
      attention_(gemm_.simdLevel(), &pool_),
      elementwise_(elementwiseFor(gemm_.simdLevel())),
      gemm_dtype_(options.gemm_dtype) {}

std::unique_ptr<PreparedWeight> CpuBackend::prepareWeight(const float* w, int32_t n, int32_t k) {
  if (gemm_dtype_ != GemmDtype::kBfloat16) return std::make_unique<PackedMatrix>(w, n, k);
  std::vector<float> rounded(static_cast<size_t>(n) * static_cast<size_t>(k));
  for (size_t i = 0; i < rounded.size(); ++i) rounded[i] = kmath::roundToBf16(w[i]);
  return std::make_unique<PackedMatrix>(rounded.data(), n, k);
}

void CpuBackend::gemm(const float* x, const PreparedWeight& w, float* y, int32_t m, bool accumulate) {
  if (gemm_dtype_ == GemmDtype::kBfloat16) {
    const size_t n = static_cast<size_t>(m) * static_cast<size_t>(w.k());
    if (bf16_input_.size() < n) bf16_input_.resize(n);
    for (size_t i = 0; i < n; ++i) bf16_input_[i] = kmath::roundToBf16(x[i]);
    x = bf16_input_.data();
  }
  run(x, static_cast<const PackedMatrix&>(w), y, m, accumulate);  // only this backend's prepareWeight made w
}

void CpuBackend::gemmSharedInput(const float* x, std::span<const GemmOut> outs, int32_t m) {
  if (gemm_dtype_ != GemmDtype::kBfloat16 || outs.empty()) return Backend::gemmSharedInput(x, outs, m);
  const size_t n = static_cast<size_t>(m) * static_cast<size_t>(outs[0].w->k());
  if (bf16_input_.size() < n) bf16_input_.resize(n);
  for (size_t i = 0; i < n; ++i) bf16_input_[i] = kmath::roundToBf16(x[i]);
  for (const GemmOut& o : outs) {
    assert(o.w->k() == outs[0].w->k());
    run(bf16_input_.data(), static_cast<const PackedMatrix&>(*o.w), o.y, m, /*accumulate=*/false);
  }
}

void CpuBackend::gemmBf16(const uint16_t* x, const PreparedWeight& w, float* y, int32_t m, bool accumulate) {
  assert(gemm_dtype_ == GemmDtype::kBfloat16);
  const size_t n = static_cast<size_t>(m) * static_cast<size_t>(w.k());
  if (bf16_input_.size() < n) bf16_input_.resize(n);
  for (size_t i = 0; i < n; ++i) bf16_input_[i] = kmath::bf16Value(x[i]);  // exact
  run(bf16_input_.data(), static_cast<const PackedMatrix&>(w), y, m, accumulate);
}

void CpuBackend::gemm(const float* x, const float* w, float* y, int32_t m, int32_t n, int32_t k, bool accumulate) {
  run(x, PackedMatrix(w, n, k), y, m, accumulate);  // a plain weight: fp32 in every mode
}

void CpuBackend::run(const float* x, const PackedMatrix& w, float* y, int32_t m, bool accumulate) {
  const ScopedTimer timer(&stats_.gemm_time);
  gemm_.run(x, w, y, m, accumulate);
  stats_.gemm_calls += 1;
  stats_.gemm_flops += 2.0 * m * w.n() * w.k();
}

void CpuBackend::rmsNorm(const float* x, const float* weight, float* out, int32_t rows, int32_t dim, float eps) {
  const ScopedTimer timer(&stats_.elementwise_time);
  elementwise_->rms_norm(x, weight, out, 0, rows, dim, eps);
}

void CpuBackend::rope(float* x, int32_t rows, int32_t num_heads, int32_t head_dim, const int32_t* positions,
                      std::span<const float> inv_freq) {
  const ScopedTimer timer(&stats_.elementwise_time);
  const int32_t half = head_dim / 2;
  assert(inv_freq.size() == static_cast<size_t>(half));
  int32_t max_pos = 0;
  for (int32_t r = 0; r < rows; ++r) max_pos = std::max(max_pos, positions[r]);
  if (max_pos < kRopeTablePositions) {
    rope_table_.grow(max_pos + 1, inv_freq);
    elementwise_->rope(x, 0, rows, num_heads, head_dim, positions, rope_table_.cos(), rope_table_.sin());
    return;
  }
  // Some position is past the table: cos/sin of those rows are computed here.
  rope_table_.grow(kRopeTablePositions, inv_freq);
  growTo(cos_, static_cast<size_t>(half));
  growTo(sin_, static_cast<size_t>(half));
  const size_t row_width = static_cast<size_t>(num_heads) * static_cast<size_t>(head_dim);
  for (int32_t r = 0; r < rows; ++r) {
    const int32_t pos = positions[r];
    if (pos < kRopeTablePositions) {
      elementwise_->rope(x, r, r + 1, num_heads, head_dim, positions, rope_table_.cos(), rope_table_.sin());
      continue;
    }
    for (int32_t i = 0; i < half; ++i) kmath::ropeCosSinFreq(pos, inv_freq[static_cast<size_t>(i)], &cos_[i], &sin_[i]);
    float* xr = x + static_cast<size_t>(r) * row_width;
    for (int32_t h = 0; h < num_heads; ++h) {
      kmath::ropeRotateHead(xr + static_cast<size_t>(h) * static_cast<size_t>(head_dim), cos_.data(), sin_.data(),
                            head_dim);
    }
  }
}

std::unique_ptr<BackendBuffer> CpuBackend::allocate(size_t floats) { return HostBuffer::allocate(floats); }

std::unique_ptr<BackendBuffer> CpuBackend::residentWeight(std::span<const float> host) {
  return HostBuffer::view(host);
}

void CpuBackend::add(float* x, const float* y, int64_t n) {
  const ScopedTimer timer(&stats_.elementwise_time);
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void CpuBackend::addBias(float* y, const float* bias, int32_t rows, int32_t dim) {
  const ScopedTimer timer(&stats_.elementwise_time);
  // One add per element: the same bits at any vector width.
  for (int32_t r = 0; r < rows; ++r) {
    float* yr = y + static_cast<size_t>(r) * static_cast<size_t>(dim);
    for (int32_t i = 0; i < dim; ++i) yr[i] += bias[i];
  }
}

void CpuBackend::swiglu(const float* gate, const float* up, float* out, int64_t n) {
  const ScopedTimer timer(&stats_.elementwise_time);
  // Pieces of whole vectors (the result does not depend on the split).
  constexpr int64_t kUnit = 64;
  forRanges(pool_, (n + kUnit - 1) / kUnit, kUnit, [&](int64_t u0, int64_t u1) {
    const int64_t begin = u0 * kUnit;
    const int64_t end = std::min(n, u1 * kUnit);
    elementwise_->swiglu(gate + begin, up + begin, out + begin, end - begin);
  });
}

void CpuBackend::gatherRows(const float* src, const int32_t* rows, int32_t num_rows, int32_t dim, float* dst) {
  const ScopedTimer timer(&stats_.elementwise_time);
  for (int32_t r = 0; r < num_rows; ++r) {
    std::memcpy(dst + static_cast<size_t>(r) * static_cast<size_t>(dim),
                src + static_cast<size_t>(rows[r]) * static_cast<size_t>(dim),
                static_cast<size_t>(dim) * sizeof(float));
  }
}

namespace {
// The table itself (not copied): a bf16 table's values are the bf16
// roundings of the fp32 ones, made as the rows are read.
class HostEmbedding final : public EmbeddingTable {
 public:
  HostEmbedding(std::span<const float> table, int32_t dim, bool bf16)
      : EmbeddingTable(static_cast<int32_t>(table.size() / static_cast<size_t>(dim)), dim, bf16), fp32_(table) {}
  std::span<const float> fp32_;
};
}  // namespace

std::unique_ptr<EmbeddingTable> CpuBackend::prepareEmbedding(std::span<const float> table, int32_t dim) {
  return std::make_unique<HostEmbedding>(table, dim, gemm_dtype_ == GemmDtype::kBfloat16);
}

void CpuBackend::embed(const EmbeddingTable& table, const int32_t* tokens, int32_t n, float* dst) {
  const auto& t = static_cast<const HostEmbedding&>(table);  // only this backend's prepareEmbedding made it
  if (!t.bf16()) return gatherRows(t.fp32_.data(), tokens, n, t.dim(), dst);
  const ScopedTimer timer(&stats_.elementwise_time);
  const auto dim = static_cast<size_t>(t.dim());
  for (int32_t r = 0; r < n; ++r) {
    const float* src = t.fp32_.data() + static_cast<size_t>(tokens[r]) * dim;
    float* out = dst + static_cast<size_t>(r) * dim;
    for (size_t i = 0; i < dim; ++i) out[i] = kmath::roundToBf16(src[i]);
  }
}

void CpuBackend::writeKv(int32_t layer, const float* k, const float* v, std::span<const ChunkDesc> chunks,
                         KvStorage& kv) {
  const ScopedTimer timer(&stats_.elementwise_time);
  const int32_t block_size = kv.layout().block_size;
  const size_t width = kv.layout().elementsPerToken();  // [num_kv_heads * head_dim]
  const bool bf16 = kv.layout().dtype == KvDtype::kBfloat16;
  // A bf16 pool: rounded to nearest even, as the kernels' writeKv does.
  auto put = [&](std::byte* to, const float* from) {
    if (!bf16) {
      std::memcpy(to, from, width * sizeof(float));
      return;
    }
    for (size_t i = 0; i < width; ++i) {
      const uint16_t h = kmath::bf16Bits(from[i]);
      std::memcpy(to + i * sizeof(h), &h, sizeof(h));
    }
  };
  for (const ChunkDesc& c : chunks) {
    for (int32_t r = 0; r < c.num_rows; ++r) {
      const int32_t pos = c.start_pos + r;
      const BlockId block = c.block_table[static_cast<size_t>(kmath::blockIndexOf(pos, block_size))];
      const int32_t slot = kmath::slotOf(pos, block_size);
      const size_t row = static_cast<size_t>(c.row_begin + r);
      put(kv.keyBytes(layer, block, slot), k + row * width);
      put(kv.valueBytes(layer, block, slot), v + row * width);
    }
  }
}

void CpuBackend::attention(int32_t layer, const float* q, std::span<const ChunkDesc> chunks, const KvStorage& kv,
                           const AttentionShape& shape, float* out) {
  const ScopedTimer timer(&stats_.attention_time);
  attention_.run(layer, q, chunks, kv, shape, out);
}

void CpuBackend::logits(const float* hidden, const PreparedWeight& lm_head, float* logits_host, int32_t m) {
  gemm(hidden, lm_head, logits_host, m, /*accumulate=*/false);
}

std::unique_ptr<Backend> makeCpuBackend() { return std::make_unique<CpuBackend>(); }

}  // namespace tandem::engine
