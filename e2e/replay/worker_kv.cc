#include "e2e/replay/worker_kv.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "src/common/check.h"

namespace tandem::replay {
namespace {

int64_t privateBlocks(const KvRequest& r) { return r.total_blocks - static_cast<int64_t>(r.prompt.size()); }

// Appends to the last event when it is of the same kind, so a burst of
// evictions is one delta.
template <typename T>
void recordHash(std::vector<routing::WorkerDeltaBody>& events, BlockHash hash) {
  if (events.empty() || !std::holds_alternative<T>(events.back())) events.emplace_back(T{});
  std::get<T>(events.back()).hashes.push_back(hash);
}

}  // namespace

WorkerKv::WorkerKv(int64_t capacity_blocks) : capacity_(capacity_blocks) {}

int64_t WorkerKv::prefixHits(std::span<const BlockHash> prompt) const {
  int64_t n = 0;
  while (n < static_cast<int64_t>(prompt.size()) && blocks_.contains(prompt[n])) ++n;
  return n;
}

int64_t WorkerKv::newBlocksNeeded(const KvRequest& request) const {
  int64_t missing = 0;
  for (BlockHash h : request.prompt) missing += blocks_.contains(h) ? 0 : 1;
  return missing + privateBlocks(request);
}

int64_t WorkerKv::reclaimableFor(const KvRequest& request) const {
  // Unreferenced cached blocks the request itself reuses stop being evictable.
  int64_t lru = static_cast<int64_t>(lru_.size());
  absl::flat_hash_set<BlockHash> prompt;
  for (BlockHash h : request.prompt) {
    prompt.insert(h);
    auto it = blocks_.find(h);
    if (it != blocks_.end() && it->second.refs == 0) --lru;
  }
  int64_t own = 0;
  if (request.session) {
    auto s = sessions_.find(*request.session);
    if (s != sessions_.end()) {
      // Taking the session over frees its private blocks and makes the
      // blocks only it held (and the prompt does not reuse) evictable.
      own += s->second.private_blocks;
      for (BlockHash h : s->second.hashes) {
        if (blocks_.at(h).refs == 1 && !prompt.contains(h)) ++own;
      }
    }
  }
  return capacity_ - used_ + lru + own;
}

std::optional<int64_t> WorkerKv::tryAdmit(const KvRequest& request) {
  const int64_t need = newBlocksNeeded(request);
  while (need > reclaimableFor(request)) {
    // Evicting sessions cannot help while running requests hold the room.
    if (running_reserved_ + request.total_blocks > capacity_) return std::nullopt;
    auto victim = by_age_.begin();
    if (victim != by_age_.end() && request.session && victim->second == *request.session) ++victim;
    if (victim == by_age_.end()) return std::nullopt;
    evictSession(SessionId(victim->second));
  }
  const int64_t hits = prefixHits(request.prompt);
  for (BlockHash h : request.prompt) {
    if (blocks_.contains(h)) ref(h);
  }
  if (request.session) {
    auto s = sessions_.find(*request.session);
    if (s != sessions_.end()) {  // taken over by this turn
      Session taken = std::move(s->second);
      by_age_.erase(taken.tick);
      sessions_.erase(s);
      used_ -= taken.private_blocks;
      unrefChain(taken.hashes);
      events_.emplace_back(routing::SessionRemoved{*request.session});
    }
  }
  while (capacity_ - used_ < need) evictCachedBlock();
  for (BlockHash h : request.prompt) {
    if (blocks_.contains(h)) continue;
    blocks_[h].refs = 1;
    ++used_;
  }
  used_ += privateBlocks(request);
  running_reserved_ += request.total_blocks;
  TANDEM_CHECK(used_ <= capacity_, "admission overbooked the pool");
  return hits;
}

void WorkerKv::publishComputed(const KvRequest& request) {
  for (BlockHash h : request.prompt) {
    Block& b = blocks_.at(h);
    if (b.published) continue;
    b.published = true;
    recordHash<routing::BlocksStored>(events_, h);
  }
}

void WorkerKv::finish(const KvRequest& request) {
  running_reserved_ -= request.total_blocks;
  used_ -= privateBlocks(request);
  if (!request.session) {
    unrefChain(request.prompt);
    return;
  }
  auto old = sessions_.find(*request.session);
  if (old != sessions_.end()) {  // another turn of it finished here meanwhile: replaced
    Session replaced = std::move(old->second);
    by_age_.erase(replaced.tick);
    sessions_.erase(old);
    used_ -= replaced.private_blocks;
    unrefChain(replaced.hashes);
  }
  // The answer's full blocks become hashed blocks; the prompt's partial
  // last block (if the answer filled it) is superseded.
  for (BlockHash h : request.resident) refOrAdd(h);
  unrefChain(request.prompt);
  Session s{
      .hashes = std::vector<BlockHash>(request.resident.begin(), request.resident.end()),
      .private_blocks = std::max<int64_t>(0, request.total_blocks - static_cast<int64_t>(request.resident.size())),
      .tick = next_tick_++};
  used_ += s.private_blocks;
  by_age_.emplace(s.tick, *request.session);
  events_.emplace_back(routing::SessionStored{routing::ResidentSessionBlocks{
      .session = *request.session, .hashes = s.hashes, .num_tokens = request.total_tokens}});
  sessions_.emplace(*request.session, std::move(s));
  // A superseded partial block may leave the pool one block over: it is
  // unreferenced, so evicting it restores the invariant used <= capacity.
  while (used_ > capacity_ && !lru_.empty()) evictCachedBlock();
}

std::vector<routing::WorkerDeltaBody> WorkerKv::takeEvents() { return std::exchange(events_, {}); }

void WorkerKv::ref(BlockHash hash) {
  Block& b = blocks_.at(hash);
  if (b.refs++ == 0) lru_.erase(b.lru);
}

void WorkerKv::refOrAdd(BlockHash hash) {
  auto it = blocks_.find(hash);
  if (it != blocks_.end()) {
    ref(hash);
    return;
  }
  Block& b = blocks_[hash];
  b.refs = 1;
  b.published = true;
  ++used_;
  recordHash<routing::BlocksStored>(events_, hash);
}

void WorkerKv::unrefChain(std::span<const BlockHash> hashes) {
  for (auto it = hashes.rbegin(); it != hashes.rend(); ++it) {
    Block& b = blocks_.at(*it);
    if (--b.refs == 0) {
      lru_.push_front(*it);
      b.lru = lru_.begin();
    }
  }
}

void WorkerKv::evictCachedBlock() {
  TANDEM_CHECK(!lru_.empty(), "evicting from an empty LRU: admission counted room that is not there");
  const BlockHash victim = lru_.back();
  lru_.pop_back();
  auto it = blocks_.find(victim);
  if (it->second.published) recordHash<routing::BlocksRemoved>(events_, victim);
  blocks_.erase(it);
  --used_;
}

void WorkerKv::evictSession(const SessionId& session) {
  auto it = sessions_.find(session);
  Session s = std::move(it->second);
  by_age_.erase(s.tick);
  sessions_.erase(it);
  used_ -= s.private_blocks;
  unrefChain(s.hashes);
  events_.emplace_back(routing::SessionRemoved{session});
}

}  // namespace tandem::replay
