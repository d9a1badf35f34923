#include "engine/kv/lease_table.h"

#include <algorithm>

#include "src/common/check.h"

namespace tandem::engine {

void LeaseTable::hold(uint64_t id, std::vector<BlockId> blocks, MonoTime expires) {
  TANDEM_CHECK(!leases_.contains(id), "a lease id held twice would leak the first lease's blocks");
  leases_.emplace(id, Lease{std::move(blocks), expires});
}

bool LeaseTable::release(uint64_t id) {
  auto it = leases_.find(id);
  if (it == leases_.end()) return false;
  blocks_.releaseAll(it->second.blocks);
  leases_.erase(it);
  return true;
}

int LeaseTable::expire(MonoTime now) {
  std::vector<uint64_t> expired;
  for (const auto& [id, lease] : leases_) {
    if (lease.expires <= now) expired.push_back(id);
  }
  for (uint64_t id : expired) release(id);
  return static_cast<int>(expired.size());
}

void LeaseTable::clear() {
  for (auto& [id, lease] : leases_) blocks_.releaseAll(lease.blocks);
  leases_.clear();
}

std::optional<MonoTime> LeaseTable::nextExpiry() const {
  std::optional<MonoTime> next;
  for (const auto& [id, lease] : leases_) {
    if (!next || lease.expires < *next) next = lease.expires;
  }
  return next;
}

}  // namespace tandem::engine
