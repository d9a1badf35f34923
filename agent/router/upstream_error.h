#pragma once
// What the router makes of a decode agent's refusal: D answers with the
// OpenAI error shape whose `code` is one of a fixed set of names
// (openai_api.cc, docs/agent.md). The router maps each name, matched
// exactly, to a routing::RejectReason (never by substring, DESIGN.md §3) and
// decides from that enum alone whether another worker may take the request.
//
// Pure code; thread-safe.

#include <optional>
#include <string_view>

#include "src/routing/reject_reason.h"

namespace tandem::agent {

// D's error `code` -> the routing reason; nullopt for a code that says
// nothing about where the request could go (a client error, "timeout", an
// unknown code): such a response goes back to the client as it is.
std::optional<routing::RejectReason> rejectReasonForCode(std::string_view code);

// Whether another decode worker may serve a request that one refused for
// `reason` before any token was streamed (the router tries once more).
bool retryElsewhere(routing::RejectReason reason);

// The `reason` label of tandem_router_retries_total for a worker that could
// not be reached at all (connection refused or reset before a response).
inline constexpr std::string_view kUnreachableRetryLabel = "unreachable";
// ... and of requests moved off a worker that stopped answering before it started them.
inline constexpr std::string_view kUnresponsiveRetryLabel = "unresponsive";

}  // namespace tandem::agent
