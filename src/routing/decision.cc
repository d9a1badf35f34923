#include "src/routing/decision.h"

#include <cstdio>

#include "src/common/strings.h"

namespace tandem::routing {

std::string_view routePathName(RoutePath p) {
  switch (p) {
    case RoutePath::kDirect:
      return "direct";
    case RoutePath::kDisagg:
      return "disagg";
  }
  return "unknown";
}

std::string_view decisionReasonName(DecisionReason r) {
  switch (r) {
    case DecisionReason::kSticky:
      return "sticky";
    case DecisionReason::kScored:
      return "scored";
    case DecisionReason::kLeastLoaded:
      return "least_loaded";
    case DecisionReason::kMigrated:
      return "migrated";
    case DecisionReason::kNoneFree:
      return "none_free";
    case DecisionReason::kBaseline:
      return "baseline";
  }
  return "unknown";
}

std::string describeDecision(const Decision& d) {
  char score[32];
  std::snprintf(score, sizeof(score), "%.3g", d.score);
  return strCat("decode=", d.decode, " prefill=", d.prefill.value_or("-"), " path=", routePathName(d.path),
                " reason=", decisionReasonName(d.reason), " score=", std::string_view(score),
                " decode_cached=", d.decode_cached_blocks, " prefill_cached=", d.prefill_cached_blocks,
                " reserve=", d.reserve_blocks, " prefill_tokens=", d.prefill_tokens, " feasible=", d.num_feasible);
}

std::string_view noWorkerReasonName(NoWorkerReason r) {
  switch (r) {
    case NoWorkerReason::kNoDecodeWorker:
      return "no_decode_worker";
    case NoWorkerReason::kTooLong:
      return "too_long";
  }
  return "unknown";
}

}  // namespace tandem::routing
