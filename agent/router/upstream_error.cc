#include "agent/router/upstream_error.h"

#include <array>
#include <utility>

namespace tandem::agent {
namespace {

using routing::RejectReason;

// Every code a decode agent sends for a request it did not serve, and what
// it means for routing. Codes of the P/D transfer are the kvproto
// FailureReason names (pd.md): the prefill agent failed, not D.
constexpr std::array<std::pair<std::string_view, RejectReason>, 12> kCodes{{
    {"queue_full", RejectReason::kQueueFull},
    {"draining", RejectReason::kDraining},
    {"kv_capacity_exceeded", RejectReason::kCapacity},
    {"context_length_exceeded", RejectReason::kPromptTooLong},
    {"unknown_prefill_peer", RejectReason::kUnknownPrefill},
    {"prefill_timeout", RejectReason::kPrefillFailed},
    {"transfer_failed", RejectReason::kPrefillFailed},
    {"peer_unhealthy", RejectReason::kPrefillFailed},
    {"lease_expired", RejectReason::kPrefillFailed},
    {"capacity", RejectReason::kPrefillFailed},  // P could not admit the prefill
    {"checksum_mismatch", RejectReason::kPrefillFailed},
    {"preempted", RejectReason::kCapacity},
}};

}  // namespace

std::optional<RejectReason> rejectReasonForCode(std::string_view code) {
  for (const auto& [name, reason] : kCodes) {
    if (name == code) return reason;
  }
  return std::nullopt;
}

bool retryElsewhere(RejectReason reason) {
  switch (reason) {
    case RejectReason::kCapacity:
    case RejectReason::kQueueFull:
    case RejectReason::kDraining:
    case RejectReason::kPrefillFailed:
      return true;
    case RejectReason::kPromptTooLong:   // every D of the model refuses it
    case RejectReason::kUnknownPrefill:  // the router's own configuration is wrong
      return false;
  }
  return false;
}

}  // namespace tandem::agent
