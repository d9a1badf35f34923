#pragma once
// The CUDA subset every Tandem kernel is written in, so one source compiles
// with nvcc for the GPU and with the host compiler for the CPU executor
// (cpu_executor.h), which runs a launch grid faithfully on the CPU: every
// thread of a block, barriers and warp exchanges respected. Tests run every
// kernel that way (no GPU is attached to this project's machines), so a
// kernel is seen working, not merely compiling (docs/cuda.md).
//
// The subset, and why:
// - A kernel is `TANDEM_KERNEL name(const Args a)`: one trivially copyable
//   argument struct, passed by value as a CUDA kernel parameter.
// - Indices only through threadX(), blockX()/Y()/Z(), blockDimX(),
//   gridDimX()/Y()/Z(): blocks are one-dimensional, grids up to three.
// - Shared memory is dynamic only (sharedMemory<T>(), sized at launch):
//   a static `__shared__` array has no host meaning.
// - syncThreads() is __syncthreads(), syncWarp() __syncwarp(); warp
//   exchanges are shflXor / shflIdx over the full warp (32 lanes); block
//   sizes are multiples of 32, so no warp is partial. No atomics: every reduction has one fixed order, which
//   is what makes a kernel's result independent of scheduling (determinism,
//   docs/engine.md) and lets the executor compare bits.
// - Vector loads only through load4() (16 bytes, aligned) and load4Bf16()
//   (8 bytes, aligned).
// - Arithmetic as written: nvcc builds these with -fmad=false and the host
//   with -ffp-contract=off; a fused multiply-add is spelled fmaf(). Division
//   and sqrt are IEEE on both (nvcc's defaults -prec-div/-prec-sqrt=true).
//   exp is kmath::expIeee (IEEE operations only), never the library's, so
//   the executor's bits are the GPU's bits.
// - Kernels own no resources (no allocation, no destructors that matter):
//   the executor may abandon a block whose barriers diverged.

#include <cstddef>
#include <cstdint>

#include "engine/backend/kernel_math.h"

namespace tandem::gpu {

constexpr int kWarpSize = 32;

// A launch's shape (CUDA's dim3, spelled out so host code needs no CUDA header).
struct Dim3 {
  uint32_t x = 1, y = 1, z = 1;
  bool operator==(const Dim3&) const = default;  // a graph replay compares its launches
};

// Four floats read in one 16-byte load (float4 on the GPU).
struct alignas(16) Float4 {
  float x, y, z, w;
};

struct LaunchConfig {
  Dim3 grid;
  Dim3 block;               // block.y == block.z == 1; block.x a multiple of 32
  size_t shared_bytes = 0;  // dynamic shared memory per block
  bool operator==(const LaunchConfig&) const = default;  // a graph replay compares its launches
};

}  // namespace tandem::gpu

#if defined(__CUDACC__)

#define TANDEM_KERNEL __global__ void
#define TANDEM_DEVICE __device__ __forceinline__

namespace tandem::gpu {
TANDEM_DEVICE int threadX() { return static_cast<int>(threadIdx.x); }
TANDEM_DEVICE int blockX() { return static_cast<int>(blockIdx.x); }
TANDEM_DEVICE int blockY() { return static_cast<int>(blockIdx.y); }
TANDEM_DEVICE int blockZ() { return static_cast<int>(blockIdx.z); }
TANDEM_DEVICE int blockDimX() { return static_cast<int>(blockDim.x); }
TANDEM_DEVICE int gridDimX() { return static_cast<int>(gridDim.x); }
TANDEM_DEVICE int gridDimY() { return static_cast<int>(gridDim.y); }
TANDEM_DEVICE int gridDimZ() { return static_cast<int>(gridDim.z); }
TANDEM_DEVICE void syncThreads() { __syncthreads(); }
TANDEM_DEVICE void syncWarp() { __syncwarp(); }
template <typename T>
TANDEM_DEVICE T* sharedMemory() {
  extern __shared__ __align__(16) unsigned char tandem_shared[];
  return reinterpret_cast<T*>(tandem_shared);
}
template <typename T>
TANDEM_DEVICE T shflXor(T v, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
}
// p must be 16-byte aligned (a misaligned one faults on the GPU).
TANDEM_DEVICE Float4 load4(const float* p) {
  const float4 v = *reinterpret_cast<const float4*>(p);
  return {v.x, v.y, v.z, v.w};
}
// Four bf16 values in one 8-byte load, widened to fp32; p 8-byte aligned.
TANDEM_DEVICE Float4 load4Bf16(const uint16_t* p) {
  const uint2 v = *reinterpret_cast<const uint2*>(p);
  return {__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u), __uint_as_float(v.y << 16),
          __uint_as_float(v.y & 0xffff0000u)};
}
template <typename T>
TANDEM_DEVICE T shflIdx(T v, int src_lane) {
  return __shfl_sync(0xffffffffu, v, src_lane);
}
}  // namespace tandem::gpu

#else  // the host: the CPU executor's thread context

#include <cstring>
#include <type_traits>

// static: a program of the CUDA build links nvcc's host stubs of the same
// kernels (cuda_kernels.cu), which have these kernels' names; with external
// linkage the linker kept one definition for both, and the CPU executor
// called a stub (no computation, "__global__ function call is not
// configured" at the next launch). Found by the first run on a GPU.
#define TANDEM_KERNEL static inline void  // in headers included by several files
#define TANDEM_DEVICE inline

namespace tandem::gpu {
namespace executor {

// What the running (emulated) GPU thread sees; set by the executor before it
// switches to the thread's fiber.
struct ThreadContext {
  int thread_x = 0;
  int block_x = 0, block_y = 0, block_z = 0;
  int block_dim_x = 0;
  int grid_dim_x = 0, grid_dim_y = 0, grid_dim_z = 0;
  unsigned char* shared = nullptr;
};

// The context of the fiber running on this OS thread (nullptr outside a launch).
const ThreadContext& current();
// Blocks until every live thread of the block has arrived.
void blockBarrier();
// Publishes `bits` as this lane's value, waits for the whole warp, returns
// the value lane `src_lane` published.
uint64_t warpExchange(uint64_t bits, int src_lane);
// A vector load of `bytes` from an address not aligned to them: says
// where, and aborts.
[[noreturn]] void misalignedLoad(const void* p, int bytes);

}  // namespace executor

inline int threadX() { return executor::current().thread_x; }
inline int blockX() { return executor::current().block_x; }
inline int blockY() { return executor::current().block_y; }
inline int blockZ() { return executor::current().block_z; }
inline int blockDimX() { return executor::current().block_dim_x; }
inline int gridDimX() { return executor::current().grid_dim_x; }
inline int gridDimY() { return executor::current().grid_dim_y; }
inline int gridDimZ() { return executor::current().grid_dim_z; }
inline void syncThreads() { executor::blockBarrier(); }
// The warp's lanes wait for each other (an exchange whose value is unused).
inline void syncWarp() { executor::warpExchange(0, executor::current().thread_x % kWarpSize); }
template <typename T>
T* sharedMemory() {
  return reinterpret_cast<T*>(executor::current().shared);
}
template <typename T>
T shflIdx(T v, int src_lane) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= sizeof(uint64_t));
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = executor::warpExchange(bits, src_lane);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}
template <typename T>
T shflXor(T v, int lane_mask) {
  return shflIdx(v, (threadX() % kWarpSize) ^ lane_mask);
}
// p must be 16-byte aligned: the GPU faults on a misaligned one, so the
// executor stops the program too.
inline Float4 load4(const float* p) {
  if (reinterpret_cast<uintptr_t>(p) % alignof(Float4) != 0) executor::misalignedLoad(p, 16);
  Float4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
// Four bf16 values in one 8-byte load, widened to fp32 (exactly); p must be
// 8-byte aligned, as on the GPU.
inline Float4 load4Bf16(const uint16_t* p) {
  if (reinterpret_cast<uintptr_t>(p) % 8 != 0) executor::misalignedLoad(p, 8);
  uint16_t h[4];
  std::memcpy(h, p, sizeof(h));
  using engine::kmath::bf16Value;
  return {bf16Value(h[0]), bf16Value(h[1]), bf16Value(h[2]), bf16Value(h[3])};
}

}  // namespace tandem::gpu

#endif

namespace tandem::gpu {

TANDEM_DEVICE int laneId() { return threadX() % kWarpSize; }
TANDEM_DEVICE int warpId() { return threadX() / kWarpSize; }

// The sum of v over the warp in a fixed butterfly (xor 16, 8, 4, 2, 1):
// every lane gets the same bits, whatever order the lanes ran in.
TANDEM_DEVICE float warpSum(float v) {
  for (int mask = kWarpSize / 2; mask > 0; mask /= 2) v += shflXor(v, mask);
  return v;
}
TANDEM_DEVICE float warpMax(float v) {
  for (int mask = kWarpSize / 2; mask > 0; mask /= 2) v = fmaxf(v, shflXor(v, mask));
  return v;
}

}  // namespace tandem::gpu
