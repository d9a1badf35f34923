#pragma once
// Prefill leases (DESIGN.md §3 "leases on the source"): a prefill engine keeps
// a finished prompt's KV blocks pinned under a lease id until the decode peer
// that reads them releases the lease, or until the lease expires, so a dead
// peer cannot leak this pool's memory.
//
// A lease holds one BlockManager reference per block, taken over from the
// finishing request; its blocks are neither free nor evictable until the
// lease ends here (release() or expire()), which drops those references.
// Lease ids are the caller's (LeaseSpec::id); one id names one lease at a time.
//
// Time is passed in (expire(now)); the table never reads a clock.
// Not thread-safe: owned by the engine thread.

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/kv/block_manager.h"
#include "src/common/clock.h"

namespace tandem::engine {

class LeaseTable {
 public:
  explicit LeaseTable(BlockManager& blocks) : blocks_(blocks) {}
  ~LeaseTable() { clear(); }
  LeaseTable(const LeaseTable&) = delete;
  LeaseTable& operator=(const LeaseTable&) = delete;

  // Pins `blocks` (taking over one reference each) under `id` until
  // `expires`. Call only if !contains(id): the engine rejects a request whose
  // lease id is held, so a second hold would leak the first lease's blocks.
  void hold(uint64_t id, std::vector<BlockId> blocks, MonoTime expires);
  // Unpins a lease's blocks. Returns whether the lease existed.
  bool release(uint64_t id);
  // Releases every lease whose expiry is at or before `now`; returns how many.
  int expire(MonoTime now);
  // Releases every lease (shutdown).
  void clear();

  bool contains(uint64_t id) const { return leases_.contains(id); }
  int numLeases() const { return static_cast<int>(leases_.size()); }
  // The earliest expiry of a held lease, or nothing when none is held: when
  // an idle owner must wake up to call expire().
  std::optional<MonoTime> nextExpiry() const;
  template <typename Fn>
  void forEachBlock(Fn&& fn) const {
    for (const auto& [id, lease] : leases_) {
      for (BlockId b : lease.blocks) fn(b);
    }
  }

 private:
  struct Lease {
    std::vector<BlockId> blocks;
    MonoTime expires;
  };

  BlockManager& blocks_;
  absl::flat_hash_map<uint64_t, Lease> leases_;
};

}  // namespace tandem::engine
