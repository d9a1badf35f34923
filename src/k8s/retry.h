#pragma once
// Retrying read-modify-write cycles that lose optimistic-concurrency races.
//
//   absl::Status s = retryOnConflict([&]() -> absl::Status {
//     TANDEM_ASSIGN_OR_RETURN(auto obj, client.get(ref, ns, name));   // fresh read each time
//     obj["spec"]["replicas"] = 3;
//     return client.update(ref, ns, obj).status();
//   });
//
// `fn` runs again only when it returned a Conflict (409, K8sErrorReason::
// kConflict); any other result, OK included, is returned at once. After
// `steps` attempts the last Conflict is returned. Between attempts it calls
// `sleep` with delay, delay*factor, ... (client-go's DefaultRetry: 5 steps,
// 10 ms, factor 1).

#include <functional>

#include "absl/status/status.h"
#include "src/common/clock.h"

namespace tandem::k8s {

struct RetryOptions {
  int steps = 5;
  Duration delay = std::chrono::milliseconds(10);
  double factor = 1.0;
  // How to wait; default: std::this_thread::sleep_for. Tests pass a no-op.
  std::function<void(Duration)> sleep;
};

absl::Status retryOnConflict(const std::function<absl::Status()>& fn, const RetryOptions& options = {});

}  // namespace tandem::k8s
