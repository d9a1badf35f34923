// Engine::drainRoutableChanges: the engine's side of the worker-state stream
// (routable_state.h), apart from engine.cc's step.

#include "engine/engine.h"
#include "src/common/block_hash.h"

namespace tandem::engine {

RoutableChanges Engine::drainRoutableChanges() {
  RoutableChanges out;
  out.blocks = blocks_.drainEvents();
  for (SessionId& id : sessions_.drainChanged()) {
    SessionResidency r{.id = std::move(id)};
    if (const ResidentSession* s = sessions_.find(r.id)) {
      r.resident = true;
      r.num_tokens = static_cast<int64_t>(s->tokens.size());
      r.hashes = computeBlockHashes(s->tokens, options_.block_size, blockHashRoot());
    }
    out.sessions.push_back(std::move(r));
  }
  return out;
}

}  // namespace tandem::engine
