#pragma once
// What a WorkerStreamClient handed to its callbacks, for tests.

#include <vector>

#include "absl/synchronization/mutex.h"
#include "agent/worker_stream_client.h"
#include "tests/testing/wait.h"

namespace tandem::agent::testing {

class StreamRecorder {
 public:
  WorkerStreamCallbacks callbacks() {
    return {.on_snapshot =
                [this](const routing::WorkerSnapshot& s) {
                  absl::MutexLock lock(&mu_);
                  snapshots_.push_back(s);
                },
            .on_delta =
                [this](const routing::WorkerDelta& d) {
                  absl::MutexLock lock(&mu_);
                  deltas_.push_back(d);
                },
            .on_stale =
                [this](bool stale) {
                  absl::MutexLock lock(&mu_);
                  stale_.push_back(stale);
                },
            .on_unresponsive =
                [this](bool unresponsive) {
                  absl::MutexLock lock(&mu_);
                  unresponsive_.push_back(unresponsive);
                }};
  }
  std::vector<routing::WorkerSnapshot> snapshots() const {
    absl::MutexLock lock(&mu_);
    return snapshots_;
  }
  std::vector<routing::WorkerDelta> deltas() const {
    absl::MutexLock lock(&mu_);
    return deltas_;
  }
  std::vector<bool> stale() const {
    absl::MutexLock lock(&mu_);
    return stale_;
  }
  std::vector<bool> unresponsive() const {
    absl::MutexLock lock(&mu_);
    return unresponsive_;
  }
  size_t numSnapshots() const { return snapshots().size(); }
  bool waitForSnapshots(size_t n) const {
    return testutil::waitFor([&] { return numSnapshots() >= n; });
  }
  // Waits for a delta that `pred` accepts.
  template <typename Pred>
  bool waitForDelta(Pred pred) const {
    return testutil::waitFor([&] {
      for (const auto& d : deltas()) {
        if (pred(d)) return true;
      }
      return false;
    });
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<routing::WorkerSnapshot> snapshots_ ABSL_GUARDED_BY(mu_);
  std::vector<routing::WorkerDelta> deltas_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> stale_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> unresponsive_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::agent::testing
