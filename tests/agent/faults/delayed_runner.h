#pragma once
// Runs tasks at a due time on one thread, on an injected clock (the fault
// transport's delays). stop() runs what is still pending at once: a held get
// completion must still be handed on, or its transfer would never end.
// Thread-safe.

#include <functional>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "src/common/clock.h"

namespace tandem::agent::testing {

class DelayedRunner {
 public:
  // `clock` is not owned and must outlive this.
  explicit DelayedRunner(const Clock& clock);
  ~DelayedRunner() { stop(); }

  // Runs `fn` on the runner's thread once the clock reaches `due` (tasks
  // due at the same time run in the order they were added). Ignored after stop().
  void at(MonoTime due, std::function<void()> fn);
  // Runs every pending task now, in order, then joins the thread. Idempotent.
  void stop();

 private:
  void run();

  const Clock& clock_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  std::multimap<MonoTime, std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // the thread drained and left
  std::thread thread_;
};

}  // namespace tandem::agent::testing
