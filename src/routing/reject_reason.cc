#include "src/routing/reject_reason.h"

#include <array>
#include <utility>

namespace tandem::routing {
namespace {

constexpr std::array<std::pair<RejectReason, std::string_view>, 6> kNames = {{
    {RejectReason::kCapacity, "capacity"},
    {RejectReason::kQueueFull, "queue_full"},
    {RejectReason::kDraining, "draining"},
    {RejectReason::kPromptTooLong, "prompt_too_long"},
    {RejectReason::kUnknownPrefill, "unknown_prefill"},
    {RejectReason::kPrefillFailed, "prefill_failed"},
}};

}  // namespace

std::string_view rejectReasonName(RejectReason r) {
  for (const auto& [reason, name] : kNames) {
    if (reason == r) return name;
  }
  return "unknown";
}

std::optional<RejectReason> parseRejectReason(std::string_view name) {
  for (const auto& [reason, n] : kNames) {
    if (n == name) return reason;
  }
  return std::nullopt;
}

}  // namespace tandem::routing
