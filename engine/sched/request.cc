#include "engine/sched/request.h"

namespace tandem::engine {

std::string_view finishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kEos:
      return "eos";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kTimeout:
      return "timeout";
    case FinishReason::kPreempted:
      return "preempted";
    case FinishReason::kRejected:
      return "rejected";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

std::string_view rejectReasonName(RejectReason r) {
  switch (r) {
    case RejectReason::kNone:
      return "none";
    case RejectReason::kInvalid:
      return "invalid";
    case RejectReason::kPromptTooLong:
      return "prompt_too_long";
    case RejectReason::kCapacity:
      return "capacity";
    case RejectReason::kQueueFull:
      return "queue_full";
    case RejectReason::kDraining:
      return "draining";
  }
  return "unknown";
}

}  // namespace tandem::engine
