#pragma once
// Host-callable launches of the portable kernels (kernels.h) on a CUDA
// device, compiled by nvcc in cuda_kernels.cu. This header names no CUDA
// type, so host code built by g++ (the future CUDA backend, the device check
// tools/gpu_kernel_check.cc) includes it without the CUDA headers.
//
// Every launch takes the kernel's own launch shape (kernels.h's *Launch
// helpers), its argument struct with device pointers, and a stream (a
// cudaStream_t, nullptr for the default stream); it returns the cudaError_t
// of the launch as an int (0 is cudaSuccess). The launch is asynchronous:
// errors of the kernel's execution surface at the next synchronization.

#include "engine/backend/cuda/kernels.h"
#include "engine/backend/cuda/sampling_kernel.h"

namespace tandem::gpu {

int launchRmsNorm(const LaunchConfig& config, const RmsNormArgs& args, void* stream);
int launchRope(const LaunchConfig& config, const RopeArgs& args, void* stream);
int launchSwiglu(const LaunchConfig& config, const SwigluArgs& args, void* stream);
int launchToBf16(const LaunchConfig& config, const ToBf16Args& args, void* stream);
int launchAdd(const LaunchConfig& config, const AddArgs& args, void* stream);
int launchAddBias(const LaunchConfig& config, const AddBiasArgs& args, void* stream);
int launchGatherRows(const LaunchConfig& config, const GatherRowsArgs& args, void* stream);
int launchWriteKv(const LaunchConfig& config, const WriteKvArgs& args, void* stream);
int launchCopyKvBlock(const LaunchConfig& config, const CopyKvBlockArgs& args, void* stream);
int launchKvChecksum(const LaunchConfig& config, const KvChecksumArgs& args, void* stream);
int launchAttentionSplit(const LaunchConfig& config, const AttentionArgs& args, void* stream);
int launchAttentionCombine(const LaunchConfig& config, const AttentionArgs& args, void* stream);
int launchSample(const LaunchConfig& config, const SampleArgs& args, void* stream);

// cudaGetErrorString of a code the launches (or any CUDA call) returned.
const char* cudaErrorText(int code);

// 0 when the kernels have code the current device can run, else the CUDA
// error saying why not (no SASS or PTX for its compute capability).
int kernelsRunnableHere();

}  // namespace tandem::gpu
