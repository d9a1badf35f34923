#pragma once
// The engine's backend for --device cuda: the CUDA backend in a build with
// one (TANDEM_ENABLE_CUDA: cuda_device_backend.cc), an error saying there is
// none otherwise (no_cuda_device_backend.cc). docs/cuda.md.

#include <memory>

#include "absl/status/statusor.h"
#include "engine/backend/backend.h"

namespace tandem::agent {

// The CUDA backend on the process's first visible GPU (CUDA_VISIBLE_DEVICES
// picks it), or FailedPrecondition saying why not: no CUDA backend in this
// build, or no usable GPU (what the CUDA runtime said).
absl::StatusOr<std::unique_ptr<engine::Backend>> makeCudaDeviceBackend();

// Whether this build has the CUDA backend.
bool hasCudaDeviceBackend();
// The GPUs this process sees (0 without the CUDA backend): the agent serves
// on the first; more are idle (no tensor parallelism across them yet).
int visibleCudaDevices();

}  // namespace tandem::agent
