#pragma once
// Wakes one thread that waits for a deadline (the Router's timer thread)
// early. notify() may be called from any thread, also while holding other
// locks: its mutex is a leaf, held only inside these two calls. Thread-safe.

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "src/common/clock.h"

namespace tandem::apiserver {

class Wakeup {
 public:
  void notify() {
    absl::MutexLock lock(&mu_);
    pending_ = true;
    cv_.Signal();
  }

  // Returns once notify() was called (since the last return) or `clock`
  // reached `deadline`.
  void waitUntil(const Clock& clock, MonoTime deadline) {
    absl::MutexLock lock(&mu_);
    while (!pending_ && !clock.waitUntil(cv_, mu_, deadline)) {
    }
    pending_ = false;
  }

 private:
  absl::Mutex mu_;
  absl::CondVar cv_;
  bool pending_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tandem::apiserver
