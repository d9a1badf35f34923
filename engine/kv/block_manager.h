#pragma once
// Block ids, reference counts and the prefix cache of one engine's KV pool
// (nano-vllm's BlockManager shape). Bytes live in KvStorage; this class only
// decides who holds which block.
//
// Every block is in exactly one of three states:
//   free       ref == 0, no hash                 -> on the free list
//   cached     ref == 0, hash (content known)    -> LRU-evictable, reusable by hash
//   held       ref >= 1 (with or without a hash) -> owned by requests / sessions
// so free + cached + held == total always (checkInvariants()).
//
// A block gets a hash only when it is full and its KV has been computed
// (commit()); from then on it is immutable and may be shared. A block that is
// shared (ref > 1) or hashed must not be written: writers call isWritable()
// and copy-on-write otherwise.
//
// "stored"/"removed" events tell the router which prefixes this engine holds.
// Not thread-safe: owned by the engine thread.

#include <cstdint>
#include <set>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "src/common/check.h"
#include "src/common/ids.h"
#include "src/common/status.h"

namespace tandem::engine {

struct KvEvent {
  enum class Kind { kStored, kRemoved };
  Kind kind;
  BlockHash hash;
};

class BlockManager {
 public:
  explicit BlockManager(int num_blocks);

  int numTotal() const { return static_cast<int>(blocks_.size()); }
  // Blocks that can be handed out now: free plus cached-unreferenced (evictable).
  int numAvailable() const { return static_cast<int>(free_.size() + lru_.size()); }
  int numFree() const { return static_cast<int>(free_.size()); }
  int numCachedEvictable() const { return static_cast<int>(lru_.size()); }

  // How many leading hashes of `hashes` are in the cache. No side effects.
  int matchPrefix(std::span<const BlockHash> hashes) const;

  // True when `hash` is cached and nobody holds it (acquiring it makes it unavailable).
  bool isCachedUnreferenced(BlockHash hash) const {
    auto it = by_hash_.find(hash);
    return it != by_hash_.end() && blocks_[index(it->second)].ref == 0;
  }

  bool canAllocate(int n) const { return n <= numAvailable(); }
  // Takes a block for writing (ref = 1, no hash). Evicts the least recently
  // used cached block when the free list is empty. Call only if canAllocate(1).
  BlockId allocate();
  // Takes n blocks for writing, the same blocks n allocate() calls would take
  // (free list first, then LRU eviction), and appends them to `out` in
  // ascending id order. A sequence's consecutive blocks then sit next to each
  // other in KvStorage wherever the chosen blocks allow, so a KV transfer
  // moves each such run of a layer as one get: n allocate() calls hand out
  // blocks evicted from the LRU in descending order, because releaseAll()
  // caches a sequence tail first. Call only if canAllocate(n).
  void allocateMany(int n, std::vector<BlockId>& out);
  // Takes another reference on the cached block holding `hash` (which must be
  // present: call after matchPrefix()). Returns its id.
  BlockId acquireCached(BlockHash hash);
  // Takes another reference on a held block (sharing, e.g. a session fork).
  void addRef(BlockId id);
  // Drops one reference. At zero the block becomes cached (if hashed) or free.
  void release(BlockId id);
  void releaseAll(std::span<const BlockId> ids);

  // Marks a held, full, computed block as holding `hash`. If another block
  // already holds that hash the cache keeps the existing one and this block
  // stays private (it is freed, not cached, on release). Returns true when
  // this block became the cached copy.
  bool commit(BlockId id, BlockHash hash);

  int refCount(BlockId id) const { return blocks_[index(id)].ref; }
  bool isWritable(BlockId id) const { return blocks_[index(id)].ref == 1 && !blocks_[index(id)].hashed; }

  // Events since the last call, oldest first.
  std::vector<KvEvent> drainEvents();

  // Checks the state partition and the hash index; describes the first violation.
  absl::Status checkInvariants() const;

 private:
  struct Block {
    int ref = 0;
    bool hashed = false;
    BlockHash hash;
    uint64_t lru_tick = 0;  // when it became cached; key in lru_
  };
  size_t index(BlockId id) const {
    TANDEM_CHECK(id.value() >= 0 && static_cast<size_t>(id.value()) < blocks_.size(), "a block id outside the pool");
    return static_cast<size_t>(id.value());
  }
  void evictOne();

  std::vector<Block> blocks_;
  std::vector<BlockId> free_;                        // stack: most recently freed on top
  std::set<std::pair<uint64_t, int32_t>> lru_;       // (tick, block id) of cached blocks, oldest first
  absl::flat_hash_map<BlockHash, BlockId> by_hash_;  // every hashed block, held or cached
  uint64_t tick_ = 0;
  std::vector<KvEvent> events_;
};

}  // namespace tandem::engine
