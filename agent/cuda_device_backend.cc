// --device cuda in the CUDA build: the kernel backend on a CUDA device.

#include "agent/cuda_device_backend.h"

#include "engine/backend/cuda/cuda_device.h"
#include "engine/backend/cuda/nccl_group.h"
#include "src/common/strings.h"

namespace tandem::agent {

absl::StatusOr<std::unique_ptr<engine::Backend>> makeCudaDeviceBackend(int ordinal, engine::GemmDtype dtype) {
  absl::StatusOr<std::unique_ptr<engine::KernelBackend>> backend =
      engine::makeCudaBackend(ordinal, std::nullopt, dtype);
  if (!backend.ok()) {
    return absl::FailedPreconditionError(strCat("--device cuda: ", backend.status().message()));
  }
  return std::unique_ptr<engine::Backend>(std::move(*backend));
}

absl::StatusOr<DeviceAllReduce> joinCudaGroup(engine::Backend& backend, const engine::RendezvousOptions& options) {
  auto* kernels = dynamic_cast<engine::KernelBackend*>(&backend);
  if (kernels == nullptr) return absl::InvalidArgumentError("NCCL needs the CUDA backend (--device cuda)");
  absl::StatusOr<std::unique_ptr<engine::NcclGroup>> group = engine::NcclGroup::join(options, kernels->sharedDevice());
  if (!group.ok()) {
    return absl::FailedPreconditionError(strCat("tensor-parallel rank ", options.rank, ": ", group.status().message()));
  }
  std::shared_ptr<engine::NcclGroup> g = std::move(*group);
  return DeviceAllReduce{.all_reduce = g->partials(), .status = [g] { return g->status(); }, .keep_alive = g};
}

bool hasCudaDeviceBackend() { return true; }

int visibleCudaDevices() { return gpu::cudaDeviceCount(); }

}  // namespace tandem::agent
