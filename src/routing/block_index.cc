#include "src/routing/block_index.h"

#include <algorithm>

namespace tandem::routing {

void BlockIndex::link(uint32_t slot, BlockHash hash) { holders_[hash].push_back(slot); }

void BlockIndex::unlink(uint32_t slot, BlockHash hash) {
  auto it = holders_.find(hash);
  if (it == holders_.end()) return;
  Holders& h = it->second;
  auto pos = std::find(h.begin(), h.end(), slot);
  if (pos != h.end()) {
    *pos = h.back();
    h.pop_back();
  }
  if (h.empty()) holders_.erase(it);
}

void BlockIndex::addCached(uint32_t slot, WorkerRefs& refs, std::span<const BlockHash> hashes) {
  for (BlockHash h : hashes) {
    auto [it, inserted] = refs.try_emplace(h, kCachedBit);
    if (inserted) {
      link(slot, h);
    } else {
      it->second |= kCachedBit;  // already held (cached again, or resident): no new link
    }
  }
}

void BlockIndex::removeCached(uint32_t slot, WorkerRefs& refs, std::span<const BlockHash> hashes) {
  for (BlockHash h : hashes) {
    auto it = refs.find(h);
    if (it == refs.end()) continue;  // not known as held: nothing to forget
    it->second &= ~kCachedBit;
    if (it->second == 0) {
      refs.erase(it);
      unlink(slot, h);
    }
  }
}

int64_t BlockIndex::addSession(uint32_t slot, WorkerRefs& refs, std::span<const BlockHash> hashes) {
  int64_t newly_session_held = 0;
  for (BlockHash h : hashes) {
    auto [it, inserted] = refs.try_emplace(h, 1);
    if (inserted) {
      link(slot, h);
      ++newly_session_held;
    } else {
      newly_session_held += (it->second & ~kCachedBit) == 0 ? 1 : 0;
      ++it->second;
    }
  }
  return newly_session_held;
}

int64_t BlockIndex::removeSession(uint32_t slot, WorkerRefs& refs, std::span<const BlockHash> hashes) {
  int64_t no_longer_session_held = 0;
  for (BlockHash h : hashes) {
    auto it = refs.find(h);
    if (it == refs.end() || (it->second & ~kCachedBit) == 0) continue;
    --it->second;
    no_longer_session_held += (it->second & ~kCachedBit) == 0 ? 1 : 0;
    if (it->second == 0) {
      refs.erase(it);
      unlink(slot, h);
    }
  }
  return no_longer_session_held;
}

void BlockIndex::clearWorker(uint32_t slot, WorkerRefs& refs) {
  for (const auto& [h, count] : refs) unlink(slot, h);
  refs.clear();
}

const BlockIndex::Holders* BlockIndex::holders(BlockHash hash) const {
  auto it = holders_.find(hash);
  return it == holders_.end() ? nullptr : &it->second;
}

}  // namespace tandem::routing
