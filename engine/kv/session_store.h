#pragma once
// Session residency: a finished request may leave its KV in the pool under a
// session id, so the next turn of the conversation only computes the appended
// tokens. Resident sessions hold block references (BlockManager refs), so
// their blocks are neither free nor evictable by the prefix cache until the
// session is evicted here.
//
// Eviction order: lowest priority first, then least recently used. The
// engine evicts a few sessions per step to keep a low watermark of available
// blocks, never a long pause inside one step.
// Not thread-safe: owned by the engine thread.

#include <cstdint>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "engine/kv/block_manager.h"
#include "src/common/ids.h"

namespace tandem::engine {

struct ResidentSession {
  // Tokens whose KV is in `blocks` (position i lives in blocks[i / block_size]).
  std::vector<TokenId> tokens;
  std::vector<BlockId> blocks;  // one reference each, owned by the store while resident
  int priority = 0;
};

class SessionStore {
 public:
  explicit SessionStore(BlockManager& blocks) : blocks_(blocks) {}
  ~SessionStore() { clear(); }

  // Makes `session` resident with the given KV, taking over the references in
  // `state.blocks`. A session already resident under the id is replaced (its
  // blocks released).
  void put(const SessionId& id, ResidentSession state);
  // Removes the session and hands its block references to the caller.
  std::optional<ResidentSession> take(const SessionId& id);
  // Evicts the lowest-priority, least recently used session, releasing its
  // blocks. Returns false when none is resident.
  bool evictOne();
  // Drops one session by id (e.g. an explicit API call). Returns whether it existed.
  bool drop(const SessionId& id);
  void clear();

  // Sessions whose residency changed (put, take, drop, eviction) since the
  // last call, each once, for the router's view of this engine
  // (Engine::drainRoutableChanges). Look each up with find() for its state now.
  std::vector<SessionId> drainChanged();

  int numResident() const { return static_cast<int>(sessions_.size()); }
  int numBlocksHeld() const { return num_blocks_held_; }  // references: a block two sessions share counts twice
  // Distinct blocks resident sessions hold (a shared prefix once).
  int numDistinctBlocks() const { return static_cast<int>(holders_.size()); }
  // Of those, the blocks nothing else references (no running sequence, no
  // other holder): what evicting every session would free — the working
  // set's KV beyond the running sequences'. O(distinct blocks).
  int numBlocksOnlySessionsHold() const;
  template <typename Fn>
  void forEachBlock(Fn&& fn) const {
    for (const auto& [id, e] : sessions_) {
      for (BlockId b : e.state.blocks) fn(b);
    }
  }
  bool contains(const SessionId& id) const { return sessions_.contains(id); }
  // The resident state, or null. Valid until the next call that changes the store.
  const ResidentSession* find(const SessionId& id) const {
    auto it = sessions_.find(id);
    return it == sessions_.end() ? nullptr : &it->second.state;
  }

 private:
  struct Entry {
    ResidentSession state;
    uint64_t tick;
  };
  using Key = std::tuple<int, uint64_t, SessionId>;  // (priority, tick, id): begin() is the next victim
  void erase(absl::flat_hash_map<SessionId, Entry>::iterator it);
  void count(const std::vector<BlockId>& blocks, int delta);

  BlockManager& blocks_;
  absl::flat_hash_map<SessionId, Entry> sessions_;
  std::set<Key> order_;
  uint64_t tick_ = 0;
  int num_blocks_held_ = 0;
  absl::flat_hash_map<BlockId, int> holders_;  // sessions holding each block
  absl::flat_hash_set<SessionId> changed_;  // since the last drainChanged()
};

}  // namespace tandem::engine
