#pragma once
// Which workers hold which block hashes: the index behind
// ClusterState::prefixOverlap. A worker holds a hash while it is in its
// prefix cache or in any of its resident sessions; the index counts the
// references per worker so that the two kinds of holding can come and go
// independently, and keeps hash -> holders for the overlap search.
//
// Not thread-safe; pure.

#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "src/common/ids.h"

namespace tandem::routing {

class BlockIndex {
 public:
  using Holders = absl::InlinedVector<uint32_t, 4>;  // worker slots, unordered, no duplicates

  // Per-worker references to hashes. kCachedBit marks "in the prefix cache";
  // the low bits count the resident sessions that contain it.
  using WorkerRefs = absl::flat_hash_map<BlockHash, uint32_t>;
  static constexpr uint32_t kCachedBit = 1u << 31;

  void addCached(uint32_t slot, WorkerRefs& refs, std::span<const BlockHash> hashes);
  void removeCached(uint32_t slot, WorkerRefs& refs, std::span<const BlockHash> hashes);
  // Return how many hashes became held (add) or stopped being held (remove)
  // by some resident session of the worker: the change in its distinct
  // session-held blocks.
  int64_t addSession(uint32_t slot, WorkerRefs& refs, std::span<const BlockHash> hashes);
  int64_t removeSession(uint32_t slot, WorkerRefs& refs, std::span<const BlockHash> hashes);
  // Drops every hash the worker holds.
  void clearWorker(uint32_t slot, WorkerRefs& refs);

  // Workers holding `hash`; nullptr when none.
  const Holders* holders(BlockHash hash) const;
  size_t numHashes() const { return holders_.size(); }

 private:
  void link(uint32_t slot, BlockHash hash);
  void unlink(uint32_t slot, BlockHash hash);
  absl::flat_hash_map<BlockHash, Holders> holders_;
};

}  // namespace tandem::routing
