#include "src/http/timer_queue.h"

#include "src/common/log.h"

namespace tandem::http {

TimerQueue::TimerQueue(const Clock& clock) : clock_(clock), thread_([this] { loop(); }) {}

TimerQueue::~TimerQueue() { stop(); }

TimerQueue::Id TimerQueue::schedule(MonoTime when, std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return 0;
  bool earliest = timers_.empty() || when < timers_.begin()->first.first;
  Id id = nextId_++;
  timers_.emplace(std::pair{when, id}, std::move(fn));
  deadlines_.emplace(id, when);
  if (earliest) changed_.Signal();
  return id;
}

void TimerQueue::cancel(Id id) {
  std::function<void()> dropped;  // destroyed after the lock: it may hold the last reference to anything
  absl::MutexLock lock(&mu_);
  auto it = deadlines_.find(id);
  if (it == deadlines_.end()) return;
  auto timer = timers_.find(std::pair{it->second, id});
  dropped = std::move(timer->second);
  timers_.erase(timer);
  deadlines_.erase(it);
}

void TimerQueue::stop() {
  std::map<std::pair<MonoTime, Id>, std::function<void()>> dropped;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    dropped.swap(timers_);
    deadlines_.clear();
    changed_.Signal();
  }
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void TimerQueue::loop() {
  mu_.Lock();
  while (!stopping_) {
    MonoTime next = timers_.empty() ? MonoTime::max() : timers_.begin()->first.first;
    if (next > clock_.now()) {
      clock_.waitUntil(changed_, mu_, next);
      continue;
    }
    auto first = timers_.begin();
    std::function<void()> fn = std::move(first->second);
    deadlines_.erase(first->first.second);
    timers_.erase(first);
    mu_.Unlock();
    try {
      fn();
    } catch (const std::exception& e) {
      Logger("http").error("timer callback threw", {{"what", e.what()}});
    } catch (...) {
      Logger("http").error("timer callback threw a non-std exception");
    }
    fn = nullptr;  // whatever it held is released outside the lock
    mu_.Lock();
  }
  mu_.Unlock();
}

}  // namespace tandem::http
