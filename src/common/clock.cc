#include "src/common/clock.h"

#include "absl/time/time.h"

namespace tandem {

SystemClock& SystemClock::instance() {
  static SystemClock clock;
  return clock;
}

bool SystemClock::waitUntil(absl::CondVar& cv, absl::Mutex& mu, MonoTime deadline) const {
  if (deadline == MonoTime::max()) {
    cv.Wait(&mu);
    return false;
  }
  MonoTime now = this->now();
  if (now >= deadline) return true;
  cv.WaitWithTimeout(&mu, absl::FromChrono(deadline - now));
  return this->now() >= deadline;
}

bool FakeClock::waitUntil(absl::CondVar& cv, absl::Mutex& mu, MonoTime deadline) const {
  if (now() >= deadline) return true;
  {
    absl::MutexLock lock(&waitersMu_);
    ++waiters_[&cv];
  }
  cv.WaitWithTimeout(&mu, absl::FromChrono(kMaxRealWait));
  {
    absl::MutexLock lock(&waitersMu_);
    auto it = waiters_.find(&cv);
    if (--it->second == 0) waiters_.erase(it);
  }
  return now() >= deadline;
}

void FakeClock::advance(Duration d) {
  ns_.fetch_add(d.count());
  absl::MutexLock lock(&waitersMu_);
  for (auto& [cv, count] : waiters_) cv->SignalAll();
}

int FakeClock::numWaiters() const {
  absl::MutexLock lock(&waitersMu_);
  int n = 0;
  for (const auto& [cv, count] : waiters_) n += count;
  return n;
}

}  // namespace tandem
