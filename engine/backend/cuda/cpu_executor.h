#pragma once
// Runs a kernel written in the portable CUDA subset (portable.h) on the CPU,
// faithfully: every thread of every block, each thread a fiber on the calling
// OS thread, switched at syncThreads() and at warp exchanges.
//
// Scheduling, per block: every runnable thread runs until it blocks (a
// barrier, a warp exchange) or returns; a block barrier releases once every
// live thread of the block waits at it (threads that returned count as
// arrived, as on the hardware); a warp exchange once every lane of the warp
// waits at one. In order mode threads run in thread order; in shuffle mode
// (Options::shuffle, or TANDEM_GPU_EXECUTOR_SHUFFLE=<seed> in the
// environment) the order of each round is a seeded permutation, so a kernel
// that reads shared memory another thread writes without a barrier between
// them sees the write in one order and not the other: its results change
// with the seed, which the kernel tests catch.
//
// Errors (the launch returns them; nothing is thrown): a launch shape the
// subset forbids (a block of 0, more than 1024 or not a multiple of 32
// threads; a grid dimension of 0; more shared memory than
// Options::max_shared_bytes); threads of one block waiting at different
// barriers with nothing left to run (divergent barriers, which hang or
// corrupt a real GPU); a warp exchange with lanes that have returned. The
// block is abandoned where it stood.
//
// Blocks run one after the other, in grid order (x fastest). Not thread-safe:
// one launch at a time per executor; executors on different threads are
// independent.

#include <cstdint>
#include <memory>

#include <absl/functional/function_ref.h>
#include <absl/status/status.h>

#include "engine/backend/cuda/portable.h"

namespace tandem::gpu {

class CpuExecutor {
 public:
  struct Options {
    bool shuffle = false;  // permute the run order of each round
    uint64_t seed = 0;     // the permutations' seed
    // 48 KiB: CUDA's dynamic shared memory without the opt-in attribute.
    size_t max_shared_bytes = 48 * 1024;
  };
  // Options from the environment: shuffle with seed N when
  // TANDEM_GPU_EXECUTOR_SHUFFLE=N is set, in order otherwise.
  static Options optionsFromEnvironment();

  explicit CpuExecutor(const Options& options);
  ~CpuExecutor();
  CpuExecutor(const CpuExecutor&) = delete;
  CpuExecutor& operator=(const CpuExecutor&) = delete;

  // Runs `thread_body` once per thread of the grid (it calls the kernel).
  [[nodiscard]] absl::Status launch(const LaunchConfig& config, absl::FunctionRef<void()> thread_body);

  // kernel(args) on every thread of the grid.
  template <typename Args>
  [[nodiscard]] absl::Status launch(const LaunchConfig& config, void (*kernel)(Args), const Args& args) {
    return launch(config, [&] { kernel(args); });
  }

  const Options& options() const { return options_; }
  // Fiber switches so far (a cost measure for tests and benchmarks).
  int64_t switches() const;

  struct Impl;  // the scheduler and the fibers (cpu_executor.cc)

 private:
  Options options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::gpu
