#pragma once
// What a policy decides for one request: the decode worker that owns it, the
// prefill worker that computes its prompt (disaggregated path), and why, so
// that logs and metrics can say what happened. Or, when no worker can take
// it, a typed NoWorker.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "src/routing/worker_ref.h"

namespace tandem::routing {

enum class RoutePath : uint8_t {
  kDirect,  // D computes the uncached suffix itself: no P, no KV transfer
  kDisagg,  // a P computes the prompt, D pulls its KV
};
std::string_view routePathName(RoutePath p);  // "direct", "disagg" (the metrics' `path` label)

// Which rule picked the decode worker.
enum class DecisionReason : uint8_t {
  kSticky,       // the session is resident on it and it scored best
  kScored,       // best score (prefix overlap, load-floor bonus, queue penalty)
  kLeastLoaded,  // a miss (no overlap anywhere): the least-loaded feasible worker
  kMigrated,     // the session was moved off a worker that kept refusing it for capacity
  kNoneFree,     // no worker has the free blocks now; the least-loaded one that can ever hold it queues it
  kBaseline,     // a baseline policy (round robin, least load, ...) that does not score
};
std::string_view decisionReasonName(DecisionReason r);

struct Decision {
  std::string decode;  // the decode worker's name
  WorkerRef decode_ref;
  std::optional<std::string> prefill;  // set iff path == kDisagg
  std::optional<WorkerRef> prefill_ref;
  RoutePath path = RoutePath::kDisagg;
  DecisionReason reason = DecisionReason::kScored;
  // The router's reservation, counted in its in-flight view (InFlight) until
  // D has taken the request into its own accounting.
  int64_t reserve_blocks = 0;  // on D: blocks for prompt minus cached plus expected output
  int64_t prefill_tokens = 0;  // on the P (or on D for kDirect): prompt tokens not cached there
  // For logs: what the chosen workers already hold, and the winning score.
  int64_t decode_cached_blocks = 0;
  int64_t prefill_cached_blocks = 0;
  double score = 0;
  int num_feasible = 0;  // decode workers that passed feasibility
};

// One log line's worth: "decode=d1 prefill=p0 path=disagg reason=scored
// score=1.25 decode_cached=40 prefill_cached=0 reserve=14 prefill_tokens=650 feasible=3".
std::string describeDecision(const Decision& d);

// Why no worker was chosen. Running out of workers is a normal result, not an error.
enum class NoWorkerReason : uint8_t {
  kNoDecodeWorker,  // no healthy, non-draining decode worker at all (a 503)
  kTooLong,         // prompt + output exceed every worker's context or KV pool (a 400)
};
std::string_view noWorkerReasonName(NoWorkerReason r);

struct NoWorker {
  NoWorkerReason reason = NoWorkerReason::kNoDecodeWorker;
};

using RouteResult = std::variant<Decision, NoWorker>;

}  // namespace tandem::routing
