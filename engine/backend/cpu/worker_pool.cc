#include "engine/backend/cpu/worker_pool.h"
#include "src/common/thread_name.h"

#include <pthread.h>

namespace tandem::engine {

WorkerPool::WorkerPool(int num_threads) {
  if (sched_getaffinity(0, sizeof(allowed_cpus_), &allowed_cpus_) != 0) CPU_ZERO(&allowed_cpus_);
  for (int t = 1; t < num_threads; ++t) workers_.emplace_back([this, t] {
    nameThisThread("cpu-worker");
    workerLoop(t);
  });
}

WorkerPool::~WorkerPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  work_cv_.SignalAll();
  for (std::thread& w : workers_) w.join();
}

void WorkerPool::parallelFor(int64_t num_items, absl::FunctionRef<void(int64_t item, int thread)> fn) {
  if (workers_.empty() || num_items <= 1) {
    for (int64_t i = 0; i < num_items; ++i) fn(i, 0);
    return;
  }
  keepWorkersOffCallerCpu();
  {
    absl::MutexLock lock(&mu_);
    // A worker still draining the previous job reads job_fn_/next_item_; let it leave first.
    while (active_ > 0) done_cv_.Wait(&mu_);
    job_fn_ = &fn;
    job_items_ = num_items;
    next_item_.store(0, std::memory_order_relaxed);
    items_done_ = 0;
    ++generation_;
  }
  work_cv_.SignalAll();
  const int64_t mine = runItems(0);
  absl::MutexLock lock(&mu_);
  items_done_ += mine;
  // Workers that have not woken up yet are not waited for: they will find
  // the job drained (or a later one) and never touch fn.
  while (items_done_ < num_items) done_cv_.Wait(&mu_);
}

void WorkerPool::keepWorkersOffCallerCpu() {
  const int cpu = sched_getcpu();
  if (cpu < 0 || cpu == workers_off_cpu_ || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &allowed_cpus_) ||
      CPU_COUNT(&allowed_cpus_) < 2) {
    return;
  }
  workers_off_cpu_ = cpu;
  cpu_set_t others = allowed_cpus_;
  CPU_CLR(cpu, &others);
  // Best effort: a failure leaves the scheduler's choice, which is only slower.
  for (std::thread& w : workers_) (void)pthread_setaffinity_np(w.native_handle(), sizeof(others), &others);
}

void WorkerPool::workerLoop(int thread) {
  uint64_t seen = 0;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && generation_ == seen) work_cv_.Wait(&mu_);
      if (stop_) return;
      seen = generation_;
      ++active_;
    }
    const int64_t ran = runItems(thread);
    bool wake = false;
    {
      absl::MutexLock lock(&mu_);
      --active_;
      items_done_ += ran;
      wake = items_done_ == job_items_ || active_ == 0;
    }
    if (wake) done_cv_.SignalAll();
  }
}

int64_t WorkerPool::runItems(int thread) {
  int64_t ran = 0;
  for (;;) {
    const int64_t item = next_item_.fetch_add(1, std::memory_order_relaxed);
    if (item >= job_items_) return ran;
    (*job_fn_)(item, thread);
    ++ran;
  }
}

}  // namespace tandem::engine
