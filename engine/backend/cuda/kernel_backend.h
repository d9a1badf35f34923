#pragma once
// The CUDA backend's kernels (kernels.h) behind the Backend interface, run on
// the CPU by the executor (cpu_executor.h): every call but the GEMMs launches
// the same kernel source nvcc compiles for the GPU, with the same launch
// shapes. The GEMMs (and logits) go to the CPU backend's GEMM, standing in for
// cuBLAS. So the whole model can run through the GPU kernels here and be
// compared with the CPU backend (tests/engine/backend/cuda), and the agent can
// serve with it (`--device cuda-emulator`: slow, for checking the kernels end
// to end, never for production).
//
// Memory is host memory, as everywhere on this backend, but it holds the
// model to a device backend's contract (backend.h): every float* a call
// takes must lie in memory this backend handed out (allocate,
// residentWeight) or in the KV cache, as device memory would have to; a
// host pointer there (a buffer the model forgot to allocate through the
// backend) is an error naming the call and the argument. The per-call
// metadata (row blocks and slots, positions, block tables, the RoPE table,
// sampling parameters) is built on the host and copied into backend memory
// before the launch, as a device backend uploads it, and the metadata
// pointers a launch takes are checked too, so no kernel here reads host
// memory that a GPU could not.
//
// Errors: Backend's calls return nothing, and a failed launch or a pointer
// outside backend memory here is a bug (a launch shape the subset forbids,
// divergent barriers, host memory passed as device memory), never bad
// input. The first one is kept (status()) and every later call does
// nothing; tests check status() after each forward pass.
//
// Not thread-safe, like every Backend.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <span>
#include <memory>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/rope_table.h"
#include "engine/backend/cuda/cpu_executor.h"
#include "engine/sched/sampler.h"
#include "src/common/status.h"

namespace tandem::engine {

struct KernelBackendRegions;  // kernel_backend.cc

struct KernelBackendOptions {
  gpu::CpuExecutor::Options executor = gpu::CpuExecutor::optionsFromEnvironment();
  CpuBackendOptions gemm;  // the stand-in for cuBLAS
};

class KernelBackend : public Backend {
 public:
  explicit KernelBackend(const KernelBackendOptions& options = {});

  // OK, or the first kernel launch that failed (see the header comment).
  const absl::Status& status() const { return status_; }
  const gpu::CpuExecutor& executor() const { return executor_; }

  std::unique_ptr<BackendBuffer> allocate(size_t floats) override;
  std::unique_ptr<BackendBuffer> residentWeight(std::span<const float> host) override;
  void add(float* x, const float* y, int64_t n) override;
  std::unique_ptr<PreparedWeight> prepareWeight(const float* w, int32_t n, int32_t k) override;
  void gemm(const float* x, const PreparedWeight& w, float* y, int32_t m, bool accumulate) override;
  void gemm(const float* x, const float* w, float* y, int32_t m, int32_t n, int32_t k, bool accumulate) override;
  void rmsNorm(const float* x, const float* weight, float* out, int32_t rows, int32_t dim, float eps) override;
  void rope(float* x, int32_t rows, int32_t num_heads, int32_t head_dim, const int32_t* positions,
            std::span<const float> inv_freq) override;
  void addBias(float* y, const float* bias, int32_t rows, int32_t dim) override;
  void swiglu(const float* gate, const float* up, float* out, int64_t n) override;
  void gatherRows(const float* src, const int32_t* rows, int32_t num_rows, int32_t dim, float* dst) override;
  void writeKv(int32_t layer, const float* k, const float* v, std::span<const ChunkDesc> chunks,
               KvStorage& kv) override;
  void copyKvBlock(KvStorage& kv, BlockId src, BlockId dst) override;
  void attention(int32_t layer, const float* q, std::span<const ChunkDesc> chunks, const KvStorage& kv,
                 const AttentionShape& shape, float* out) override;
  void logits(const float* hidden, const PreparedWeight& lm_head, float* logits_host, int32_t m) override;
  BackendStats stats() const override;
  void resetStats() override;

  // One token per row of logits [rows, vocab] by the sampling kernel
  // (sampling_kernel.h): row r with params[r] and the draw uniforms[r] (its
  // request's SamplerRng::uniform(), ignored when greedy). Rows the kernel
  // leaves to the host are decided by sampleTokenWithDraw; `on_host`, when
  // given, counts them. The same tokens as the CPU sampler's.
  std::vector<TokenId> sample(std::span<const float> logits, int32_t vocab, std::span<const SamplingParams> params,
                              std::span<const double> uniforms, int* on_host = nullptr);

 private:
  // Runs kernel(args) over `config` unless an earlier launch failed.
  template <typename Args>
  void launch(const gpu::LaunchConfig& config, void (*kernel)(Args), const Args& args);

  struct Arg {
    const char* name;
    const void* p;
    size_t floats;
  };
  // True when every argument lies in backend memory; otherwise the first
  // that does not goes into status() and the call does nothing.
  bool inBackendMemory(const char* call, std::initializer_list<Arg> args);
  std::unique_ptr<BackendBuffer> track(std::unique_ptr<BackendBuffer> buffer);

  // Backend memory for one kind of per-call metadata, grown on demand: a
  // device backend's upload buffer (the copy is its cudaMemcpyAsync).
  class Scratch {
   public:
    template <typename T>
    T* upload(KernelBackend& backend, std::span<const T> host) {
      T* d = reserve<T>(backend, host.size());
      if (!host.empty()) std::memcpy(d, host.data(), host.size() * sizeof(T));
      return d;
    }
    template <typename T>
    T* reserve(KernelBackend& backend, size_t n) {
      const size_t floats = std::max<size_t>((n * sizeof(T) + sizeof(float) - 1) / sizeof(float), 1);
      if (!buffer_ || buffer_->floats() < floats) {
        const size_t grown = std::max(floats, 2 * (buffer_ ? buffer_->floats() : 0));
        buffer_.reset();
        buffer_ = backend.allocate(grown);
      }
      return reinterpret_cast<T*>(buffer_->data());
    }

   private:
    std::unique_ptr<BackendBuffer> buffer_;
  };
  Scratch d_row_block_, d_row_slot_, d_row_pos_, d_row_table_, d_row_split_, d_block_tables_, d_partial_;
  Scratch d_positions_, d_rows_, d_rope_cos_, d_rope_sin_;
  Scratch d_logits_, d_temperature_, d_top_k_, d_top_p_, d_uniforms_, d_sample_probs_, d_sampled_;
  size_t rope_uploaded_ = 0;                // floats of the RoPE table in d_rope_cos_ / d_rope_sin_
  std::vector<float> rope_uploaded_freq_;  // its frequencies

  CpuBackend gemm_;
  gpu::CpuExecutor executor_;
  std::shared_ptr<KernelBackendRegions> regions_;  // the memory handed out
  absl::Status status_;
  BackendStats stats_;  // attention and element-wise times; the GEMMs' are gemm_'s
  RopeTable rope_table_;  // the CPU backend's cos/sin bits
  // Per-call metadata, reused.
  std::vector<int32_t> row_block_, row_slot_, row_pos_, row_table_, row_split_, block_tables_;
  std::vector<float> temperature_, top_p_;
  std::vector<int32_t> top_k_, sampled_;
  SamplerScratch sampler_scratch_;
};

}  // namespace tandem::engine
