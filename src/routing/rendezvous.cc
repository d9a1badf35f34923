#include "src/routing/rendezvous.h"

#include <xxhash.h>

namespace tandem::routing {

uint64_t stableHash(std::string_view s) { return XXH64(s.data(), s.size(), 0); }

uint64_t rendezvousKey(const RouteRequest& request) {
  if (request.session) return stableHash(request.session->value());
  if (!request.prompt_hashes.empty()) return request.prompt_hashes.front().value();
  return 0;
}

uint64_t rendezvousWeight(uint64_t key, uint64_t worker_hash) {
  // splitmix64's finalizer over the pair: a well-mixed, order-dependent combination.
  uint64_t z = key ^ (worker_hash + 0x9e3779b97f4a7c15ULL + (key << 6) + (key >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace tandem::routing
