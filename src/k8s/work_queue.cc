#include "src/k8s/work_queue.h"

#include <algorithm>
#include <cmath>

#include "absl/time/time.h"

namespace tandem::k8s {

Duration ItemBackoff::next(const std::string& key) {
  int failures = failures_[key]++;
  // 2^failures overflows long before the cap matters: compare in double.
  double delay = static_cast<double>(baseDelay_.count()) * std::pow(2.0, std::min(failures, 62));
  if (delay >= static_cast<double>(maxDelay_.count())) return maxDelay_;
  return Duration(static_cast<int64_t>(delay));
}

int ItemBackoff::numFailures(const std::string& key) const {
  auto it = failures_.find(key);
  return it == failures_.end() ? 0 : it->second;
}

Duration TokenBucket::reserve(MonoTime now) {
  if (now > last_) {
    double elapsed = std::chrono::duration<double>(now - last_).count();
    tokens_ = std::min(static_cast<double>(burst_), tokens_ + elapsed * qps_);
    last_ = now;
  }
  tokens_ -= 1;
  if (tokens_ >= 0) return Duration::zero();
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(-tokens_ / qps_));
}

WorkQueue::WorkQueue(WorkQueueOptions options)
    : clock_(options.clock ? *options.clock : SystemClock::instance()),
      backoff_(options.baseDelay, options.maxDelay),
      bucket_(options.qps, options.burst, clock_.now()) {}

void WorkQueue::add(const std::string& key) {
  absl::MutexLock lock(&mu_);
  addLocked(key);
}

void WorkQueue::addLocked(const std::string& key) {
  if (shuttingDown_ || dirty_.contains(key)) return;
  dirty_.insert(key);
  if (processing_.contains(key)) return;  // done() re-queues it
  queue_.push_back(key);
  cv_.Signal();
}

void WorkQueue::addAfter(const std::string& key, Duration delay) {
  absl::MutexLock lock(&mu_);
  if (shuttingDown_) return;
  if (delay <= Duration::zero()) {
    addLocked(key);
    return;
  }
  MonoTime at = clock_.now() + delay;
  auto it = delayedAt_.find(key);
  if (it != delayedAt_.end()) {
    if (it->second <= at) return;
    delayed_.erase({it->second, key});
    it->second = at;
  } else {
    delayedAt_.emplace(key, at);
  }
  delayed_.insert({at, key});
  cv_.Signal();  // a waiting get() may need a shorter wait
}

void WorkQueue::addRateLimited(const std::string& key) {
  Duration delay;
  {
    absl::MutexLock lock(&mu_);
    delay = std::max(backoff_.next(key), bucket_.reserve(clock_.now()));
  }
  addAfter(key, delay);
}

void WorkQueue::forget(const std::string& key) {
  absl::MutexLock lock(&mu_);
  backoff_.forget(key);
}

int WorkQueue::numRequeues(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  return backoff_.numFailures(key);
}

void WorkQueue::promoteLocked() {
  MonoTime now = clock_.now();
  while (!delayed_.empty() && delayed_.begin()->first <= now) {
    std::string key = delayed_.begin()->second;
    delayed_.erase(delayed_.begin());
    delayedAt_.erase(key);
    addLocked(key);
  }
}

std::optional<std::string> WorkQueue::popLocked() {
  if (queue_.empty()) return std::nullopt;
  std::string key = std::move(queue_.front());
  queue_.pop_front();
  processing_.insert(key);
  dirty_.erase(key);
  return key;
}

std::optional<std::string> WorkQueue::get() {
  absl::MutexLock lock(&mu_);
  while (true) {
    promoteLocked();
    if (!queue_.empty()) return popLocked();
    if (shuttingDown_) return std::nullopt;
    Duration wait = kMaxWait;
    if (!delayed_.empty()) wait = std::min(wait, delayed_.begin()->first - clock_.now());
    cv_.WaitWithTimeout(&mu_, absl::FromChrono(std::max(wait, Duration(std::chrono::microseconds(100)))));
  }
}

std::optional<std::string> WorkQueue::tryGet() {
  absl::MutexLock lock(&mu_);
  promoteLocked();
  return popLocked();
}

void WorkQueue::done(const std::string& key) {
  absl::MutexLock lock(&mu_);
  processing_.erase(key);
  if (dirty_.contains(key)) {
    queue_.push_back(key);
    cv_.Signal();
  }
}

void WorkQueue::shutDown() {
  absl::MutexLock lock(&mu_);
  shuttingDown_ = true;
  delayed_.clear();
  delayedAt_.clear();
  cv_.SignalAll();
}

bool WorkQueue::shuttingDown() const {
  absl::MutexLock lock(&mu_);
  return shuttingDown_;
}

size_t WorkQueue::len() {
  absl::MutexLock lock(&mu_);
  promoteLocked();
  return queue_.size();
}

size_t WorkQueue::numDelayed() const {
  absl::MutexLock lock(&mu_);
  return delayed_.size();
}

}  // namespace tandem::k8s
