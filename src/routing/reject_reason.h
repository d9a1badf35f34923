#pragma once
// Why a decode agent refused a request the router sent it: an enum end to end
// (DESIGN.md §3, typed failures). The router's retry and migration act on
// these values; text is only for logs and metric labels, and parsing accepts
// exactly the names below, never a substring.

#include <cstdint>
#include <optional>
#include <string_view>

namespace tandem::routing {

enum class RejectReason : uint8_t {
  kCapacity,        // D cannot reserve the request's blocks now (counts toward migrating the session)
  kQueueFull,       // D's waiting queue is full: try another worker
  kDraining,        // D is shutting down: takes no new work
  kPromptTooLong,   // prompt + expected output exceed D's context: another D of the model refuses it too
  kUnknownPrefill,  // the decision named a P outside D's pool
  kPrefillFailed,   // the named P failed (timeout, transfer): P's fault, not D's
};

// "capacity", "queue_full", "draining", "prompt_too_long", "unknown_prefill", "prefill_failed".
std::string_view rejectReasonName(RejectReason r);
// The reason whose name is exactly `name`; nullopt for anything else.
std::optional<RejectReason> parseRejectReason(std::string_view name);

}  // namespace tandem::routing
