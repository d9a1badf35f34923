#pragma once
// The headers that carry a router's decision to a decode agent (DESIGN.md
// §2 step 3, docs/routing.md). D honours them; without them D decides
// itself (direct-to-D for a resident session with a short suffix, else its
// own choice of prefill agent).

#include <string_view>

namespace tandem::agent {

// "direct": D computes the uncached suffix itself; "disagg": a prefill agent
// computes the prompt.
inline constexpr std::string_view kRoutePathHeader = "x-tandem-route-path";
// The prefill agent's KV address HOST:PORT (with "disagg"); D refuses one
// outside its set of prefill peers with a 400 (`unknown_prefill_peer`).
inline constexpr std::string_view kPrefillPeerHeader = "x-tandem-prefill-peer";

}  // namespace tandem::agent
