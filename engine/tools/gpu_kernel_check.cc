// tandem-gpu-kernel-check: runs every portable kernel (engine/backend/cuda/
// kernels.h) on the GPU through cuda_kernels.h's launches and on the CPU
// executor (the reference every test uses), on the same inputs, and compares:
// bitwise for rmsNorm, rope, swiglu, add, addBias, gatherRows and writeKv (their
// contract), within 1e-5 relative (|gpu - cpu| / max(1, |cpu|)) for
// attention (split + combine). Then times each kernel with CUDA events.
//
//   tandem-gpu-kernel-check [--no-timing] [--gemm-split-k N ...] [--model | --tp RANK WORLD SOCKET]
//
// --no-timing skips the timing (hundreds of launches per kernel) and the
// long-context attention shape, for runs under compute-sanitizer, where
// every launch is slow. --gemm-split-k N
// (N > 1; repeatable) also checks and times the GEMM with split-K N
// (CublasGemmOptions), batch invariance included: an experiment, the
// engine's GEMM does not split K.
// --model also runs the tiny model and a small model of each family through
// the CUDA backend (cuda_device.h) against the CPU backend's logits. --tp
// runs one rank of a tensor-parallel group (start WORLD processes, one per
// rank, with the same SOCKET path): the tiny model's shard on a GPU with
// NCCL's all-reduce (nccl_group.h), against the whole model on the CPU.
//
// Prints one PASS/FAIL line per kernel with the largest difference, and one
// throughput line per kernel. Exit status 0 when all pass, 1 on any FAIL, CUDA error
// or bad usage, 2 when there is no CUDA device. This project's machines have no
// GPU: e2e/gpu-smoke.sh runs it where one is lent (docs/cuda-build.md says
// where it has run).

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/cuda/cpu_executor.h"
#include "engine/backend/cuda/cublas_gemm.h"
#include "engine/backend/cuda/cuda_device.h"
#include "engine/backend/cuda/cuda_kernels.h"
#include "engine/backend/cuda/kernels.h"
#include "engine/backend/cuda/nccl_group.h"
#include "engine/backend/kernel_math.h"
#include "engine/model/llama.h"
#include "engine/model/tensor_parallel.h"
#include "engine/model/weights.h"
#include "src/common/block_hash.h"

namespace {

namespace gpu = tandem::gpu;
namespace kmath = tandem::engine::kmath;

constexpr double kAttentionTolerance = 1e-5;
constexpr int kWarmupLaunches = 3;
constexpr int kTimedLaunches = 50;

// Exits 1 naming the call that failed: a CUDA error here is the machine's or
// the launch's, and no later result would mean anything.
void checkCuda(int code, const char* what) {
  if (code == 0) return;
  std::fprintf(stderr, "CUDA error in %s: %s (%d)\n", what, gpu::cudaErrorText(code), code);
  std::exit(1);
}

// Device memory holding a copy of a host vector; freed on scope exit.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<T>& host) : size_(host.size()) {
    checkCuda(cudaMalloc(reinterpret_cast<void**>(&ptr_), bytes()), "cudaMalloc");
    checkCuda(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice), "cudaMemcpy to device");
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return ptr_; }
  size_t bytes() const { return size_ * sizeof(T); }
  std::vector<T> download() const {
    std::vector<T> host(size_);
    checkCuda(cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy to host");
    return host;
  }

 private:
  size_t size_;
  T* ptr_ = nullptr;
};

std::mt19937 rng(20240601);  // fixed: a failure reproduces

std::vector<float> randomFloats(size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<int32_t> randomInts(size_t n, int32_t lo, int32_t hi) {
  std::uniform_int_distribution<int32_t> dist(lo, hi);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = dist(rng);
  return v;
}

// Runs the kernel on the CPU executor; false (with a FAIL line) if it refused.
template <typename Args>
bool runOnCpu(const char* name, const gpu::LaunchConfig& config, void (*kernel)(Args), const Args& args) {
  gpu::CpuExecutor executor(gpu::CpuExecutor::Options{});
  const absl::Status status = executor.launch(config, kernel, args);
  if (status.ok()) return true;
  std::printf("FAIL %-16s the CPU executor refused the launch: %s\n", name, std::string(status.message()).c_str());
  return false;
}

// Compares the GPU's result with the CPU executor's; prints the verdict line.
bool compare(const char* name, const std::vector<float>& on_gpu, const std::vector<float>& on_cpu, bool bitwise,
             double tolerance = kAttentionTolerance) {
  double max_abs = 0.0, max_rel = 0.0;
  size_t mismatches = 0;
  for (size_t i = 0; i < on_cpu.size(); ++i) {
    const double g = on_gpu[i], c = on_cpu[i];
    // A NaN on one side only is an infinite difference; NaN on both, none.
    const double diff = std::isnan(g) != std::isnan(c) ? INFINITY : (std::isnan(c) ? 0.0 : std::fabs(g - c));
    const double rel = diff / std::max(1.0, std::fabs(c));
    max_abs = std::max(max_abs, diff);
    max_rel = std::max(max_rel, rel);
    const bool differs = bitwise ? std::memcmp(&on_gpu[i], &on_cpu[i], sizeof(float)) != 0 : !(rel <= tolerance);
    if (differs) ++mismatches;
  }
  const bool pass = mismatches == 0;
  const std::string how = bitwise ? "bitwise" : "within " + std::to_string(tolerance) + " relative";
  std::printf("%s %-16s %s: %zu of %zu values differ, max |diff| %.3g, max relative %.3g\n", pass ? "PASS" : "FAIL",
              name, how.c_str(), mismatches, on_cpu.size(), max_abs, max_rel);
  return pass;
}

bool g_timing = true;  // --no-timing clears it

// Seconds per call of `launch`, the mean of kTimedLaunches after
// kWarmupLaunches, timed with CUDA events on the default stream.
double secondsPerLaunch(const char* name, const std::function<int()>& launch) {
  for (int i = 0; i < kWarmupLaunches; ++i) checkCuda(launch(), name);
  cudaEvent_t start, stop;
  checkCuda(cudaEventCreate(&start), "cudaEventCreate");
  checkCuda(cudaEventCreate(&stop), "cudaEventCreate");
  checkCuda(cudaEventRecord(start), "cudaEventRecord");
  for (int i = 0; i < kTimedLaunches; ++i) checkCuda(launch(), name);
  checkCuda(cudaEventRecord(stop), "cudaEventRecord");
  checkCuda(cudaEventSynchronize(stop), name);
  float ms = 0.0f;
  checkCuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / 1e3 / kTimedLaunches;
}

// Times `launch` (one kernel launch, or several; host work between them
// counts); prints GB/s for `bytes` moved per launch and launches/s, and the
// yardstick measured the same way in the same run: a device-to-device copy
// moving the same bytes (half read, half written), so a kernel's rate reads
// as a fraction of the copy's at the same size, launch overhead included.
void timeKernel(const char* name, double bytes, const std::function<int()>& launch) {
  if (!g_timing) return;
  const double seconds = secondsPerLaunch(name, launch);
  const size_t half = static_cast<size_t>(bytes / 2);
  DeviceBuffer<char> from{std::vector<char>(half)}, to{std::vector<char>(half)};
  const double copy_seconds = secondsPerLaunch("yardstick copy", [&] {
    return static_cast<int>(cudaMemcpyAsync(to.get(), from.get(), half, cudaMemcpyDeviceToDevice, nullptr));
  });
  std::printf("     %-16s %.1f GB/s, %.0f launches/s (%.2f us each, %.2f MB moved per launch); "
              "%.3f of a device copy of the same bytes (%.1f GB/s, %.2f us)\n",
              name, bytes / seconds / 1e9, 1.0 / seconds, seconds * 1e6, bytes / 1e6, copy_seconds / seconds,
              bytes / copy_seconds / 1e9, copy_seconds * 1e6);
}

bool checkRmsNorm() {
  const int32_t rows = 64, dim = 4099;  // not a multiple of 8: the tail path too
  const auto x = randomFloats(static_cast<size_t>(rows) * dim, -3.0f, 3.0f);
  const auto weight = randomFloats(dim, 0.5f, 1.5f);
  std::vector<float> cpu_out(x.size());
  const auto config = gpu::rmsNormLaunch(rows);
  if (!runOnCpu("rmsNorm", config, &gpu::rmsNormKernel,
                gpu::RmsNormArgs{x.data(), weight.data(), cpu_out.data(), rows, dim, 1e-5f})) {
    return false;
  }
  DeviceBuffer<float> d_x(x), d_w(weight), d_out(std::vector<float>(x.size()));
  const gpu::RmsNormArgs args{d_x.get(), d_w.get(), d_out.get(), rows, dim, 1e-5f};
  checkCuda(gpu::launchRmsNorm(config, args, nullptr), "rmsNorm");
  checkCuda(cudaDeviceSynchronize(), "rmsNorm");
  const bool pass = compare("rmsNorm", d_out.download(), cpu_out, true);
  timeKernel("rmsNorm", 2.0 * d_x.bytes() + d_w.bytes(), [&] { return gpu::launchRmsNorm(config, args, nullptr); });
  return pass;
}

bool checkRope() {
  const int32_t rows = 64, num_heads = 32, head_dim = 128, half = head_dim / 2, table_positions = 4096;
  auto x = randomFloats(static_cast<size_t>(rows) * num_heads * head_dim, -2.0f, 2.0f);
  const auto positions = randomInts(rows, 0, table_positions - 1);
  std::vector<float> cos_t(static_cast<size_t>(table_positions) * half), sin_t(cos_t.size());
  for (int32_t p = 0; p < table_positions; ++p) {
    for (int32_t i = 0; i < half; ++i) {
      const size_t at = static_cast<size_t>(p) * half + i;
      kmath::ropeCosSinFreq(p, kmath::ropeInvFreq(i, head_dim, 500000.0f), &cos_t[at], &sin_t[at]);
    }
  }
  DeviceBuffer<float> d_x(x), d_cos(cos_t), d_sin(sin_t);
  DeviceBuffer<int32_t> d_pos(positions);
  const auto config = gpu::ropeLaunch(rows);
  if (!runOnCpu("rope", config, &gpu::ropeKernel,
                gpu::RopeArgs{x.data(), positions.data(), cos_t.data(), sin_t.data(), rows, num_heads, head_dim})) {
    return false;
  }
  const gpu::RopeArgs args{d_x.get(), d_pos.get(), d_cos.get(), d_sin.get(), rows, num_heads, head_dim};
  checkCuda(gpu::launchRope(config, args, nullptr), "rope");
  checkCuda(cudaDeviceSynchronize(), "rope");
  const bool pass = compare("rope", d_x.download(), x, true);
  // Rotates in place again each launch: the timing does not need the bits.
  timeKernel("rope", 2.0 * d_x.bytes() + 2.0 * rows * half * sizeof(float),
             [&] { return gpu::launchRope(config, args, nullptr); });
  return pass;
}

bool checkSwiglu() {
  const int64_t n = (int64_t{1} << 18) + 7;  // not a multiple of the block
  const auto gate = randomFloats(static_cast<size_t>(n), -20.0f, 20.0f);
  const auto up = randomFloats(static_cast<size_t>(n), -2.0f, 2.0f);
  std::vector<float> cpu_out(gate.size());
  const auto config = gpu::elementwiseLaunch(n);
  if (!runOnCpu("swiglu", config, &gpu::swigluKernel, gpu::SwigluArgs{gate.data(), up.data(), cpu_out.data(), n})) {
    return false;
  }
  DeviceBuffer<float> d_gate(gate), d_up(up), d_out(std::vector<float>(gate.size()));
  const gpu::SwigluArgs args{d_gate.get(), d_up.get(), d_out.get(), n};
  checkCuda(gpu::launchSwiglu(config, args, nullptr), "swiglu");
  checkCuda(cudaDeviceSynchronize(), "swiglu");
  const bool pass = compare("swiglu", d_out.download(), cpu_out, true);
  timeKernel("swiglu", 3.0 * d_gate.bytes(), [&] { return gpu::launchSwiglu(config, args, nullptr); });
  return pass;
}

// The bf16 rounding of a GEMM's input (--dtype bfloat16): bitwise, over
// values that include ties, NaN, infinities and overflow.
bool checkToBf16() {
  const int64_t n = (int64_t{1} << 18) + 5;
  auto in = randomFloats(static_cast<size_t>(n), -3.0f, 3.0f);
  const float specials[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, NAN, INFINITY, -INFINITY, 3.4e38f, -0.0f, 1e-40f};
  for (size_t i = 0; i < sizeof(specials) / sizeof(specials[0]); ++i) in[i * 1000] = specials[i];
  std::vector<uint16_t> cpu_out(in.size());
  const auto config = gpu::elementwiseLaunch(n);
  if (!runOnCpu("toBf16", config, &gpu::toBf16Kernel, gpu::ToBf16Args{in.data(), cpu_out.data(), n})) return false;
  DeviceBuffer<float> d_in(in);
  DeviceBuffer<uint16_t> d_out(std::vector<uint16_t>(in.size()));
  const gpu::ToBf16Args args{d_in.get(), d_out.get(), n};
  checkCuda(gpu::launchToBf16(config, args, nullptr), "toBf16");
  checkCuda(cudaDeviceSynchronize(), "toBf16");
  const std::vector<uint16_t> got = d_out.download();
  size_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) differ += got[i] != cpu_out[i];
  std::printf("%s %-16s bitwise: %zu of %zu values differ\n", differ == 0 ? "PASS" : "FAIL", "toBf16", differ,
              got.size());
  timeKernel("toBf16", 6.0 * static_cast<double>(n), [&] { return gpu::launchToBf16(config, args, nullptr); });
  return differ == 0;
}

bool checkAdd() {
  const int64_t n = (int64_t{1} << 18) + 7;
  auto x = randomFloats(static_cast<size_t>(n), -2.0f, 2.0f);
  const auto y = randomFloats(static_cast<size_t>(n), -2.0f, 2.0f);
  DeviceBuffer<float> d_x(x), d_y(y);
  const auto config = gpu::elementwiseLaunch(n);
  if (!runOnCpu("add", config, &gpu::addKernel, gpu::AddArgs{x.data(), y.data(), n})) return false;
  const gpu::AddArgs args{d_x.get(), d_y.get(), n};
  checkCuda(gpu::launchAdd(config, args, nullptr), "add");
  checkCuda(cudaDeviceSynchronize(), "add");
  const bool pass = compare("add", d_x.download(), x, true);
  // Adds again each launch: the timing does not need the bits.
  timeKernel("add", 3.0 * d_x.bytes(), [&] { return gpu::launchAdd(config, args, nullptr); });
  return pass;
}

bool checkAddBias() {
  const int32_t rows = 64, dim = 4103;
  auto y = randomFloats(static_cast<size_t>(rows) * dim, -2.0f, 2.0f);
  const auto bias = randomFloats(dim, -1.0f, 1.0f);
  DeviceBuffer<float> d_y(y), d_bias(bias);
  const auto config = gpu::elementwiseLaunch(static_cast<int64_t>(rows) * dim);
  if (!runOnCpu("addBias", config, &gpu::addBiasKernel, gpu::AddBiasArgs{y.data(), bias.data(), rows, dim})) {
    return false;
  }
  const gpu::AddBiasArgs args{d_y.get(), d_bias.get(), rows, dim};
  checkCuda(gpu::launchAddBias(config, args, nullptr), "addBias");
  checkCuda(cudaDeviceSynchronize(), "addBias");
  const bool pass = compare("addBias", d_y.download(), y, true);
  timeKernel("addBias", 2.0 * d_y.bytes() + d_bias.bytes(), [&] { return gpu::launchAddBias(config, args, nullptr); });
  return pass;
}

bool checkGatherRows() {
  const int32_t src_rows = 100, num_rows = 64, dim = 4096;
  const auto src = randomFloats(static_cast<size_t>(src_rows) * dim, -2.0f, 2.0f);
  const auto rows = randomInts(num_rows, 0, src_rows - 1);  // repeats are fine: reads only
  std::vector<float> cpu_dst(static_cast<size_t>(num_rows) * dim);
  const auto config = gpu::gatherRowsLaunch(num_rows);
  if (!runOnCpu("gatherRows", config, &gpu::gatherRowsKernel,
                gpu::GatherRowsArgs{src.data(), rows.data(), cpu_dst.data(), num_rows, dim})) {
    return false;
  }
  DeviceBuffer<float> d_src(src), d_dst(std::vector<float>(cpu_dst.size()));
  DeviceBuffer<int32_t> d_rows(rows);
  const gpu::GatherRowsArgs args{d_src.get(), d_rows.get(), d_dst.get(), num_rows, dim};
  checkCuda(gpu::launchGatherRows(config, args, nullptr), "gatherRows");
  checkCuda(cudaDeviceSynchronize(), "gatherRows");
  const bool pass = compare("gatherRows", d_dst.download(), cpu_dst, true);
  timeKernel("gatherRows", 2.0 * d_dst.bytes(), [&] { return gpu::launchGatherRows(config, args, nullptr); });
  return pass;
}

// A paged KV pool as KvStorage lays it out (kmath::kvOffset).
struct KvShape {
  int32_t layers = 2, layer = 1, num_blocks = 64, block_size = 16, num_kv_heads = 2, head_dim = 128;
  size_t poolFloats() const {
    return static_cast<size_t>(layers) * num_blocks * 2 * block_size * num_kv_heads * head_dim;
  }
};

// A pool of random values: fp32, or their bf16 bits (a bf16 pool).
template <typename T>
std::vector<T> randomPool(size_t n) {
  const std::vector<float> f = randomFloats(n, -1.0f, 1.0f);
  if constexpr (std::is_same_v<T, float>) {
    return f;
  } else {
    std::vector<T> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = kmath::bf16Bits(f[i]);
    return h;
  }
}
// A pool's elements as fp32 (compare() takes floats; widening is exact).
template <typename T>
std::vector<float> widened(const std::vector<T>& pool) {
  if constexpr (std::is_same_v<T, float>) {
    return pool;
  } else {
    std::vector<float> f(pool.size());
    for (size_t i = 0; i < pool.size(); ++i) f[i] = kmath::bf16Value(pool[i]);
    return f;
  }
}

// The embedding lookup from a bf16 table (--dtype bfloat16 keeps the
// embedding in bf16), widened to fp32: bitwise the executor's.
bool checkGatherRowsBf16() {
  const char* name = "gatherRows bf16";
  const int32_t src_rows = 100, num_rows = 64, dim = 4096;
  const auto src = randomPool<uint16_t>(static_cast<size_t>(src_rows) * dim);
  const auto rows = randomInts(num_rows, 0, src_rows - 1);
  std::vector<float> cpu_dst(static_cast<size_t>(num_rows) * dim);
  const auto config = gpu::gatherRowsLaunch(num_rows);
  if (!runOnCpu(name, config, &gpu::gatherRowsKernel,
                gpu::GatherRowsArgs{src.data(), rows.data(), cpu_dst.data(), num_rows, dim, true})) {
    return false;
  }
  DeviceBuffer<uint16_t> d_src(src);
  DeviceBuffer<float> d_dst(std::vector<float>(cpu_dst.size()));
  DeviceBuffer<int32_t> d_rows(rows);
  const gpu::GatherRowsArgs args{d_src.get(), d_rows.get(), d_dst.get(), num_rows, dim, true};
  checkCuda(gpu::launchGatherRows(config, args, nullptr), name);
  checkCuda(cudaDeviceSynchronize(), name);
  const bool pass = compare(name, d_dst.download(), cpu_dst, true);
  timeKernel(name, 1.5 * d_dst.bytes(), [&] { return gpu::launchGatherRows(config, args, nullptr); });
  return pass;
}

// T: float, or uint16_t for a bf16 pool.
template <typename T>
bool checkWriteKv() {
  constexpr bool bf16 = std::is_same_v<T, uint16_t>;
  const char* name = bf16 ? "writeKv bf16" : "writeKv";
  const KvShape s;
  const int32_t rows = 40, width = s.num_kv_heads * s.head_dim;
  const auto k = randomFloats(static_cast<size_t>(rows) * width, -2.0f, 2.0f);
  const auto v = randomFloats(k.size(), -2.0f, 2.0f);
  auto kv = randomPool<T>(s.poolFloats());  // what the rows do not overwrite stays
  // Distinct (block, slot) per row, as the scheduler guarantees: two rows
  // writing one slot would race on the GPU.
  std::vector<int32_t> blocks(static_cast<size_t>(s.num_blocks));
  for (int32_t b = 0; b < s.num_blocks; ++b) blocks[static_cast<size_t>(b)] = b;
  std::shuffle(blocks.begin(), blocks.end(), rng);
  std::vector<int32_t> row_block(rows), row_slot(rows);
  for (int32_t r = 0; r < rows; ++r) {
    row_block[static_cast<size_t>(r)] = blocks[static_cast<size_t>(r / s.block_size)];
    row_slot[static_cast<size_t>(r)] = (r * 7) % s.block_size;
  }
  DeviceBuffer<float> d_k(k), d_v(v);
  DeviceBuffer<T> d_kv(kv);
  DeviceBuffer<int32_t> d_block(row_block), d_slot(row_slot);
  const auto config = gpu::writeKvLaunch(rows);
  if (!runOnCpu(name, config, &gpu::writeKvKernel,
                gpu::WriteKvArgs{k.data(), v.data(), kv.data(), row_block.data(), row_slot.data(), rows, s.layer,
                                 s.num_blocks, s.block_size, s.num_kv_heads, s.head_dim, bf16})) {
    return false;
  }
  const gpu::WriteKvArgs args{d_k.get(), d_v.get(),    d_kv.get(),   d_block.get(),  d_slot.get(), rows,
                              s.layer,   s.num_blocks, s.block_size, s.num_kv_heads, s.head_dim,   bf16};
  checkCuda(gpu::launchWriteKv(config, args, nullptr), name);
  checkCuda(cudaDeviceSynchronize(), name);
  const bool pass = compare(name, widened(d_kv.download()), widened(kv), true);  // the whole pool
  // Bytes moved: K and V read as fp32, written as T.
  timeKernel(name, 2.0 * d_k.bytes() * (1.0 + sizeof(T) / 4.0),
             [&] { return gpu::launchWriteKv(config, args, nullptr); });
  return pass;
}

// The P/D layer block checksums (XXH64) of a bf16 pool computed on the GPU
// (what a prefill agent announces and a decode agent checks with
// --kv-device-transport direct), against the host's XXH64 of the same
// bytes, for 500 layer blocks of two layers in shuffled order; then timed
// over all 2048.
bool checkKvChecksum() {
  const char* name = "kvChecksum";
  const KvShape s{.layers = 2, .layer = 1, .num_blocks = 1024, .block_size = 16, .num_kv_heads = 8, .head_dim = 128};
  const auto pool = randomPool<uint16_t>(s.poolFloats());
  const size_t block_bytes = 2 * static_cast<size_t>(s.block_size) * s.num_kv_heads * s.head_dim * sizeof(uint16_t);
  // Layer blocks by their index in the pool (layer * num_blocks + block), of both layers, shuffled.
  std::vector<int64_t> ids(static_cast<size_t>(s.layers) * s.num_blocks);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i);
  std::shuffle(ids.begin(), ids.end(), rng);
  const std::vector<int64_t> some(ids.begin(), ids.begin() + 500);
  std::vector<uint64_t> want(some.size());
  const auto* bytes = reinterpret_cast<const std::byte*>(pool.data());
  for (size_t i = 0; i < some.size(); ++i) {
    want[i] = tandem::layerBlockChecksum({bytes + static_cast<size_t>(some[i]) * block_bytes, block_bytes});
  }
  DeviceBuffer<uint16_t> d_pool(pool);
  DeviceBuffer<int64_t> d_some(some), d_all(ids);
  DeviceBuffer<uint64_t> d_out(std::vector<uint64_t>(ids.size()));
  const auto words = static_cast<int64_t>(block_bytes / 4);
  const auto* kv = reinterpret_cast<const uint32_t*>(d_pool.get());
  const gpu::KvChecksumArgs args{kv, d_some.get(), d_out.get(), static_cast<int32_t>(some.size()), words};
  checkCuda(gpu::launchKvChecksum(gpu::kvChecksumLaunch(args.count), args, nullptr), name);
  checkCuda(cudaDeviceSynchronize(), name);
  std::vector<uint64_t> got = d_out.download();
  got.resize(want.size());
  size_t mismatches = 0;
  for (size_t i = 0; i < want.size(); ++i) mismatches += got[i] != want[i] ? 1 : 0;
  const bool pass = mismatches == 0;
  std::printf("%s %-16s %zu of %zu layer blocks' checksums differ from the host's XXH64\n", pass ? "PASS" : "FAIL",
              name, mismatches, want.size());
  const gpu::KvChecksumArgs all{kv, d_all.get(), d_out.get(), static_cast<int32_t>(ids.size()), words};
  timeKernel(name, static_cast<double>(block_bytes) * static_cast<double>(ids.size()),
             [&] { return gpu::launchKvChecksum(gpu::kvChecksumLaunch(all.count), all, nullptr); });
  return pass;
}

// Attention over `chunks` (start position, rows), as KernelBackend::attention
// builds them, on the GPU against the CPU executor, then timed.
struct AttentionChunk {
  int32_t start_pos, num_rows;
};
template <typename T>  // float, or uint16_t for a bf16 pool
bool checkAttentionShape(const char* name, const KvShape& s, int32_t num_heads,
                         const std::vector<AttentionChunk>& chunks) {
  constexpr bool bf16 = std::is_same_v<T, uint16_t>;
  using Chunk = AttentionChunk;
  std::vector<int32_t> block_tables, row_pos, row_table, row_split;
  int32_t splits = 0, max_splits = 1;
  for (const Chunk& c : chunks) {
    const auto table_at = static_cast<int32_t>(block_tables.size());
    const int32_t blocks = kmath::blocksFor(c.start_pos + c.num_rows, s.block_size);
    // Blocks may repeat across tables: attention only reads the pool.
    const auto table = randomInts(static_cast<size_t>(blocks), 0, s.num_blocks - 1);
    block_tables.insert(block_tables.end(), table.begin(), table.end());
    for (int32_t r = 0; r < c.num_rows; ++r) {
      const int32_t n = gpu::attentionSplits(kmath::visibleKeys(c.start_pos, r));
      row_pos.push_back(c.start_pos + r);
      row_table.push_back(table_at);
      row_split.push_back(splits);
      splits += n;
      max_splits = std::max(max_splits, n);
    }
  }
  const auto rows = static_cast<int32_t>(row_pos.size());
  const auto q = randomFloats(static_cast<size_t>(rows) * num_heads * s.head_dim, -1.0f, 1.0f);
  const auto kv = randomPool<T>(s.poolFloats());
  std::vector<float> cpu_out(q.size()), cpu_partial(static_cast<size_t>(splits) * num_heads *
                                                    static_cast<size_t>(gpu::attentionPartialFloats(s.head_dim)));
  const gpu::AttentionArgs cpu_args{q.data(),
                                    cpu_out.data(),
                                    kv.data(),
                                    block_tables.data(),
                                    row_pos.data(),
                                    row_table.data(),
                                    row_split.data(),
                                    cpu_partial.data(),
                                    rows,
                                    s.layer,
                                    s.num_blocks,
                                    s.block_size,
                                    num_heads,
                                    s.num_kv_heads,
                                    s.head_dim,
                                    kmath::attentionScale(s.head_dim),
                                    bf16};
  const auto split_config = gpu::attentionSplitLaunch(rows, num_heads, s.num_kv_heads, max_splits, s.head_dim);
  const auto combine_config = gpu::attentionCombineLaunch(rows, num_heads);
  if (!runOnCpu(name, split_config, &gpu::attentionSplitKernel, cpu_args) ||
      !runOnCpu(name, combine_config, &gpu::attentionCombineKernel, cpu_args)) {
    return false;
  }
  DeviceBuffer<float> d_q(q), d_out(std::vector<float>(q.size())), d_partial(std::vector<float>(cpu_partial.size()));
  DeviceBuffer<T> d_kv(kv);
  DeviceBuffer<int32_t> d_tables(block_tables), d_pos(row_pos), d_table(row_table), d_split(row_split);
  gpu::AttentionArgs args = cpu_args;
  args.q = d_q.get();
  args.out = d_out.get();
  args.kv = d_kv.get();
  args.block_tables = d_tables.get();
  args.row_pos = d_pos.get();
  args.row_table = d_table.get();
  args.row_split = d_split.get();
  args.partial = d_partial.get();
  const auto launch = [&] {
    const int code = gpu::launchAttentionSplit(split_config, args, nullptr);
    return code != 0 ? code : gpu::launchAttentionCombine(combine_config, args, nullptr);
  };
  checkCuda(launch(), name);
  checkCuda(cudaDeviceSynchronize(), name);
  const bool pass = compare(name, d_out.download(), cpu_out, false);
  // Each row reads K and V of its visible keys once per KV head at least
  // (the query heads of a GQA group read the same ones: L2 may serve them).
  double kv_bytes = 0.0;
  for (int32_t p : row_pos) kv_bytes += 2.0 * (p + 1) * s.head_dim * sizeof(T) * s.num_kv_heads;
  timeKernel(name, kv_bytes + 2.0 * d_q.bytes(), launch);
  return pass;
}

// The edge cases: a prefill of 5 rows from position 0 (one split each) and
// a decode row at position 1300 (three splits of 448 keys), GQA 8 query
// heads over 2 KV heads. Then a long-context decode step as a coding agent's
// session makes one: 4 rows at 4,095 to 30,000 keys (8 to 16 splits), the
// layer shape of Llama 3 8B (32 query heads over 8 KV heads of 128), the
// pool (256 MB) several times the GPU's L2 (with timing only). Each with
// an fp32 pool and a bf16 one (--kv-dtype bfloat16).
bool checkAttention() {
  const bool small = checkAttentionShape<float>("attention", KvShape{}, 8, {{0, 5}, {1300, 1}});
  const bool small_bf16 = checkAttentionShape<uint16_t>("attention bf16", KvShape{}, 8, {{0, 5}, {1300, 1}});
  if (!g_timing) return small && small_bf16;  // --no-timing (compute-sanitizer's runs): the edge cases only
  const KvShape llama{
      .layers = 1, .layer = 0, .num_blocks = 2048, .block_size = 16, .num_kv_heads = 8, .head_dim = 128};
  const std::vector<AttentionChunk> decode = {{4094, 1}, {8191, 1}, {16000, 1}, {29999, 1}};
  const bool longer = checkAttentionShape<float>("attention long", llama, 32, decode);
  const bool longer_bf16 = checkAttentionShape<uint16_t>("attn long bf16", llama, 32, decode);
  return small && small_bf16 && longer && longer_bf16;
}

// The pinned cuBLASLt GEMM (cublas_gemm.h) against the CPU backend's GEMM
// (another summation order: within 1e-4 relative over k = 4096), and its
// batch invariance: a row computed alone has the bits it has in a batch.
// The GEMM through cuBLASLt with `split_k` (CublasGemmOptions) against the
// CPU GEMM, and batch invariance: row 5 alone, in a batch of 37 and in one
// of 256 (the reference batch the algorithm is chosen for), bitwise.
bool checkGemm(uint32_t split_k, bool bf16 = false) {
  const std::string name =
      std::string(bf16 ? "gemm bf16" : "gemm") + (split_k == 1 ? "" : " split-K " + std::to_string(split_k));
  const int32_t m = 37, n = 1024, k = 4096;
  auto x = randomFloats(static_cast<size_t>(m) * k, -1.0f, 1.0f);
  auto w = randomFloats(static_cast<size_t>(n) * k, -0.05f, 0.05f);
  // bf16: the inputs as the engine gives them (kmath::bf16Bits); the CPU
  // reference multiplies the same rounded values in fp32.
  std::vector<uint16_t> x16, w16;
  if (bf16) {
    for (float& v : x) x16.push_back(kmath::bf16Bits(v)), v = kmath::bf16Value(x16.back());
    for (float& v : w) w16.push_back(kmath::bf16Bits(v)), v = kmath::bf16Value(w16.back());
  }
  std::vector<float> cpu_out(static_cast<size_t>(m) * n);
  tandem::engine::CpuBackend cpu;
  cpu.gemm(x.data(), w.data(), cpu_out.data(), m, n, k, /*accumulate=*/false);
  std::string error;
  auto gemm = gpu::CublasGemm::create(&error, {.split_k = split_k, .bf16_inputs = bf16});
  if (!gemm) {
    std::printf("FAIL %-16s %s\n", name.c_str(), error.c_str());
    return false;
  }
  // The device's inputs, fp32 or bf16, and a pointer to row r of x.
  DeviceBuffer<float> d_x32(bf16 ? std::vector<float>(1) : x), d_w32(bf16 ? std::vector<float>(1) : w);
  DeviceBuffer<uint16_t> d_x16(bf16 ? x16 : std::vector<uint16_t>(1)), d_w16(bf16 ? w16 : std::vector<uint16_t>(1));
  const size_t element = bf16 ? sizeof(uint16_t) : sizeof(float);
  const auto* d_x = bf16 ? static_cast<const void*>(d_x16.get()) : d_x32.get();
  const auto* d_w = bf16 ? static_cast<const void*>(d_w16.get()) : d_w32.get();
  auto xRow = [&](const void* base, int32_t r) {
    return static_cast<const char*>(base) + static_cast<size_t>(r) * k * element;
  };
  DeviceBuffer<float> d_y(std::vector<float>(cpu_out.size())), d_row{std::vector<float>(n)};
  if (error = gemm->run(d_x, d_w, d_y.get(), m, n, k, false, nullptr); !error.empty()) {
    std::printf("FAIL %-16s %s\n", name.c_str(), error.c_str());
    return false;
  }
  checkCuda(cudaDeviceSynchronize(), "gemm");
  const std::vector<float> batch = d_y.download();
  bool pass = compare(name.c_str(), batch, cpu_out, false, 1e-4);
  const int32_t row = 5, big = gpu::CublasGemm::kReferenceRows;
  // The big batch: x's rows repeated (row 5 stays row 5).
  std::vector<float> x_big32;
  std::vector<uint16_t> x_big16;
  for (size_t i = 0; i < static_cast<size_t>(big) * k; ++i) {
    if (bf16) {
      x_big16.push_back(x16[i % x16.size()]);
    } else {
      x_big32.push_back(x[i % x.size()]);
    }
  }
  DeviceBuffer<float> d_x_big32(bf16 ? std::vector<float>(1) : x_big32),
      d_y_big(std::vector<float>(static_cast<size_t>(big) * n));
  DeviceBuffer<uint16_t> d_x_big16(bf16 ? x_big16 : std::vector<uint16_t>(1));
  const void* d_x_big = bf16 ? static_cast<const void*>(d_x_big16.get()) : d_x_big32.get();
  if (error = gemm->run(xRow(d_x, row), d_w, d_row.get(), 1, n, k, false, nullptr); error.empty()) {
    error = gemm->run(d_x_big, d_w, d_y_big.get(), big, n, k, false, nullptr);
  }
  if (!error.empty()) {
    std::printf("FAIL %-16s %s\n", (name + " batch-inv.").c_str(), error.c_str());
    return false;
  }
  checkCuda(cudaDeviceSynchronize(), "gemm alone");
  const std::vector<float> in_batch(batch.begin() + static_cast<long>(row) * n, batch.begin() + static_cast<long>(row + 1) * n);
  const std::vector<float> all_big = d_y_big.download();
  const std::vector<float> in_big(all_big.begin() + static_cast<long>(row) * n, all_big.begin() + static_cast<long>(row + 1) * n);
  pass = compare((name + " batch-inv.").c_str(), d_row.download(), in_batch, true) && pass;
  pass = compare((name + " m=256").c_str(), in_big, in_batch, true) && pass;
  timeKernel(name.c_str(),
             static_cast<double>(element) * (static_cast<double>(m) * k + static_cast<double>(n) * k) +
                 4.0 * static_cast<double>(m) * n,
             [&] { return gemm->run(d_x, d_w, d_y.get(), m, n, k, false, nullptr).empty() ? 0 : 1; });
  return pass;
}

// The sampling kernel: the same token (or the same hand-back to the host)
// on the GPU as on the CPU executor, for greedy and temperature rows.
bool checkSample() {
  const int32_t rows = 32, vocab = 32000;
  const auto logits = randomFloats(static_cast<size_t>(rows) * vocab, -8.0f, 8.0f);
  std::vector<float> temperature(rows), top_p(rows);
  std::vector<int32_t> top_k(rows);
  std::vector<double> uniform(rows);
  for (int32_t r = 0; r < rows; ++r) {
    temperature[static_cast<size_t>(r)] = r % 4 == 0 ? 0.0f : 0.25f * static_cast<float>(r % 4);
    top_k[static_cast<size_t>(r)] = r % 3 == 0 ? 0 : 50;
    top_p[static_cast<size_t>(r)] = r % 2 == 0 ? 1.0f : 0.9f;
    uniform[static_cast<size_t>(r)] = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  }
  std::vector<double> probs(static_cast<size_t>(rows) * gpu::kSampleMaxCandidates);
  std::vector<int32_t> cpu_out(rows);
  const auto config = gpu::sampleLaunch(rows);
  if (!runOnCpu("sample", config, &gpu::sampleKernel,
                gpu::SampleArgs{logits.data(), temperature.data(), top_k.data(), top_p.data(), uniform.data(),
                                probs.data(), cpu_out.data(), rows, vocab})) {
    return false;
  }
  DeviceBuffer<float> d_logits(logits), d_t(temperature), d_p(top_p);
  DeviceBuffer<int32_t> d_k(top_k), d_out{std::vector<int32_t>(rows)};
  DeviceBuffer<double> d_u(uniform), d_probs(probs);
  const gpu::SampleArgs args{d_logits.get(), d_t.get(), d_k.get(), d_p.get(), d_u.get(),
                             d_probs.get(),  d_out.get(), rows, vocab};
  checkCuda(gpu::launchSample(config, args, nullptr), "sample");
  checkCuda(cudaDeviceSynchronize(), "sample");
  const std::vector<int32_t> gpu_out = d_out.download();
  int differ = 0;
  for (int32_t r = 0; r < rows; ++r) differ += gpu_out[static_cast<size_t>(r)] != cpu_out[static_cast<size_t>(r)];
  std::printf("%s %-16s same token: %d of %d rows differ\n", differ == 0 ? "PASS" : "FAIL", "sample", differ, rows);
  timeKernel("sample", static_cast<double>(d_logits.bytes()), [&] { return gpu::launchSample(config, args, nullptr); });
  return differ == 0;
}

}  // namespace

namespace engine = tandem::engine;

// The logits of a 40-token prompt and 5 decode steps of `weights` on
// `backend` (its KV pool from `device_backend` when given), with
// `all_reduce` when it is a tensor-parallel rank, the pool of `kv_dtype`;
// empty when a pass failed.
std::vector<std::vector<float>> runModel(const std::shared_ptr<const engine::ModelWeights>& weights,
                                         engine::Backend& backend, engine::KernelBackend* device_backend,
                                         engine::AllReducePartials all_reduce, const std::vector<tandem::TokenId>& tokens,
                                         engine::KvDtype kv_dtype = engine::KvDtype::kFloat32) {
  std::vector<std::vector<float>> out;
  auto model = engine::LlamaModel::create(weights, backend, std::move(all_reduce));
  if (!model.ok()) {
    std::fprintf(stderr, "model: %s\n", std::string(model.status().message()).c_str());
    return out;
  }
  const engine::KvLayout layout = engine::kvLayoutFor(weights->config, 8, 16, kv_dtype);
  std::unique_ptr<engine::KvStorage> kv;
  if (device_backend != nullptr) {
    auto memory = device_backend->kvMemory(layout.totalBytes());
    if (!memory.ok()) {
      std::fprintf(stderr, "KV pool: %s\n", std::string(memory.status().message()).c_str());
      return out;
    }
    kv = std::make_unique<engine::KvStorage>(layout, std::move(*memory));
  } else {
    kv = std::make_unique<engine::KvStorage>(layout);
  }
  std::vector<tandem::BlockId> table;
  for (int32_t b = 0; b < 8; ++b) table.push_back(tandem::BlockId(b));
  for (size_t start = 0; start < tokens.size();) {
    const size_t n = start < 40 ? 40 : 1;
    const engine::SequenceChunk c{.tokens = std::span<const tandem::TokenId>(tokens).subspan(start, n),
                                  .start_pos = static_cast<int32_t>(start),
                                  .block_table = table,
                                  .want_logits = true};
    std::vector<float> logits;
    const absl::Status s = (*model)->forward(std::span<const engine::SequenceChunk>(&c, 1), *kv, &logits);
    if (!s.ok()) {
      std::fprintf(stderr, "forward: %s\n", std::string(s.message()).c_str());
      return {};
    }
    out.push_back(std::move(logits));
    start += n;
  }
  return out;
}

// got against want within 1e-4 of the logits' scale (kernel_backend_test's
// bound for the same backend on the executor); prints one PASS/FAIL line.
bool compareLogits(const std::string& what, const std::vector<std::vector<float>>& want,
                   const std::vector<std::vector<float>>& got) {
  if (got.size() != want.size() || want.empty()) {
    std::printf("FAIL %s: the forward passes did not run\n", what.c_str());
    return false;
  }
  double max_err = 0, max_abs = 0;
  for (size_t s = 0; s < want.size(); ++s) {
    for (size_t i = 0; i < want[s].size() && i < got[s].size(); ++i) {
      max_err = std::max(max_err, static_cast<double>(std::fabs(got[s][i] - want[s][i])));
      max_abs = std::max(max_abs, static_cast<double>(std::fabs(want[s][i])));
    }
  }
  const bool pass = max_err < 1e-4 * max_abs;
  std::printf("%s %s: max |logit diff| %.3g, max |logit| %.3g\n", pass ? "PASS" : "FAIL", what.c_str(), max_err, max_abs);
  return pass;
}

std::shared_ptr<const engine::ModelWeights> weightsOf(const std::string& family) {
  const engine::ModelConfig config = family == "tiny" ? engine::tinyModelConfig() : *engine::smallArchConfig(family);
  return engine::makeRandomWeights(config, 20261126, {.random_norm_gains = true});
}

std::vector<tandem::TokenId> promptFor(const engine::ModelConfig& config) {
  std::mt19937 rng(7);
  std::vector<tandem::TokenId> tokens(45);
  for (auto& t : tokens) t = static_cast<tandem::TokenId>(rng() % static_cast<uint32_t>(config.vocab_size));
  return tokens;
}

// The model with bf16 projections (--dtype bfloat16) or a bf16 KV pool
// (--kv-dtype bfloat16) through the CUDA backend against the CPU backend
// in the same mode (the same products and the same cached values, another
// summation order: a last-bit difference can flip an activation's or a K/V
// element's bf16 rounding), so the bound is half the mode's own distance
// from fp32 (kernel_backend_test's bound on the executor, where the tiny
// model came to 0.23 of it with bf16 projections, 0.05 with a bf16 pool).
bool checkModelBf16(const std::string& family, bool bf16_kv = false) {
  const std::string mode = bf16_kv ? "kv bf16" : "bf16";
  const engine::GemmDtype gemm = bf16_kv ? engine::GemmDtype::kFloat32 : engine::GemmDtype::kBfloat16;
  const engine::KvDtype kv = bf16_kv ? engine::KvDtype::kBfloat16 : engine::KvDtype::kFloat32;
  const auto weights = weightsOf(family);
  const auto tokens = promptFor(weights->config);
  engine::CpuBackend cpu_bf16(engine::CpuBackendOptions{.gemm_dtype = gemm});
  engine::CpuBackend cpu_fp32;
  auto cuda = engine::makeCudaBackend(0, std::nullopt, gemm);
  if (!cuda.ok()) {
    std::printf("FAIL model %s %s: the CUDA backend: %s\n", family.c_str(), mode.c_str(),
                std::string(cuda.status().message()).c_str());
    return false;
  }
  const auto want = runModel(weights, cpu_bf16, nullptr, nullptr, tokens, kv);
  const auto fp32 = runModel(weights, cpu_fp32, nullptr, nullptr, tokens);
  const auto got = runModel(weights, **cuda, cuda->get(), nullptr, tokens, kv);
  if (got.size() != want.size() || want.empty() || fp32.size() != want.size()) {
    std::printf("FAIL model %s %s: the forward passes did not run\n", family.c_str(), mode.c_str());
    return false;
  }
  double max_err = 0, from_fp32 = 0, max_abs = 0;
  for (size_t s = 0; s < want.size(); ++s) {
    for (size_t i = 0; i < want[s].size() && i < got[s].size(); ++i) {
      max_err = std::max(max_err, static_cast<double>(std::fabs(got[s][i] - want[s][i])));
      from_fp32 = std::max(from_fp32, static_cast<double>(std::fabs(want[s][i] - fp32[s][i])));
      max_abs = std::max(max_abs, static_cast<double>(std::fabs(want[s][i])));
    }
  }
  const bool pass = max_err < 0.5 * from_fp32;
  std::printf(
      "%s model %s %s through the CUDA backend against the CPU backend's: max |logit diff| %.3g "
      "(%s from fp32: %.3g), max |logit| %.3g\n",
      pass ? "PASS" : "FAIL", family.c_str(), mode.c_str(), max_err, mode.c_str(), from_fp32, max_abs);
  return pass;
}

// The model through the CUDA backend (cuda_device.h) against the CPU
// backend, for the tiny model and a small model of each family.
bool checkModel(const std::string& family) {
  const auto weights = weightsOf(family);
  const auto tokens = promptFor(weights->config);
  engine::CpuBackend cpu;
  auto cuda = engine::makeCudaBackend(0);
  if (!cuda.ok()) {
    std::printf("FAIL model %s: the CUDA backend: %s\n", family.c_str(), std::string(cuda.status().message()).c_str());
    return false;
  }
  const auto want = runModel(weights, cpu, nullptr, nullptr, tokens);
  const auto got = runModel(weights, **cuda, cuda->get(), nullptr, tokens);
  return compareLogits("model " + family + " through the CUDA backend (" + (*cuda)->device().name() + ")", want, got);
}

// Decode steps as CUDA graphs (KernelBackend's graph steps) on the device,
// graphed and launch by launch, with what a graph step must get right on a
// GPU: 7 sequences (padded to a bucket of 8), one crossing 512 keys (a new
// splits bucket, so a new graph), a prefill longer than any before halfway
// (the activations grow; where they move, the next replay is refused: on
// the CPU executor they do, while on the H200 cudaMalloc gave the grown
// buffer its old address and the replay went on, correctly), logits for the
// first half and sampling on the device (greedy and seeded) for the second.
// The same logits and tokens, bit for bit; the graphs captured, replayed
// and left; and the time per decode step of each, over the second half's
// steady replays (the host's launch cost is what graphs remove; the tiny
// model shows it best).
bool checkGraphs() {
  const auto weights = weightsOf("tiny");
  const engine::ModelConfig& config = weights->config;
  constexpr int kSeqs = 7, kDecodes = 40, kHalf = 20, kTimedFrom = 24, kLongPrefill = 700;
  constexpr int kBlock = 16;
  struct Run {
    std::vector<std::vector<float>> logits;
    std::vector<tandem::TokenId> tokens;
    double seconds_per_step = 0;
    engine::KernelBackend::GraphStats stats;
    std::string error;
  };
  auto run = [&](int32_t graph_max_rows) {
    Run r;
    auto backend = engine::makeCudaBackend(0, graph_max_rows);
    if (!backend.ok()) {
      r.error = std::string(backend.status().message());
      return r;
    }
    auto model = engine::LlamaModel::create(weights, **backend);
    const engine::KvLayout layout = engine::kvLayoutFor(config, 160, kBlock);
    auto memory = (*backend)->kvMemory(layout.totalBytes());
    if (!model.ok() || !memory.ok()) {
      r.error = std::string(!model.ok() ? model.status().message() : memory.status().message());
      return r;
    }
    engine::KvStorage kv(layout, std::move(*memory));
    std::mt19937 token_rng(11);
    auto tokensOf = [&](int n) {
      std::vector<tandem::TokenId> t(static_cast<size_t>(n));
      for (auto& x : t) x = static_cast<tandem::TokenId>(token_rng() % static_cast<uint32_t>(config.vocab_size));
      return t;
    };
    int32_t next_block = 0;
    auto tableOf = [&](int positions) {
      std::vector<tandem::BlockId> t;
      for (int b = 0; b < (positions + kBlock - 1) / kBlock; ++b) t.push_back(tandem::BlockId(next_block++));
      return t;
    };
    std::vector<int> prompt(kSeqs, 40);
    prompt[0] = 500;  // crosses 512 keys at decode step 12
    std::vector<std::vector<tandem::TokenId>> tokens;
    std::vector<std::vector<tandem::BlockId>> tables;
    for (int s = 0; s < kSeqs; ++s) {
      tokens.push_back(tokensOf(prompt[s] + kDecodes));
      tables.push_back(tableOf(prompt[s] + kDecodes));
    }
    std::vector<float> logits;
    const engine::LlamaModel::Sampling* sampling = nullptr;
    auto forward = [&](std::span<const engine::SequenceChunk> batch) {
      const absl::Status st = (*model)->forward(batch, kv, &logits, nullptr, sampling);
      if (!st.ok() && r.error.empty()) r.error = std::string(st.message());
      return st.ok();
    };
    auto prefill = [&](std::span<const tandem::TokenId> t, std::span<const tandem::BlockId> table) {
      const engine::SequenceChunk c{.tokens = t, .start_pos = 0, .block_table = table, .want_logits = true};
      return forward(std::span<const engine::SequenceChunk>(&c, 1));
    };
    for (int s = 0; s < kSeqs; ++s) {
      if (!prefill(std::span<const tandem::TokenId>(tokens[s]).first(static_cast<size_t>(prompt[s])), tables[s])) {
        return r;
      }
    }
    std::vector<engine::SamplingParams> params(kSeqs);
    std::vector<double> uniforms(kSeqs);
    std::vector<tandem::TokenId> sampled(kSeqs);
    for (int s = 0; s < kSeqs; ++s) {
      params[s].temperature = s % 2 == 0 ? 0.0f : 0.8f;
      params[s].top_k = s % 2 == 0 ? 0 : 40;
      uniforms[s] = s % 2 == 0 ? 0.0 : 0.125 * s;
    }
    const engine::LlamaModel::Sampling sample_on_device{params, uniforms, sampled};
    auto start = std::chrono::steady_clock::now();
    for (int d = 0; d < kDecodes; ++d) {
      if (d == kHalf) {
        const auto long_prompt = tokensOf(kLongPrefill);
        const auto long_table = tableOf(kLongPrefill);
        sampling = nullptr;
        if (!prefill(long_prompt, long_table)) return r;
        sampling = &sample_on_device;
      }
      if (d == kTimedFrom) start = std::chrono::steady_clock::now();
      std::vector<engine::SequenceChunk> batch;
      for (int s = 0; s < kSeqs; ++s) {
        batch.push_back(engine::SequenceChunk{
            .tokens = std::span<const tandem::TokenId>(tokens[s]).subspan(static_cast<size_t>(prompt[s] + d), 1),
            .start_pos = prompt[s] + d,
            .block_table = tables[s],
            .want_logits = true});
      }
      if (!forward(batch)) return r;
      // Each step waits for its logits or tokens: the step's whole time.
      if (sampling == nullptr) {
        r.logits.push_back(logits);
      } else {
        r.tokens.insert(r.tokens.end(), sampled.begin(), sampled.end());
      }
    }
    r.seconds_per_step = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
                         (kDecodes - kTimedFrom);
    r.stats = (*backend)->graphStats();
    if (!(*backend)->graphFailure().ok()) r.error = std::string((*backend)->graphFailure().message());
    return r;
  };
  const Run eager = run(0), graphed = run(engine::kDefaultGraphMaxRows);
  for (const Run* r : {&eager, &graphed}) {
    if (!r->error.empty()) {
      std::printf("FAIL graphs: %s\n", r->error.c_str());
      return false;
    }
  }
  bool same = eager.logits.size() == graphed.logits.size() && eager.tokens == graphed.tokens;
  for (size_t s = 0; same && s < eager.logits.size(); ++s) {
    same = eager.logits[s].size() == graphed.logits[s].size() &&
           std::memcmp(eager.logits[s].data(), graphed.logits[s].data(), eager.logits[s].size() * sizeof(float)) == 0;
  }
  // Replays in both halves and a graph per key (splits 1 and 2 with
  // logits, splits 2 sampling); none at all launch by launch. A left graph
  // is not required: whether the long prefill moves the activations is the
  // device allocator's choice.
  const engine::KernelBackend::GraphStats& g = graphed.stats;
  const bool graphs_ran = g.replayed >= kDecodes / 2 && g.captured >= 3 && g.padding_rows > 0 &&
                          eager.stats.captured + eager.stats.replayed + eager.stats.left == 0;
  const bool pass = same && graphs_ran;
  std::printf("%s graphs           %d decode steps of %d rows (bucket 8), logits then sampling: %s bits graphed "
              "and launch by launch; %lld warm-ups, %lld captured, %lld replayed, %lld left\n",
              pass ? "PASS" : "FAIL", kDecodes, kSeqs, same ? "the same" : "DIFFERENT", static_cast<long long>(g.warmed),
              static_cast<long long>(g.captured), static_cast<long long>(g.replayed), static_cast<long long>(g.left));
  if (g_timing) {
    std::printf("     graphs           %.1f us per decode step graphed, %.1f us launch by launch (graphed / launch by "
                "launch %.3f; steps %d to %d, sampling on the device)\n",
                graphed.seconds_per_step * 1e6, eager.seconds_per_step * 1e6,
                graphed.seconds_per_step / eager.seconds_per_step, kTimedFrom, kDecodes - 1);
  }
  return pass;
}

// One rank of a tensor-parallel group of `world` processes (one per GPU):
// the tiny model's shard on GPU rank % devices, NCCL's all-reduce wired
// through the rendezvous at `socket`, against the whole model on the CPU.
bool checkTensorParallel(int rank, int world, const std::string& socket) {
  const auto weights = weightsOf("tiny");
  const auto tokens = promptFor(weights->config);
  auto shard = engine::shardWeights(*weights, rank, world);
  if (!shard.ok()) {
    std::printf("FAIL tensor parallel rank %d of %d: %s\n", rank, world, std::string(shard.status().message()).c_str());
    return false;
  }
  int devices = 0;
  cudaGetDeviceCount(&devices);
  auto device = gpu::makeCudaDevice(devices > 0 ? rank % devices : 0);
  if (!device.ok()) {
    std::printf("FAIL tensor parallel rank %d: %s\n", rank, std::string(device.status().message()).c_str());
    return false;
  }
  auto gemm = engine::cublasKernelGemm(*device);
  if (!gemm.ok()) {
    std::printf("FAIL tensor parallel rank %d: %s\n", rank, std::string(gemm.status().message()).c_str());
    return false;
  }
  engine::KernelBackend backend(*device, std::move(*gemm));
  auto group = engine::NcclGroup::join(
      {.socket_path = socket, .world = world, .rank = rank, .timeout = std::chrono::seconds(120)}, *device);
  if (!group.ok()) {
    std::printf("FAIL tensor parallel rank %d: %s\n", rank, std::string(group.status().message()).c_str());
    return false;
  }
  engine::CpuBackend cpu;
  const auto want = runModel(weights, cpu, nullptr, nullptr, tokens);
  const auto got = runModel(std::make_shared<const engine::ModelWeights>(std::move(*shard)), backend, &backend,
                            (*group)->partials(), tokens);
  if (!(*group)->status().ok()) {
    std::printf("FAIL tensor parallel rank %d: %s\n", rank, std::string((*group)->status().message()).c_str());
    return false;
  }
  return compareLogits("tensor parallel rank " + std::to_string(rank) + " of " + std::to_string(world) +
                           " (NCCL) against the whole model on the CPU",
                       want, got);
}

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line as it is known, also into a pipe
  std::vector<uint32_t> split_ks = {1};
  while (argc > 1) {
    const std::string flag = argv[1];
    if (flag == "--no-timing") {
      g_timing = false;
    } else if (flag == "--gemm-split-k" && argc > 2 && std::atoi(argv[2]) > 1) {
      split_ks.push_back(static_cast<uint32_t>(std::atoi(argv[2])));
      --argc;
      ++argv;
    } else {
      break;
    }
    --argc;
    ++argv;
  }
  const bool model = argc == 2 && std::string(argv[1]) == "--model";
  const bool tp = argc == 5 && std::string(argv[1]) == "--tp";
  if (argc > 1 && !model && !tp) {
    std::fprintf(stderr, "usage: tandem-gpu-kernel-check [--no-timing] [--gemm-split-k N ...] [--model | --tp RANK WORLD SOCKET]\n");
    return 1;  // not 2, which says there is no CUDA device
  }
  if (tp) return checkTensorParallel(std::atoi(argv[2]), std::atoi(argv[3]), argv[4]) ? 0 : 1;
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "no CUDA device: cudaGetDeviceCount %s\n",
                 err != cudaSuccess ? (std::string("failed: ") + cudaGetErrorString(err)).c_str()
                                    : "found 0 devices (no error)");
    return 2;
  }
  cudaDeviceProp prop{};
  checkCuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device 0: %s, compute capability %d.%d, %d device(s)\n", prop.name, prop.major, prop.minor, devices);
  if (prop.major * 10 + prop.minor != 90) {
    std::printf("note: built for compute capability 9.0 (H100/H200) only; on another device the launches fail\n");
  }
  bool all_pass = true;
  for (bool (*check)() :
       {checkRmsNorm, checkRope, checkSwiglu, checkAdd, checkAddBias, checkGatherRows, checkGatherRowsBf16,
        checkWriteKv<float>, checkWriteKv<uint16_t>, checkKvChecksum, checkAttention, checkSample, checkToBf16}) {
    all_pass = check() && all_pass;
  }
  for (uint32_t split_k : split_ks) all_pass = checkGemm(split_k) && all_pass;
  all_pass = checkGemm(1, /*bf16=*/true) && all_pass;
  if (model) {
    for (const char* family : {"tiny", "llama3", "qwen2", "qwen3"}) all_pass = checkModel(family) && all_pass;
    for (const char* family : {"tiny", "llama3", "qwen2", "qwen3"}) all_pass = checkModelBf16(family) && all_pass;
    for (const char* family : {"tiny", "llama3", "qwen2", "qwen3"}) {
      all_pass = checkModelBf16(family, /*bf16_kv=*/true) && all_pass;
    }
    all_pass = checkGraphs() && all_pass;
  }
  std::printf("%s\n", all_pass ? "all kernels PASS" : "some kernels FAIL");
  return all_pass ? 0 : 1;
}
