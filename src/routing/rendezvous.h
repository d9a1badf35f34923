#pragma once
// Rendezvous (highest random weight) hashing: among equally good workers, a
// key (a session id) picks the one whose mix(key, worker) is highest. Every
// router replica that sees the same candidates picks the same worker, with
// no shared state, and removing a worker moves only the keys it owned.

#include <cstdint>
#include <string_view>

#include "src/routing/route_request.h"

namespace tandem::routing {

// Stable 64-bit hash of a name or id (XXH64, seed 0).
uint64_t stableHash(std::string_view s);
// The key a request's ties are broken by: its session id's hash, else its
// first prompt block hash, else 0.
uint64_t rendezvousKey(const RouteRequest& request);
// Weight of `worker_hash` for `key`; higher wins.
uint64_t rendezvousWeight(uint64_t key, uint64_t worker_hash);

}  // namespace tandem::routing
