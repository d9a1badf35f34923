#pragma once
// A controller work queue, as client-go's rate-limited delaying queue.
//
//   queue.add(key);                 // de-duplicated while waiting
//   while (auto key = queue.get()) {  // nullopt after shutDown()
//     absl::Status s = reconcile(*key);
//     if (!s.ok()) queue.addRateLimited(*key);   // per-key exponential backoff
//     else { queue.forget(*key); if (requeue) queue.addAfter(*key, 30s); }
//     queue.done(*key);
//   }
//
// Invariants:
//  - a key is at most once in the ready queue (adds while it waits merge);
//  - a key is processed by one worker at a time: added again while being
//    processed, it goes back to the queue at done(), not before;
//  - addRateLimited() waits max(per-key backoff, overall token bucket):
//    backoff = baseDelay * 2^failures capped at maxDelay (reset by forget());
//    the bucket refills at `qps` up to `burst` tokens.
// Time comes from the injected Clock; nothing here sleeps. A blocked get()
// re-reads the clock at least every kMaxWait, so a FakeClock also works with
// blocking consumers.
//
// Thread-safety: every method may be called from any thread.

#include <deque>
#include <optional>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "src/common/clock.h"

namespace tandem::k8s {

// Per-key exponential backoff. Not thread-safe (the queue locks around it).
class ItemBackoff {
 public:
  ItemBackoff(Duration baseDelay, Duration maxDelay) : baseDelay_(baseDelay), maxDelay_(maxDelay) {}
  // The delay for this failure of `key`; counts the failure.
  Duration next(const std::string& key);
  void forget(const std::string& key) { failures_.erase(key); }
  int numFailures(const std::string& key) const;

 private:
  const Duration baseDelay_;
  const Duration maxDelay_;
  absl::flat_hash_map<std::string, int> failures_;
};

// A token bucket (golang.org/x/time/rate semantics: a reservation may drive
// the balance negative and is then served later). Not thread-safe.
class TokenBucket {
 public:
  TokenBucket(double qps, int burst, MonoTime now) : qps_(qps), burst_(burst), tokens_(burst), last_(now) {}
  // Takes one token; returns how long until it is really available (0 if now).
  Duration reserve(MonoTime now);

 private:
  const double qps_;
  const int burst_;
  double tokens_;
  MonoTime last_;
};

struct WorkQueueOptions {
  Duration baseDelay = std::chrono::milliseconds(5);
  Duration maxDelay = std::chrono::seconds(1000);
  double qps = 10;
  int burst = 100;
  const Clock* clock = nullptr;  // not owned; default SystemClock::instance()
};

class WorkQueue {
 public:
  explicit WorkQueue(WorkQueueOptions options = {});
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Marks `key` as needing processing. Ignored after shutDown().
  void add(const std::string& key);
  // add() once `delay` has passed; an earlier pending time for the key wins.
  void addAfter(const std::string& key, Duration delay);
  // addAfter() with the rate limiters' delay (counts a failure of `key`).
  void addRateLimited(const std::string& key);
  // Resets `key`'s backoff (call after it succeeded).
  void forget(const std::string& key);
  int numRequeues(const std::string& key) const;

  // Blocks until a key is ready; nullopt once shut down (remaining ready keys
  // are still handed out first). The caller must call done(key).
  std::optional<std::string> get();
  // As get() but returns nullopt at once when no key is ready now.
  std::optional<std::string> tryGet();
  // Ends processing of `key`; re-queues it if it was added meanwhile.
  void done(const std::string& key);

  // Wakes all get()s; later adds are dropped.
  void shutDown();
  bool shuttingDown() const;
  // Keys ready now (not being processed, not delayed).
  size_t len();
  // Keys waiting for their addAfter() time.
  size_t numDelayed() const;

  static constexpr Duration kMaxWait = std::chrono::milliseconds(50);

 private:
  void addLocked(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves delayed keys whose time came into the ready queue.
  void promoteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<std::string> popLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock& clock_;
  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> dirty_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> processing_ ABSL_GUARDED_BY(mu_);
  // Delayed keys: readyAt per key, and the same ordered by time.
  absl::flat_hash_map<std::string, MonoTime> delayedAt_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<MonoTime, std::string>> delayed_ ABSL_GUARDED_BY(mu_);
  ItemBackoff backoff_ ABSL_GUARDED_BY(mu_);
  TokenBucket bucket_ ABSL_GUARDED_BY(mu_);
  bool shuttingDown_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tandem::k8s
