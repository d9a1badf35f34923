#include "src/k8s/retry.h"

#include <thread>

#include "src/k8s/errors.h"

namespace tandem::k8s {

absl::Status retryOnConflict(const std::function<absl::Status()>& fn, const RetryOptions& options) {
  Duration delay = options.delay;
  absl::Status last;
  for (int attempt = 0; attempt < std::max(1, options.steps); ++attempt) {
    if (attempt > 0) {
      if (options.sleep)
        options.sleep(delay);
      else
        std::this_thread::sleep_for(delay);
      delay = std::chrono::duration_cast<Duration>(delay * options.factor);
    }
    last = fn();
    if (!isConflict(last)) return last;
  }
  return last;
}

}  // namespace tandem::k8s
