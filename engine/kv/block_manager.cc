#include "engine/kv/block_manager.h"

#include <algorithm>

#include "src/common/check.h"
#include "src/common/strings.h"

namespace tandem::engine {

BlockManager::BlockManager(int num_blocks) : blocks_(static_cast<size_t>(num_blocks)) {
  free_.reserve(static_cast<size_t>(num_blocks));
  // Highest id at the bottom so allocation hands out 0, 1, 2, ... first.
  for (int i = num_blocks - 1; i >= 0; --i) free_.push_back(BlockId(i));
}

int BlockManager::matchPrefix(std::span<const BlockHash> hashes) const {
  int n = 0;
  for (BlockHash h : hashes) {
    if (!by_hash_.contains(h)) break;
    ++n;
  }
  return n;
}

void BlockManager::evictOne() {
  TANDEM_CHECK(!lru_.empty(), "eviction with no cached block");
  auto it = lru_.begin();
  BlockId id(it->second);
  lru_.erase(it);
  Block& b = blocks_[index(id)];
  by_hash_.erase(b.hash);
  events_.push_back({KvEvent::Kind::kRemoved, b.hash});
  b.hashed = false;
  b.hash = BlockHash();
  free_.push_back(id);
}

BlockId BlockManager::allocate() {
  if (free_.empty()) evictOne();
  TANDEM_CHECK(!free_.empty(), "allocate() without canAllocate(1)");
  BlockId id = free_.back();
  free_.pop_back();
  Block& b = blocks_[index(id)];
  TANDEM_CHECK(b.ref == 0 && !b.hashed, "a block on the free list is held or hashed");
  b.ref = 1;
  return id;
}

void BlockManager::allocateMany(int n, std::vector<BlockId>& out) {
  const size_t first = out.size();
  for (int i = 0; i < n; ++i) out.push_back(allocate());
  std::sort(out.begin() + static_cast<std::ptrdiff_t>(first), out.end(),
            [](BlockId a, BlockId b) { return a.value() < b.value(); });
}

BlockId BlockManager::acquireCached(BlockHash hash) {
  auto it = by_hash_.find(hash);
  TANDEM_CHECK(it != by_hash_.end(), "acquireCached() of a hash that is not cached");
  BlockId id = it->second;
  Block& b = blocks_[index(id)];
  if (b.ref == 0) lru_.erase({b.lru_tick, id.value()});
  ++b.ref;
  return id;
}

void BlockManager::addRef(BlockId id) {
  Block& b = blocks_[index(id)];
  TANDEM_CHECK(b.ref > 0, "addRef() of a block nobody holds");
  ++b.ref;
}

void BlockManager::release(BlockId id) {
  Block& b = blocks_[index(id)];
  TANDEM_CHECK(b.ref > 0, "release() of a block nobody holds");
  if (--b.ref > 0) return;
  if (b.hashed) {
    b.lru_tick = ++tick_;
    lru_.insert({b.lru_tick, id.value()});
  } else {
    free_.push_back(id);
  }
}

void BlockManager::releaseAll(std::span<const BlockId> ids) {
  // Release the tail first so that, among a sequence's blocks, the prefix
  // (most likely to be reused) is the most recently cached and evicted last.
  for (size_t i = ids.size(); i-- > 0;) release(ids[i]);
}

bool BlockManager::commit(BlockId id, BlockHash hash) {
  Block& b = blocks_[index(id)];
  TANDEM_CHECK(b.ref > 0, "commit() of a block nobody holds");
  if (b.hashed) return by_hash_.at(b.hash) == id;
  auto [it, inserted] = by_hash_.try_emplace(hash, id);
  if (!inserted) return false;
  b.hashed = true;
  b.hash = hash;
  events_.push_back({KvEvent::Kind::kStored, hash});
  return true;
}

std::vector<KvEvent> BlockManager::drainEvents() {
  std::vector<KvEvent> out;
  out.swap(events_);
  return out;
}

absl::Status BlockManager::checkInvariants() const {
  size_t num_free = 0, num_cached = 0, num_held = 0;
  std::vector<int> seen(blocks_.size(), 0);
  for (BlockId id : free_) {
    if (id.value() < 0 || index(id) >= blocks_.size()) return absl::InternalError(strCat("free list holds bad id ", id.value()));
    if (seen[index(id)]++) return absl::InternalError(strCat("block ", id.value(), " is on the free list twice"));
    const Block& b = blocks_[index(id)];
    if (b.ref != 0 || b.hashed) return absl::InternalError(strCat("free block ", id.value(), " has ref ", b.ref, " hashed ", b.hashed));
    ++num_free;
  }
  for (const auto& [tick, raw] : lru_) {
    size_t i = static_cast<size_t>(raw);
    if (seen[i]++) return absl::InternalError(strCat("block ", raw, " is both free and cached, or cached twice"));
    const Block& b = blocks_[i];
    if (b.ref != 0 || !b.hashed || b.lru_tick != tick) return absl::InternalError(strCat("cached block ", raw, " is inconsistent"));
    ++num_cached;
  }
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const Block& b = blocks_[i];
    if (b.ref < 0) return absl::InternalError(strCat("block ", i, " has negative ref ", b.ref));
    if (b.ref > 0) {
      if (seen[i]) return absl::InternalError(strCat("held block ", i, " is also free or cached"));
      ++num_held;
    } else if (!seen[i]) {
      return absl::InternalError(strCat("block ", i, " has ref 0 but is neither free nor cached (leaked)"));
    }
    if (b.hashed) {
      auto it = by_hash_.find(b.hash);
      if (it == by_hash_.end() || it->second.value() != static_cast<int32_t>(i)) {
        return absl::InternalError(strCat("block ", i, " is hashed but the hash index does not point at it"));
      }
    }
  }
  for (const auto& [hash, id] : by_hash_) {
    const Block& b = blocks_[index(id)];
    if (!b.hashed || b.hash != hash) return absl::InternalError(strCat("hash index points at block ", id.value(), " which does not hold that hash"));
  }
  if (num_free + num_cached + num_held != blocks_.size()) {
    return absl::InternalError(strCat("free ", num_free, " + cached ", num_cached, " + held ", num_held, " != total ", blocks_.size()));
  }
  return absl::OkStatus();
}

}  // namespace tandem::engine
