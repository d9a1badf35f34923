#pragma once
// The KV cache of one simulated worker, in blocks (trace.h: 512 tokens).
//
// Every block the worker holds has a hash (the request's chained hash ids)
// and a reference count: one reference per running request whose prompt
// uses it and per resident session that holds it. A block nobody references
// stays cached (a prefix-cache hit for a later request) until it is evicted,
// least recently used first. Blocks of output tokens have no hash: they are
// counted per request ("private"), not shared.
//
//   capacity = free + cached-unreferenced + referenced + private
//   freeBlocks() = free + cached-unreferenced  (what WorkerLoad.free_blocks reports)
//
// A request is admitted only if its reservation fits now (DESIGN.md §3):
// the prompt blocks it does not find here plus its output blocks. To make
// room the worker evicts unreferenced cached blocks first, then whole
// resident sessions, least recently used first, as the engine's session
// store does (engine/kv/session_store.h); never a running request's blocks.
// A request with a session takes that session's residency over when it is
// admitted here, and leaves its KV resident under the session when it
// finishes; without a session its blocks go back to the prefix cache.
//
// Changes are recorded as worker-state delta bodies (worker_state.h) for the
// caller to publish, in the order they happened. Not thread-safe; one owner.

#include <cstdint>
#include <list>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "src/common/ids.h"
#include "src/routing/worker_state.h"

namespace tandem::replay {

// What a request asks of a worker's KV.
struct KvRequest {
  std::optional<SessionId> session;
  std::span<const BlockHash> prompt;  // the prompt's chained block hashes, one per block
  // With a session: the hashes of the full blocks of prompt + output, which
  // stay resident when it finishes (the answer's blocks are known from the
  // session's next turn, replay_input.h); a prefix of `prompt` otherwise.
  std::span<const BlockHash> resident;
  int64_t total_blocks = 0;  // its reservation: ceil((prompt + output tokens) / block size)
  int64_t total_tokens = 0;  // prompt + output tokens (what stays resident)
};

class WorkerKv {
 public:
  explicit WorkerKv(int64_t capacity_blocks);
  // Blocks hold iterators into the LRU list: a copy would point into the
  // original's. Moving keeps them valid.
  WorkerKv(const WorkerKv&) = delete;
  WorkerKv& operator=(const WorkerKv&) = delete;
  WorkerKv(WorkerKv&&) noexcept = default;
  WorkerKv& operator=(WorkerKv&&) noexcept = default;

  int64_t capacityBlocks() const { return capacity_; }
  // Free plus cached blocks nobody references (evictable without harm to a running request).
  int64_t freeBlocks() const { return capacity_ - used_ + static_cast<int64_t>(lru_.size()); }
  // How many leading blocks of `prompt` this worker holds (cached or referenced).
  int64_t prefixHits(std::span<const BlockHash> prompt) const;
  bool isResident(const SessionId& session) const { return sessions_.contains(session); }
  int64_t numResidentSessions() const { return static_cast<int64_t>(sessions_.size()); }
  // Blocks `session` holds here (0: not resident).
  int64_t residentBlocks(const SessionId& session) const {
    auto it = sessions_.find(session);
    return it == sessions_.end() ? 0 : static_cast<int64_t>(it->second.hashes.size()) + it->second.private_blocks;
  }

  // Admits `request` if its reservation fits now, evicting as the header
  // says; returns the prompt blocks it found here (its prefix hits). nullopt:
  // it does not fit now (wait for a running request to finish). Call only if
  // request.total_blocks <= capacityBlocks().
  std::optional<int64_t> tryAdmit(const KvRequest& request);
  // The prompt of an admitted request was computed: its new blocks become
  // known to routers (BlocksStored).
  void publishComputed(const KvRequest& request);
  // An admitted request finished: its KV (request.resident and the rest of
  // its reservation) stays resident under its session, or its blocks return
  // to the prefix cache.
  void finish(const KvRequest& request);

  // Delta bodies recorded since the last call, oldest first.
  std::vector<routing::WorkerDeltaBody> takeEvents();

 private:
  struct Block {
    int64_t refs = 0;
    std::list<BlockHash>::iterator lru;  // valid iff refs == 0
    bool published = false;              // routers were told (BlocksStored)
  };
  struct Session {
    std::vector<BlockHash> hashes;  // one reference each
    int64_t private_blocks = 0;
    uint64_t tick = 0;  // key in by_age_
  };

  void ref(BlockHash hash);
  // Refs `hash`, adding its block (published at once) if it is not here.
  void refOrAdd(BlockHash hash);
  // Drops one reference of each hash; blocks left unreferenced become the
  // most recently used cached blocks, deepest first out (so a chain is
  // evicted from its end and stays a usable prefix).
  void unrefChain(std::span<const BlockHash> hashes);
  void evictCachedBlock();
  void evictSession(const SessionId& session);
  // Blocks `request` would add to the pool if admitted now, and what
  // admitting it can reclaim without evicting another session.
  int64_t newBlocksNeeded(const KvRequest& request) const;
  int64_t reclaimableFor(const KvRequest& request) const;

  int64_t capacity_;
  int64_t used_ = 0;              // hashed blocks held in any state + private blocks
  int64_t running_reserved_ = 0;  // total_blocks of admitted, unfinished requests
  absl::flat_hash_map<BlockHash, Block> blocks_;
  std::list<BlockHash> lru_;  // unreferenced blocks; front = most recently used
  absl::flat_hash_map<SessionId, Session> sessions_;
  std::map<uint64_t, SessionId> by_age_;  // resident sessions, least recently used first
  uint64_t next_tick_ = 0;
  std::vector<routing::WorkerDeltaBody> events_;
};

}  // namespace tandem::replay
