#pragma once
// The reference backend: OpenBLAS sgemm for the projections, plain loops for
// everything else. What the tests and the CPU engine run.
//
// Single-threaded per call apart from OpenBLAS's own thread pool (sized by
// OPENBLAS_NUM_THREADS; the results do not depend on it, see cpu_backend.cc).
// Not thread-safe: one engine thread owns it (it keeps scratch buffers).

#include <memory>
#include <vector>

#include "engine/backend/backend.h"

namespace tandem::engine {

class CpuBackend final : public Backend {
 public:
  CpuBackend() = default;

  void gemm(const float* x, const float* w, float* y, int32_t m, int32_t n, int32_t k, bool accumulate) override;
  void rmsNorm(const float* x, const float* weight, float* out, int32_t rows, int32_t dim, float eps) override;
  void rope(float* x, int32_t rows, int32_t num_heads, int32_t head_dim, const int32_t* positions,
            float theta) override;
  void swiglu(const float* gate, const float* up, float* out, int64_t n) override;
  void gatherRows(const float* src, const int32_t* rows, int32_t num_rows, int32_t dim, float* dst) override;
  void writeKv(int32_t layer, const float* k, const float* v, std::span<const ChunkDesc> chunks,
               KvStorage& kv) override;
  void attention(int32_t layer, const float* q, std::span<const ChunkDesc> chunks, const KvStorage& kv,
                 const AttentionShape& shape, float* out) override;
  void logits(const float* hidden, const float* lm_head, float* logits_host, int32_t m, int32_t vocab,
              int32_t dim) override;

  BackendStats stats() const override { return stats_; }
  void resetStats() override { stats_ = BackendStats{}; }

 private:
  BackendStats stats_;
  // Scratch, grown on demand and reused (no allocation once warmed up).
  std::vector<float> pad_x_;   // [min_rows, k] gemm input padded with zero rows
  std::vector<float> pad_y_;   // [min_rows, n] gemm output of the padded call
  std::vector<float> scores_;  // [visible keys] attention scores of one (row, head)
  std::vector<float> cos_;     // [head_dim / 2] RoPE of one row
  std::vector<float> sin_;     // [head_dim / 2]
};

std::unique_ptr<Backend> makeCpuBackend();

}  // namespace tandem::engine
