#pragma once
// The engine's backend for --device cuda: the CUDA backend in a build with
// one (TANDEM_ENABLE_CUDA: cuda_device_backend.cc), an error saying there is
// none otherwise (no_cuda_device_backend.cc). docs/cuda.md.

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/backend/backend.h"
#include "engine/model/llama.h"
#include "engine/model/rank_rendezvous.h"

namespace tandem::agent {

// The CUDA backend on visible GPU `ordinal` (0: the first;
// CUDA_VISIBLE_DEVICES picks which are visible; a tensor-parallel rank r
// takes GPU r), or FailedPrecondition saying why not: no CUDA backend in
// this build, or no usable GPU there (what the CUDA runtime said). `dtype`:
// what its GEMMs read (engine/backend/backend.h).
absl::StatusOr<std::unique_ptr<engine::Backend>> makeCudaDeviceBackend(
    int ordinal = 0, engine::GemmDtype dtype = engine::GemmDtype::kFloat32);

// A tensor-parallel rank's NCCL all-reduce (engine/backend/cuda/
// nccl_group.h) on `backend`, which makeCudaDeviceBackend made: the group
// id from rank 0 over `options.socket_path`, then NCCL's communicator.
// `status` is its sticky error; `keep_alive` owns the communicator.
struct DeviceAllReduce {
  engine::AllReducePartials all_reduce;
  std::function<absl::Status()> status;
  std::shared_ptr<void> keep_alive;
};
absl::StatusOr<DeviceAllReduce> joinCudaGroup(engine::Backend& backend, const engine::RendezvousOptions& options);

// Whether this build has the CUDA backend.
bool hasCudaDeviceBackend();
// The GPUs this process sees (0 without the CUDA backend): the agent serves
// on the first --tensor-parallel of them; more are idle.
int visibleCudaDevices();

}  // namespace tandem::agent
