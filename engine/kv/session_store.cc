#include "engine/kv/session_store.h"

namespace tandem::engine {

void SessionStore::put(const SessionId& id, ResidentSession state) {
  if (auto it = sessions_.find(id); it != sessions_.end()) {
    blocks_.releaseAll(it->second.state.blocks);
    erase(it);
  }
  changed_.insert(id);
  uint64_t tick = ++tick_;
  count(state.blocks, +1);
  order_.insert({state.priority, tick, id});
  sessions_.emplace(id, Entry{std::move(state), tick});
}

std::optional<ResidentSession> SessionStore::take(const SessionId& id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return std::nullopt;
  changed_.insert(id);
  ResidentSession out = std::move(it->second.state);
  count(out.blocks, -1);
  order_.erase({out.priority, it->second.tick, it->first});
  sessions_.erase(it);
  return out;
}

bool SessionStore::evictOne() {
  if (order_.empty()) return false;
  return drop(std::get<2>(*order_.begin()));
}

bool SessionStore::drop(const SessionId& id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return false;
  changed_.insert(id);
  blocks_.releaseAll(it->second.state.blocks);
  erase(it);
  return true;
}

void SessionStore::clear() {
  while (evictOne()) {
  }
}

std::vector<SessionId> SessionStore::drainChanged() {
  std::vector<SessionId> out(changed_.begin(), changed_.end());
  changed_.clear();
  return out;
}

void SessionStore::count(const std::vector<BlockId>& blocks, int delta) {
  num_blocks_held_ += delta * static_cast<int>(blocks.size());
  for (BlockId b : blocks) {
    auto [it, inserted] = holders_.try_emplace(b, 0);
    if ((it->second += delta) <= 0) holders_.erase(it);
  }
}

void SessionStore::erase(absl::flat_hash_map<SessionId, Entry>::iterator it) {
  count(it->second.state.blocks, -1);
  order_.erase({it->second.state.priority, it->second.tick, it->first});
  sessions_.erase(it);
}

int SessionStore::numBlocksOnlySessionsHold() const {
  int n = 0;
  for (const auto& [block, holders] : holders_) n += blocks_.refCount(block) == holders;
  return n;
}

}  // namespace tandem::engine
