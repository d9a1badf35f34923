// --device cuda in a build without the CUDA backend (TANDEM_ENABLE_CUDA off).

#include "agent/cuda_device_backend.h"

namespace tandem::agent {

absl::StatusOr<std::unique_ptr<engine::Backend>> makeCudaDeviceBackend(int /*ordinal*/, engine::GemmDtype /*dtype*/) {
  return absl::FailedPreconditionError(
      "--device cuda: this tandem-agent has no CUDA backend (an agent built with TANDEM_ENABLE_CUDA=ON has one: the "
      "CUDA image's; docs/cuda.md); use --device cpu, or --device cuda-emulator to serve through the GPU kernels on "
      "the CPU");
}

absl::StatusOr<DeviceAllReduce> joinCudaGroup(engine::Backend& /*backend*/,
                                              const engine::RendezvousOptions& /*options*/) {
  return absl::FailedPreconditionError("NCCL: this tandem-agent has no CUDA backend");
}

bool hasCudaDeviceBackend() { return false; }

int visibleCudaDevices() { return 0; }

}  // namespace tandem::agent
