// The portable kernels (kernels.h) compiled for the GPU; see cuda_kernels.h.
// Built with -fmad=false (engine/backend/cuda/CMakeLists.txt): the kernels
// promise the CPU executor's bits, so nvcc may not contract a * b + c into
// an FMA that the source does not spell as fmaf().

#include "engine/backend/cuda/cuda_kernels.h"

#include <cuda_runtime.h>

namespace tandem::gpu {
namespace {

dim3 toDim3(const Dim3& d) { return dim3(d.x, d.y, d.z); }

// Launches kernel<<<grid, block, shared, stream>>>(args) and returns the
// launch's error (a bad shape, too much shared memory, no device).
template <typename Args>
int launchKernel(void (*kernel)(Args), const LaunchConfig& config, const Args& args, void* stream) {
  kernel<<<toDim3(config.grid), toDim3(config.block), config.shared_bytes, static_cast<cudaStream_t>(stream)>>>(
      args);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int launchRmsNorm(const LaunchConfig& config, const RmsNormArgs& args, void* stream) {
  return launchKernel(&rmsNormKernel, config, args, stream);
}
int launchRope(const LaunchConfig& config, const RopeArgs& args, void* stream) {
  return launchKernel(&ropeKernel, config, args, stream);
}
int launchSwiglu(const LaunchConfig& config, const SwigluArgs& args, void* stream) {
  return launchKernel(&swigluKernel, config, args, stream);
}
int launchToBf16(const LaunchConfig& config, const ToBf16Args& args, void* stream) {
  return launchKernel(&toBf16Kernel, config, args, stream);
}
int launchAdd(const LaunchConfig& config, const AddArgs& args, void* stream) {
  return launchKernel(&addKernel, config, args, stream);
}
int launchAddBias(const LaunchConfig& config, const AddBiasArgs& args, void* stream) {
  return launchKernel(&addBiasKernel, config, args, stream);
}
int launchGatherRows(const LaunchConfig& config, const GatherRowsArgs& args, void* stream) {
  return launchKernel(&gatherRowsKernel, config, args, stream);
}
int launchWriteKv(const LaunchConfig& config, const WriteKvArgs& args, void* stream) {
  return launchKernel(&writeKvKernel, config, args, stream);
}
int launchCopyKvBlock(const LaunchConfig& config, const CopyKvBlockArgs& args, void* stream) {
  return launchKernel(&copyKvBlockKernel, config, args, stream);
}
int launchKvChecksum(const LaunchConfig& config, const KvChecksumArgs& args, void* stream) {
  return launchKernel(&kvChecksumKernel, config, args, stream);
}
int launchAttentionSplit(const LaunchConfig& config, const AttentionArgs& args, void* stream) {
  return launchKernel(&attentionSplitKernel, config, args, stream);
}
int launchAttentionCombine(const LaunchConfig& config, const AttentionArgs& args, void* stream) {
  return launchKernel(&attentionCombineKernel, config, args, stream);
}
int launchSample(const LaunchConfig& config, const SampleArgs& args, void* stream) {
  return launchKernel(&sampleKernel, config, args, stream);
}

const char* cudaErrorText(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

int kernelsRunnableHere() {
  cudaFuncAttributes attributes{};
  const cudaError_t e = cudaFuncGetAttributes(&attributes, &rmsNormKernel);
  if (e != cudaSuccess) cudaGetLastError();  // not left for the next launch to report
  return static_cast<int>(e);
}

}  // namespace tandem::gpu
