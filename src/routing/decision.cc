#include "src/routing/decision.h"

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
