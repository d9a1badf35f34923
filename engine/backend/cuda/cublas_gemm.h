#pragma once
// The CUDA backend's GEMM, y[m, n] = x[m, k] · w[n, k]ᵀ (+ y when
// accumulating), fp32 (CUBLAS_COMPUTE_32F: no TF32; x and w fp32, or bf16
// with CublasGemmOptions::bf16_inputs), row-major, device
// pointers, through cuBLASLt with a *pinned* algorithm: for each weight shape
// (n, k) one algorithm is chosen once (cuBLASLt's heuristic for a reference
// batch), with split-K forced off and no reduction scheme, in a fixed
// workspace, and then used for every batch size m. So each output element is
// the same sequence of operations however many rows share the call: the
// engine's batch invariance (docs/engine.md) on the GPU, where cuBLAS's
// default per-shape choice would change a row's bits with the batch.
//
// tandem-gpu-kernel-check runs it against the CPU GEMM and checks the batch
// invariance (passed on an H200: docs/cuda-build.md). The matrix layouts of
// each (m, n, k) are made and checked against the algorithm once, then
// reused. Not thread-safe: one engine thread owns it.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

namespace tandem::gpu {

struct CublasGemmOptions {
  // K split into this many parts, reduced in a separate pass in fp32
  // (CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE), pinned per weight shape like
  // the rest of the algorithm. 1 (the default, what the engine uses): no
  // split. More gives a small batch's few output tiles more SMs; whether it
  // keeps each row's bits independent of the batch is what
  // `tandem-gpu-kernel-check --gemm-split-k N` measures on a GPU.
  uint32_t split_k = 1;
  // x and w in bf16 (CUDA_R_16BF: the tensor cores' input) instead of fp32;
  // products and accumulation still fp32 (CUBLAS_COMPUTE_32F) into an fp32
  // y (GemmDtype::kBfloat16, engine/backend/backend.h).
  bool bf16_inputs = false;
};

class CublasGemm {
 public:
  // nullptr and *error set (naming the CUDA or cuBLAS call) when cuBLASLt
  // or the workspace cannot be set up (no device, no memory).
  static std::unique_ptr<CublasGemm> create(std::string* error, const CublasGemmOptions& options = {});
  ~CublasGemm();
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  // y = x · wᵀ (+ y): x [m, k], w [n, k], y [m, n], row-major, device memory,
  // on `stream` (a cudaStream_t; nullptr: the default stream); x and w fp32,
  // or bf16 with options.bf16_inputs. Returns "" or what failed: no
  // algorithm for (n, k) without split-K, or one that does not take this m.
  std::string run(const void* x, const void* w, float* y, int32_t m, int32_t n, int32_t k, bool accumulate,
                  void* stream);

  // Reference batch the algorithm of each shape is chosen for.
  static constexpr int32_t kReferenceRows = 256;
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;
  // Call shapes (m, n, k) whose layouts are kept.
  static constexpr size_t kMaxCachedShapes = 4096;

 private:
  struct Impl;
  explicit CublasGemm(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::gpu
