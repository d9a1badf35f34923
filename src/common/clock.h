#pragma once
// An injectable clock. Production code takes a `Clock&` and never calls
// std::chrono::*::now() itself, so tests drive time with FakeClock instead of
// sleeping. Thread-safe: both implementations may be used from any thread.

#include <atomic>
#include <chrono>

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
};

// The real clocks of the machine.
class SystemClock final : public Clock {
 public:
  MonoTime now() const override { return std::chrono::steady_clock::now(); }
  WallTime wallNow() const override { return std::chrono::system_clock::now(); }
  // A process-wide instance (stateless, so sharing it is safe).
  static SystemClock& instance();
};

// A clock that only moves when told to. Starts at an arbitrary fixed point.
class FakeClock final : public Clock {
 public:
  MonoTime now() const override { return MonoTime(Duration(ns_.load())); }
  WallTime wallNow() const override {
    return WallTime(std::chrono::duration_cast<WallTime::duration>(Duration(kWallEpochNs + ns_.load())));
  }
  void advance(Duration d) { ns_.fetch_add(d.count()); }

 private:
  // 2026-01-01T00:00:00Z, so wall timestamps in tests look plausible.
  static constexpr int64_t kWallEpochNs = 1767225600LL * 1000000000LL;
  std::atomic<int64_t> ns_{1'000'000'000};
};

}  // namespace tandem
