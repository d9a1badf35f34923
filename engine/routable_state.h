#pragma once
// What an engine tells routers about itself (the worker-state stream,
// docs/routing.md): which prefixes its prefix cache knows and which
// sessions are resident, as changes since the last look. The agent drains
// them on the engine's thread after every step (EngineLoop's observer) and
// publishes them; the engine knows nothing of the stream.
//
// Hashes are the engine's own block-hash chain (src/common/block_hash.h)
// rooted at Engine::blockHashRoot(). Plain data.

#include <cstdint>
#include <vector>

#include "engine/kv/block_manager.h"
#include "src/common/ids.h"

namespace tandem::engine {

// One session whose residency changed, as it is now.
struct SessionResidency {
  SessionId id;
  bool resident = false;          // false: evicted, dropped, or taken by a running turn
  std::vector<BlockHash> hashes;  // resident: the hashes of its full blocks, in order
  int64_t num_tokens = 0;         // resident: tokens whose KV it holds (the last block may be partial)
};

struct RoutableChanges {
  std::vector<KvEvent> blocks;             // prefix cache: stored / removed, oldest first
  std::vector<SessionResidency> sessions;  // each changed session once, in no particular order
  bool empty() const { return blocks.empty() && sessions.empty(); }
};

}  // namespace tandem::engine
