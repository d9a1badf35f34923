#pragma once
// The CUDA backend: KernelBackend (kernel_backend.h) on a CUDA device, with
// cuBLASLt GEMMs (cublas_gemm.h, an algorithm pinned per weight shape). Built
// only with TANDEM_ENABLE_CUDA (the tandem_cuda library); this header names
// no CUDA type.
//
// The device runs everything on one stream of its own. Uploads and downloads
// wait for the stream (the backend reuses its host metadata buffers at the
// next call, and a download's result is read at once): correct, and the
// place to add pinned staging buffers and asynchronous copies when a GPU can
// measure what they save.
//
// This project's machines have no GPU: this compiles and links (`./tandem
// check cuda`); `tandem-gpu-kernel-check --model` runs the model through it
// against the CPU backend on the first machine with one (e2e/gpu-smoke.sh).

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "engine/backend/cuda/device.h"
#include "engine/backend/cuda/kernel_backend.h"

namespace tandem::gpu {

// CUDA device `ordinal` on a stream of its own. FailedPrecondition when there
// is no such device (naming what cudaGetDeviceCount said).
absl::StatusOr<std::shared_ptr<Device>> makeCudaDevice(int ordinal);
// The CUDA devices this process sees (CUDA_VISIBLE_DEVICES); 0 when none or
// the runtime fails.
int cudaDeviceCount();

// For other CUDA-side code on such a device (cuBLAS, NCCL): its stream (a
// cudaStream_t; nullptr for a device makeCudaDevice did not make), and
// making it the calling thread's current device.
void* cudaStreamOf(Device& device);
absl::Status cudaMakeCurrent(Device& device);

}  // namespace tandem::gpu

namespace tandem::engine {

// cuBLASLt on `device` (made by makeCudaDevice): weights uploaded once by
// prepareWeight (in bf16 with GemmDtype::kBfloat16, backend.h), GEMMs on
// the device's stream.
absl::StatusOr<std::unique_ptr<KernelGemm>> cublasKernelGemm(std::shared_ptr<gpu::Device> device,
                                                             GemmDtype dtype = GemmDtype::kFloat32);

// The CUDA backend on device `ordinal`; decode steps graphed up to
// `graph_max_rows` rows (unset: TANDEM_CUDA_GRAPHS, kernel_backend.h);
// `dtype`: what its GEMMs read (backend.h).
absl::StatusOr<std::unique_ptr<KernelBackend>> makeCudaBackend(int ordinal,
                                                               std::optional<int32_t> graph_max_rows = std::nullopt,
                                                               GemmDtype dtype = GemmDtype::kFloat32);

}  // namespace tandem::engine
