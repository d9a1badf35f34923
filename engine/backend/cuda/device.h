#pragma once
// Where the kernel backend (kernel_backend.h) keeps its memory and runs its
// kernels: a GPU through the CUDA runtime (cuda_device.h, in the CUDA build),
// or the CPU executor with host memory standing in for device memory
// (ExecutorDevice below, what every test runs). The backend's logic (what it
// allocates, uploads, launches and downloads) is the same on both, so the
// tests check the GPU backend's data movement too; only this layer differs.
//
// Device memory is opaque to the host: the backend reads and writes it only
// through upload() and download(). ExecutorDevice checks, for every pointer
// a launch or a copy takes, that it is device memory (owns()), so a missing
// upload fails on the CPU instead of reading host memory on a GPU. (Its
// device memory is host memory: a host read of it elsewhere goes unseen.)
//
// Errors: a failed allocation, copy or launch is returned (absl::Status);
// the backend keeps the first (KernelBackend::status()).
// Not thread-safe: one engine thread owns a device.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend/cuda/cpu_executor.h"
#include "engine/backend/cuda/kernels.h"
#include "engine/backend/cuda/sampling_kernel.h"

namespace tandem::gpu {

// Whether [p, p + bytes) lies inside one of `regions` (keyed by first
// address; `size_of(region)` is its bytes): the devices' owns().
template <typename Region, typename SizeOf>
bool withinRegion(const std::map<uintptr_t, Region>& regions, const void* p, size_t bytes, SizeOf size_of) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  auto it = regions.upper_bound(at);
  if (it == regions.begin()) return false;
  --it;
  return at + bytes <= it->first + size_of(it->second);
}

// A captured sequence of launches (a CUDA graph), run again and again by
// Device::launchGraph with the pointers and shapes it was captured with:
// only the contents of the memory it reads change between runs. Belongs to
// the device that captured it, and must go before it.
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
};

class Device {
 public:
  virtual ~Device() = default;

  // What it is, for logs ("cpu-executor", "cuda:0 NVIDIA H100 80GB HBM3").
  virtual std::string name() const = 0;

  // `bytes` of device memory (at least 64-byte aligned), contents undefined.
  virtual absl::StatusOr<void*> allocate(size_t bytes) = 0;
  virtual void release(void* p) = 0;
  // [p, p + bytes) lies in memory this device allocated (or adopted).
  virtual bool owns(const void* p, size_t bytes) const = 0;
  // Host memory someone else owns (a KV pool the agent allocated, a test's
  // vectors) used in place as this device's memory until forgetHost(p), if
  // the device can (the CPU executor can; a GPU cannot: an error saying so).
  // Adopting an empty span does nothing.
  virtual absl::Status adoptHost(void* p, size_t bytes) = 0;
  virtual void forgetHost(void* p) = 0;

  // In stream order with the launches: an upload's source may be reused
  // once it returns; a download's destination is filled when it returns.
  virtual absl::Status upload(void* device_dst, const void* host_src, size_t bytes) = 0;
  virtual absl::Status download(void* host_dst, const void* device_src, size_t bytes) = 0;
  virtual absl::Status zero(void* device_dst, size_t bytes) = 0;

  // Queued in stream order and finished by synchronize(): until it returns,
  // a download's destination is not filled and an upload's source must not
  // change. Several copies then cost one wait instead of one each. On a GPU
  // they overlap the host only from pinned memory (pinHost).
  virtual absl::Status downloadAsync(void* host_dst, const void* device_src, size_t bytes) = 0;
  virtual absl::Status uploadAsync(void* device_dst, const void* host_src, size_t bytes) = 0;
  virtual absl::Status synchronize() = 0;

  // Page-locks host memory that copies use again and again (a KV pool's
  // staging copy), until unpinHost(p): a GPU then copies it by DMA, without
  // a bounce buffer, and asynchronously. Not device memory (an error).
  virtual absl::Status pinHost(void* p, size_t bytes) = 0;
  virtual void unpinHost(void* p) = 0;

  // The kernels of kernels.h and sampling_kernel.h, one launch each, with
  // the kernel's own launch shape and device pointers in its arguments.
  virtual absl::Status rmsNorm(const LaunchConfig& c, const RmsNormArgs& a) = 0;
  virtual absl::Status rope(const LaunchConfig& c, const RopeArgs& a) = 0;
  virtual absl::Status swiglu(const LaunchConfig& c, const SwigluArgs& a) = 0;
  virtual absl::Status toBf16(const LaunchConfig& c, const ToBf16Args& a) = 0;
  virtual absl::Status add(const LaunchConfig& c, const AddArgs& a) = 0;
  virtual absl::Status addBias(const LaunchConfig& c, const AddBiasArgs& a) = 0;
  virtual absl::Status gatherRows(const LaunchConfig& c, const GatherRowsArgs& a) = 0;
  virtual absl::Status writeKv(const LaunchConfig& c, const WriteKvArgs& a) = 0;
  virtual absl::Status copyKvBlock(const LaunchConfig& c, const CopyKvBlockArgs& a) = 0;
  virtual absl::Status kvChecksum(const LaunchConfig& c, const KvChecksumArgs& a) = 0;
  virtual absl::Status attentionSplit(const LaunchConfig& c, const AttentionArgs& a) = 0;
  virtual absl::Status attentionCombine(const LaunchConfig& c, const AttentionArgs& a) = 0;
  virtual absl::Status sample(const LaunchConfig& c, const SampleArgs& a) = 0;

  // Graph capture (CUDA's stream capture): between beginCapture() and
  // endCapture() the launches (and a GPU's cuBLAS calls on the stream) are
  // recorded, not run; endCapture() returns them as a graph, and
  // launchGraph() runs it in stream order. While capturing, nothing may
  // copy, zero, synchronize, allocate or release (an error on the executor,
  // as on a GPU): a graph holds launches only, and the memory they read is
  // filled by copies made outside it. A launchGraph that fails may have run
  // part of the graph (the executor stops at a failing launch).
  virtual absl::Status beginCapture() = 0;
  virtual absl::StatusOr<std::unique_ptr<DeviceGraph>> endCapture() = 0;
  // Ends a capture and drops what it recorded (nothing is instantiated);
  // nothing to do when none is open. For a capture that is given up on.
  virtual void abortCapture() = 0;
  virtual absl::Status launchGraph(const DeviceGraph& graph) = 0;
};

// Host memory as device memory, kernels on the CPU executor. (Tests derive
// from it to make a call fail.)
class ExecutorDevice : public Device {
 public:
  explicit ExecutorDevice(const CpuExecutor::Options& options = CpuExecutor::optionsFromEnvironment());
  ~ExecutorDevice() override;

  std::string name() const override { return "cpu-executor"; }
  absl::StatusOr<void*> allocate(size_t bytes) override;
  void release(void* p) override;
  bool owns(const void* p, size_t bytes) const override;
  absl::Status adoptHost(void* p, size_t bytes) override;
  void forgetHost(void* p) override;

  absl::Status upload(void* device_dst, const void* host_src, size_t bytes) override;
  absl::Status download(void* host_dst, const void* device_src, size_t bytes) override;
  absl::Status zero(void* device_dst, size_t bytes) override;
  // Queued, and done at the next synchronize(), copy or launch (stream
  // order): a caller that reads a download's destination without
  // synchronize() reads what was there before, as it could on a GPU.
  absl::Status downloadAsync(void* host_dst, const void* device_src, size_t bytes) override;
  absl::Status uploadAsync(void* device_dst, const void* host_src, size_t bytes) override;
  absl::Status synchronize() override;
  absl::Status pinHost(void* p, size_t bytes) override;
  void unpinHost(void* p) override;
  // [p, p + bytes) lies in memory pinned with pinHost (tests).
  bool pinned(const void* p, size_t bytes) const;
  // Copies queued and not yet done (tests).
  size_t queuedCopies() const { return queued_.size(); }

  absl::Status rmsNorm(const LaunchConfig& c, const RmsNormArgs& a) override;
  absl::Status rope(const LaunchConfig& c, const RopeArgs& a) override;
  absl::Status swiglu(const LaunchConfig& c, const SwigluArgs& a) override;
  absl::Status toBf16(const LaunchConfig& c, const ToBf16Args& a) override;
  absl::Status add(const LaunchConfig& c, const AddArgs& a) override;
  absl::Status addBias(const LaunchConfig& c, const AddBiasArgs& a) override;
  absl::Status gatherRows(const LaunchConfig& c, const GatherRowsArgs& a) override;
  absl::Status writeKv(const LaunchConfig& c, const WriteKvArgs& a) override;
  absl::Status copyKvBlock(const LaunchConfig& c, const CopyKvBlockArgs& a) override;
  absl::Status kvChecksum(const LaunchConfig& c, const KvChecksumArgs& a) override;
  absl::Status attentionSplit(const LaunchConfig& c, const AttentionArgs& a) override;
  absl::Status attentionCombine(const LaunchConfig& c, const AttentionArgs& a) override;
  absl::Status sample(const LaunchConfig& c, const SampleArgs& a) override;

  // Recording closures of the launches (each argument checked when it is
  // recorded), run in order by launchGraph.
  absl::Status beginCapture() override;
  absl::StatusOr<std::unique_ptr<DeviceGraph>> endCapture() override;
  void abortCapture() override;
  absl::Status launchGraph(const DeviceGraph& graph) override;
  bool capturing() const { return capture_ != nullptr; }
  // Host work in stream order: run now, or recorded into the graph being
  // captured. The executor's GEMM goes through it (cpuKernelGemm), as
  // cuBLAS's calls on a GPU's stream go into its graphs.
  absl::Status hostTask(std::function<absl::Status()> work);

  const CpuExecutor& executor() const { return executor_; }

 private:
  struct Region {
    size_t bytes = 0;
    bool owned = false;
    int adopted = 0;  // adoptHost() calls not yet released (host memory adopted more than once)
  };
  struct QueuedCopy {
    void* dst;
    const void* src;
    size_t bytes;
  };
  // Every pointer of a launch must be device memory; the error names it.
  // Does the queued copies first (stream order).
  absl::Status check(const char* kernel, std::initializer_list<std::pair<const char*, const void*>> pointers);
  bool ownsStart(const void* p) const;
  void runQueued();
  // An error naming `what` while a graph is being captured (see Device).
  absl::Status notWhileCapturing(const char* what) const;
  class Graph;

  CpuExecutor executor_;
  std::map<uintptr_t, Region> regions_;  // by first address
  std::map<uintptr_t, size_t> pinned_;   // host memory pinned: first address -> bytes
  std::vector<QueuedCopy> queued_;
  std::unique_ptr<Graph> capture_;  // the graph being captured, if any
};

}  // namespace tandem::gpu
