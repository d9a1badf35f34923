// --device cuda in the CUDA build: the kernel backend on a CUDA device.

#include "agent/cuda_device_backend.h"

#include "engine/backend/cuda/cuda_device.h"
#include "src/common/strings.h"

namespace tandem::agent {

absl::StatusOr<std::unique_ptr<engine::Backend>> makeCudaDeviceBackend() {
  absl::StatusOr<std::unique_ptr<engine::KernelBackend>> backend = engine::makeCudaBackend(0);
  if (!backend.ok()) {
    return absl::FailedPreconditionError(strCat("--device cuda: ", backend.status().message()));
  }
  return std::unique_ptr<engine::Backend>(std::move(*backend));
}

bool hasCudaDeviceBackend() { return true; }

int visibleCudaDevices() { return gpu::cudaDeviceCount(); }

}  // namespace tandem::agent
