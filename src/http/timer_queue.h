#pragma once
// Deadlines on an injected Clock: one thread that runs each scheduled
// callback once the clock reaches its time. The server uses it for request
// deadlines, stream keepalives and (Beast) connection read and idle limits,
// so a test that injects a FakeClock drives all of them by advancing it.
//
//   TimerQueue timers(clock);                       // starts the thread
//   auto id = timers.schedule(clock.now() + 5s, [] { ... });
//   timers.cancel(id);                              // before it fired: it never runs
//
// Callbacks run on the queue's thread, one at a time, in deadline order
// (equal deadlines in scheduling order), without the queue's lock held: they
// may schedule and cancel, and must be short. Thread-safe.

#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "src/common/clock.h"

namespace tandem::http {

class TimerQueue {
 public:
  // 0 is never a timer's id.
  using Id = uint64_t;

  // `clock` is not owned and must outlive the queue.
  explicit TimerQueue(const Clock& clock);
  // stop().
  ~TimerQueue();
  TimerQueue(const TimerQueue&) = delete;
  TimerQueue& operator=(const TimerQueue&) = delete;

  const Clock& clock() const { return clock_; }

  // Runs `fn` once the clock reaches `when` (at once if it has). Returns 0,
  // and never runs `fn`, once stop() began.
  Id schedule(MonoTime when, std::function<void()> fn);
  // Forgets timer `id` if it has not started to run; a no-op otherwise.
  void cancel(Id id);
  // Drops the timers not yet run and joins the thread. Idempotent; never
  // call it from a callback.
  void stop();

 private:
  void loop();

  const Clock& clock_;
  absl::Mutex mu_;
  absl::CondVar changed_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Id nextId_ ABSL_GUARDED_BY(mu_) = 1;
  // Keyed by (deadline, id): ordered by time, then by scheduling order.
  std::map<std::pair<MonoTime, Id>, std::function<void()>> timers_ ABSL_GUARDED_BY(mu_);
  // Each id's deadline, so cancel(id) finds its entry.
  std::map<Id, MonoTime> deadlines_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace tandem::http
