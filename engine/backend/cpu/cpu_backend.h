#pragma once
// The reference backend: our own batch-invariant GEMM (gemm.h), vectorised
// paged attention (paged_attention.h), RMSNorm, RoPE and SwiGLU, plain loops
// for everything else. What the tests and the CPU engine run. No BLAS
// library: every reduction order is the project's own and the same on every
// x86-64 CPU (docs/engine.md, "Determinism").
//
// Threads: GEMMs and attention run on a WorkerPool owned here
// (CpuBackendOptions::num_threads; the results do not depend on it), and so
// does SwiGLU when a call is large enough (a prefill chunk; decode steps stay
// on the calling thread). Everything else runs on the calling thread.
// Not thread-safe: one engine thread owns it (it keeps scratch buffers).

#include <memory>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/rope_table.h"
#include "engine/backend/cpu/gemm.h"
#include "engine/backend/cpu/paged_attention.h"
#include "engine/backend/cpu/worker_pool.h"

namespace tandem::engine {

struct CpuBackendOptions {
  // Threads GEMMs and attention run on, the calling thread included; 0: one
  // per hardware thread. Outputs are bitwise the same for every value.
  int num_threads = 0;
  // Vector code every kernel runs (simd.h; kAuto honours TANDEM_CPU_SIMD);
  // every level gives the same bits.
  SimdLevel simd = SimdLevel::kAuto;
  // What GEMMs with prepared weights read (backend.h): with kBfloat16 the
  // prepared weights and each such GEMM's input are rounded to bf16 (kept
  // in fp32), the CUDA backend's bf16 products to the summation order.
  GemmDtype gemm_dtype = GemmDtype::kFloat32;
};

class CpuBackend final : public Backend {
 public:
  CpuBackend() : CpuBackend(CpuBackendOptions{}) {}
  explicit CpuBackend(const CpuBackendOptions& options);

  std::unique_ptr<BackendBuffer> allocate(size_t floats) override;
  std::unique_ptr<BackendBuffer> residentWeight(std::span<const float> host) override;
  void add(float* x, const float* y, int64_t n) override;
  std::unique_ptr<PreparedWeight> prepareWeight(const float* w, int32_t n, int32_t k) override;
  void gemm(const float* x, const PreparedWeight& w, float* y, int32_t m, bool accumulate) override;
  // In bf16 mode the input is rounded once for every weight.
  void gemmSharedInput(const float* x, std::span<const GemmOut> outs, int32_t m) override;
  void gemm(const float* x, const float* w, float* y, int32_t m, int32_t n, int32_t k, bool accumulate) override;
  GemmDtype gemmDtype() const { return gemm_dtype_; }
  // y = x · wᵀ (+ y) with x already in bf16 (kmath::bf16Bits) and w prepared
  // in kBfloat16: the bf16 GEMM of gemm() above without its rounding pass
  // (the kernel backend's executor GEMM, whose input the device rounded).
  void gemmBf16(const uint16_t* x, const PreparedWeight& w, float* y, int32_t m, bool accumulate);
  void rmsNorm(const float* x, const float* weight, float* out, int32_t rows, int32_t dim, float eps) override;
  void rope(float* x, int32_t rows, int32_t num_heads, int32_t head_dim, const int32_t* positions,
            std::span<const float> inv_freq) override;
  void addBias(float* y, const float* bias, int32_t rows, int32_t dim) override;
  void swiglu(const float* gate, const float* up, float* out, int64_t n) override;
  void gatherRows(const float* src, const int32_t* rows, int32_t num_rows, int32_t dim, float* dst) override;
  std::unique_ptr<EmbeddingTable> prepareEmbedding(std::span<const float> table, int32_t dim) override;
  void embed(const EmbeddingTable& table, const int32_t* tokens, int32_t n, float* dst) override;
  void writeKv(int32_t layer, const float* k, const float* v, std::span<const ChunkDesc> chunks,
               KvStorage& kv) override;
  void copyKvBlock(KvStorage& kv, BlockId src, BlockId dst) override { kv.copyBlock(src, dst); }
  void attention(int32_t layer, const float* q, std::span<const ChunkDesc> chunks, const KvStorage& kv,
                 const AttentionShape& shape, float* out) override;
  void logits(const float* hidden, const PreparedWeight& lm_head, float* logits_host, int32_t m) override;

  BackendStats stats() const override { return stats_; }
  // The SIMD level every kernel runs (resolveSimdLevel of the options').
  SimdLevel simdLevel() const { return gemm_.simdLevel(); }
  void resetStats() override { stats_ = BackendStats{}; }

  struct ElementwiseKernels;  // swiglu, rmsNorm and rope rows of one SIMD level (cpu_backend.cc)

 private:
  void run(const float* x, const PackedMatrix& w, float* y, int32_t m, bool accumulate);

  BackendStats stats_;
  WorkerPool pool_;
  Gemm gemm_;                              // runs on pool_
  PagedAttention attention_;               // runs on pool_, at gemm_'s level
  const ElementwiseKernels* elementwise_;  // of gemm_'s SIMD level
  // Scratch, grown on demand and reused (no allocation once warmed up).
  std::vector<float> cos_;  // [head_dim / 2] RoPE of one row past the table
  std::vector<float> sin_;  // [head_dim / 2]
  // RoPE cos/sin of positions [0, kRopeTablePositions) at most; rows past
  // it compute theirs (cos_, sin_).
  static constexpr int32_t kRopeTablePositions = 1 << 15;
  RopeTable rope_table_;
  GemmDtype gemm_dtype_;
  std::vector<float> bf16_input_;  // a GEMM's input rounded to bf16, as fp32 (kBfloat16)
};

std::unique_ptr<Backend> makeCpuBackend();

}  // namespace tandem::engine
