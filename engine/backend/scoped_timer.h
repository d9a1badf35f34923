#pragma once
// Adds the wall time of its scope to a BackendStats bucket. It reads the
// machine's clock, not an injected Clock, on purpose: it measures how long
// the kernels themselves take (BackendStats, for `./tandem bench engine`),
// which only real time can say, and nothing the engine decides depends on it.

#include <chrono>

namespace tandem::engine {

class ScopedTimer {
 public:
  explicit ScopedTimer(std::chrono::nanoseconds* total) : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~ScopedTimer() { *total_ += std::chrono::steady_clock::now() - start_; }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  std::chrono::nanoseconds* total_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace tandem::engine
