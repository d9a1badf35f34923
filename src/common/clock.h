#pragma once
// An injectable clock. Production code takes a `Clock&` and never calls
// std::chrono::*::now() itself, so tests drive time with FakeClock instead of
// sleeping. Thread-safe: both implementations may be used from any thread.
//
// A thread that waits for a deadline waits through the clock
// (`clock.waitUntil(cv, mu, deadline)`), never with a sleep or a CondVar
// timeout of its own: under FakeClock the wait then ends when a test advances
// the clock past the deadline, with no real time spent.
//
//   absl::MutexLock lock(&mu_);
//   while (!stopping_) {
//     MonoTime next = nextDeadline();           // under mu_
//     if (clock_.waitUntil(cv_, mu_, next)) sweep(clock_.now());
//   }

#include <atomic>
#include <chrono>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace tandem {

using MonoTime = std::chrono::steady_clock::time_point;
using WallTime = std::chrono::system_clock::time_point;
using Duration = std::chrono::nanoseconds;

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic time, for deadlines and durations.
  virtual MonoTime now() const = 0;
  // Wall-clock time, for timestamps shown to people (logs, `created`).
  virtual WallTime wallNow() const = 0;
  // Waits on `cv` (which releases `mu` while waiting, as CondVar::Wait) until
  // it is signalled or this clock reaches `deadline`. Returns true when the
  // deadline has passed. May also return early (false) without a signal, so
  // callers re-check their condition in a loop, as with any condition
  // variable. MonoTime::max() waits for a signal only.
  virtual bool waitUntil(absl::CondVar& cv, absl::Mutex& mu, MonoTime deadline) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;
};

// The real clocks of the machine.
class SystemClock final : public Clock {
 public:
  MonoTime now() const override { return std::chrono::steady_clock::now(); }
  WallTime wallNow() const override { return std::chrono::system_clock::now(); }
  bool waitUntil(absl::CondVar& cv, absl::Mutex& mu, MonoTime deadline) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // A process-wide instance (stateless, so sharing it is safe).
  static SystemClock& instance();
};

// A clock that only moves when told to. Starts at an arbitrary fixed point.
// advance() wakes every thread blocked in waitUntil() so it re-checks its
// deadline at once; a waiter also re-checks at least every kMaxRealWait of
// real time, so a signal that races with the start of a wait is never lost
// for long.
class FakeClock final : public Clock {
 public:
  static constexpr std::chrono::milliseconds kMaxRealWait{5};

  MonoTime now() const override { return MonoTime(Duration(ns_.load())); }
  WallTime wallNow() const override {
    return WallTime(std::chrono::duration_cast<WallTime::duration>(Duration(kWallEpochNs + ns_.load())));
  }
  bool waitUntil(absl::CondVar& cv, absl::Mutex& mu, MonoTime deadline) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void advance(Duration d);
  // Threads blocked in waitUntil() right now. Lets a test wait until a
  // background loop is parked on its deadline before it advances time.
  int numWaiters() const;

 private:
  // 2026-01-01T00:00:00Z, so wall timestamps in tests look plausible.
  static constexpr int64_t kWallEpochNs = 1767225600LL * 1000000000LL;
  std::atomic<int64_t> ns_{1'000'000'000};
  mutable absl::Mutex waitersMu_;
  // A CondVar may appear once per waiting thread; counted for numWaiters().
  mutable absl::flat_hash_map<absl::CondVar*, int> waiters_ ABSL_GUARDED_BY(waitersMu_);
};

}  // namespace tandem
