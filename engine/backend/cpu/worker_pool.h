#pragma once
// A small fixed pool of threads for data-parallel loops inside one backend
// call (GEMM, attention, SwiGLU). The thread calling parallelFor takes part,
// so a pool of N threads starts N - 1 workers; a pool of 1 runs everything
// inline.
//
// Workers sleep on a condition variable between calls (no spinning: between
// calls the engine's own thread, the HTTP threads and the KV transport need
// the cores).
//
// Workers are kept off the CPU the calling thread runs on (their affinity is
// the process's CPUs minus that one, updated when the caller moves). Without
// it the scheduler can wake a worker onto the caller's busy CPU while another
// CPU is taken by a yield-spinning thread (measured when the GEMMs ran on
// OpenBLAS, whose workers spin for up to ~0.1 s after each call), and a 2-CPU
// machine then runs the work at the speed of one (attention ~6 ms vs ~11 ms
// per 1K-token prefill).
//
// Thread-safety: parallelFor must be called from one thread at a time (the
// backend's owning thread); everything else is internal.

#include <sched.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace tandem::engine {

class WorkerPool {
 public:
  // num_threads >= 1 counts the caller of parallelFor.
  explicit WorkerPool(int num_threads);
  ~WorkerPool();  // wakes and joins the workers
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int numThreads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(item, thread) exactly once for every item in [0, num_items),
  // spread over the pool: thread is in [0, numThreads()), 0 being the caller,
  // and no two calls with the same thread run at once (so per-thread scratch
  // needs no lock). Items are claimed in increasing order. Returns when every
  // call has returned.
  void parallelFor(int64_t num_items, absl::FunctionRef<void(int64_t item, int thread)> fn);

 private:
  void workerLoop(int thread);
  // Moves the workers off the caller's current CPU if it changed since the last call.
  void keepWorkersOffCallerCpu();
  // Claims and runs items of the current job until none is left; returns how many it ran.
  int64_t runItems(int thread);

  absl::Mutex mu_;
  absl::CondVar work_cv_;  // generation_ changed or stop_
  absl::CondVar done_cv_;  // items_done_ reached the job's size, or active_ reached 0
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int active_ ABSL_GUARDED_BY(mu_) = 0;  // workers inside runItems
  int64_t items_done_ ABSL_GUARDED_BY(mu_) = 0;

  // The current job. Written by parallelFor under mu_ while no worker is
  // inside runItems (active_ == 0), and read by workers only after they saw
  // the new generation_ under mu_, so they need no lock of their own.
  const absl::FunctionRef<void(int64_t, int)>* job_fn_ = nullptr;
  int64_t job_items_ = 0;
  std::atomic<int64_t> next_item_{0};

  std::vector<std::thread> workers_;
  cpu_set_t allowed_cpus_;    // the process's affinity at construction
  int workers_off_cpu_ = -1;  // the CPU the workers are kept off; touched by the caller only
};

}  // namespace tandem::engine
