#pragma once
// A get's completion, waited for in transport tests.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>

#include "absl/status/status.h"

namespace tandem::transport {

// Blocks until a get's completion ran; records its status and how often it ran.
struct GetWaiter {
  std::mutex mu;
  std::condition_variable cv;
  int calls = 0;
  absl::Status status;
  std::function<void(absl::Status)> callback() {
    return [this](absl::Status s) {
      std::lock_guard l(mu);
      ++calls;
      status = s;
      cv.notify_all();
    };
  }
  absl::Status wait() {
    std::unique_lock l(mu);
    cv.wait_for(l, std::chrono::seconds(30), [&] { return calls > 0; });
    return calls > 0 ? status : absl::DeadlineExceededError("get never completed");
  }
};

}  // namespace tandem::transport
