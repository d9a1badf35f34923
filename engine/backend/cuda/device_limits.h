#pragma once
// Launch limits of the GPUs docs/cuda.md names, from the CUDA C++
// Programming Guide's table of technical specifications per compute
// capability (H100 and H200 are both compute capability 9.0). Tests hold every
// kernel's launch shape to them (tests/engine/backend/cuda/kernels_test.cc),
// since no GPU here can refuse a launch.

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tandem::gpu {

struct DeviceLimits {
  std::string_view name;
  int compute_capability = 0;  // major * 10 + minor
  int max_threads_per_block = 0;
  uint32_t max_grid_x = 0, max_grid_y = 0, max_grid_z = 0;
  // Dynamic shared memory a launch may ask for without opting in through
  // cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize); our
  // kernels stay within it.
  size_t max_shared_bytes_default = 0;
  size_t max_shared_bytes_opt_in = 0;  // per block, after opting in
  int warp_size = 0;
};

inline constexpr DeviceLimits kH100{"H100", 90, 1024, 0x7fffffffu, 65535, 65535, 48 * 1024, 227 * 1024, 32};
inline constexpr DeviceLimits kH200{"H200", 90, 1024, 0x7fffffffu, 65535, 65535, 48 * 1024, 227 * 1024, 32};
inline constexpr DeviceLimits kSupportedDevices[] = {kH100, kH200};

}  // namespace tandem::gpu
