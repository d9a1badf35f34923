#include "tests/agent/faults/delayed_runner.h"

namespace tandem::agent::testing {

DelayedRunner::DelayedRunner(const Clock& clock) : clock_(clock), thread_([this] { run(); }) {}

void DelayedRunner::at(MonoTime due, std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  if (done_) return;
  tasks_.emplace(due, std::move(fn));
  cv_.SignalAll();
}

void DelayedRunner::stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

void DelayedRunner::run() {
  mu_.Lock();
  for (;;) {
    if (!tasks_.empty() && (stop_ || tasks_.begin()->first <= clock_.now())) {
      std::function<void()> fn = std::move(tasks_.begin()->second);
      tasks_.erase(tasks_.begin());
      mu_.Unlock();
      fn();
      mu_.Lock();
      continue;
    }
    if (stop_) break;
    clock_.waitUntil(cv_, mu_, tasks_.empty() ? MonoTime::max() : tasks_.begin()->first);
  }
  done_ = true;
  mu_.Unlock();
}

}  // namespace tandem::agent::testing
