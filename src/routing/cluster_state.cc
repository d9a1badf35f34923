#include "src/routing/cluster_state.h"

#include <algorithm>
#include <type_traits>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "src/common/strings.h"
#include "src/routing/block_index.h"
#include "src/routing/rendezvous.h"

namespace tandem::routing {
namespace {

absl::string_view absl_sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

struct Resident {
  std::vector<BlockHash> hashes;
  int64_t num_tokens = 0;
};

}  // namespace

struct ClusterState::Impl {
  struct Worker {
    WorkerView view;
    BlockIndex::WorkerRefs refs;
    absl::flat_hash_map<SessionId, Resident> sessions;
  };
  // slots[i] is empty (nullptr) after removeWorker until reused.
  std::vector<std::unique_ptr<Worker>> slots;
  std::vector<uint32_t> generations;  // survives the slot's occupant
  std::vector<uint32_t> free_slots;
  absl::flat_hash_map<std::string, uint32_t> by_name;
  BlockIndex index;
  // session -> fresh-or-stale workers where it is resident
  absl::flat_hash_map<SessionId, absl::InlinedVector<uint32_t, 2>> resident_on;

  Worker* lookup(std::string_view name) {
    auto it = by_name.find(absl_sv(name));
    return it == by_name.end() ? nullptr : slots[it->second].get();
  }

  void dropSession(Worker& w, uint32_t slot, const SessionId& session) {
    auto it = w.sessions.find(session);
    if (it == w.sessions.end()) return;
    w.view.num_session_blocks -= index.removeSession(slot, w.refs, it->second.hashes);
    w.sessions.erase(it);
    auto r = resident_on.find(session);
    if (r != resident_on.end()) {
      auto& v = r->second;
      v.erase(std::remove(v.begin(), v.end(), slot), v.end());
      if (v.empty()) resident_on.erase(r);
    }
  }

  void storeSession(Worker& w, uint32_t slot, const ResidentSessionBlocks& s) {
    dropSession(w, slot, s.session);
    w.view.num_session_blocks += index.addSession(slot, w.refs, s.hashes);
    w.sessions.emplace(s.session, Resident{s.hashes, s.num_tokens});
    resident_on[s.session].push_back(slot);
  }

  void clearHoldings(Worker& w, uint32_t slot) {
    for (const auto& [session, r] : w.sessions) {
      auto it = resident_on.find(session);
      if (it == resident_on.end()) continue;
      auto& v = it->second;
      v.erase(std::remove(v.begin(), v.end(), slot), v.end());
      if (v.empty()) resident_on.erase(it);
    }
    w.sessions.clear();
    w.view.num_session_blocks = 0;
    index.clearWorker(slot, w.refs);
  }

  void refreshCounts(Worker& w) {
    w.view.num_resident_sessions = static_cast<int64_t>(w.sessions.size());
    w.view.num_blocks_held = static_cast<int64_t>(w.refs.size());
  }

  uint32_t allocateSlot(const std::string& name) {
    uint32_t slot;
    if (!free_slots.empty()) {
      slot = free_slots.back();
      free_slots.pop_back();
    } else {
      slot = static_cast<uint32_t>(slots.size());
      slots.emplace_back();
      generations.push_back(0);
    }
    ++generations[slot];
    slots[slot] = std::make_unique<Worker>();
    by_name.emplace(name, slot);
    return slot;
  }

  void applyBody(Worker& w, uint32_t slot, const WorkerDeltaBody& body) {
    std::visit(
        [&](const auto& b) {
          using T = std::decay_t<decltype(b)>;
          if constexpr (std::is_same_v<T, BlocksStored>) {
            index.addCached(slot, w.refs, b.hashes);
          } else if constexpr (std::is_same_v<T, BlocksRemoved>) {
            index.removeCached(slot, w.refs, b.hashes);
          } else if constexpr (std::is_same_v<T, SessionStored>) {
            storeSession(w, slot, b.state);
          } else if constexpr (std::is_same_v<T, SessionRemoved>) {
            dropSession(w, slot, b.session);
          } else {
            static_assert(std::is_same_v<T, WorkerLoad>);
            w.view.load = b;
          }
        },
        body);
    refreshCounts(w);
  }

  // Bisection over [lo, hi] for the candidates in cand (every one holds
  // hashes[0, lo) and none holds hashes[hi, ...), by prefix-closedness).
  void bisect(std::span<const BlockHash> hashes, uint32_t lo, uint32_t hi, std::span<uint32_t> cand,
              std::span<uint64_t> mark, std::span<int32_t> out) const {
    while (!cand.empty()) {
      if (lo == hi) {
        for (uint32_t s : cand) out[s] = static_cast<int32_t>(lo);
        return;
      }
      uint32_t mid = lo + (hi - lo) / 2;
      const BlockIndex::Holders* h = index.holders(hashes[mid]);
      std::span<uint32_t> holding, not_holding = cand;
      if (h != nullptr) {
        for (uint32_t s : *h) mark[s >> 6] |= uint64_t{1} << (s & 63);
        auto split =
            std::partition(cand.begin(), cand.end(), [&](uint32_t s) { return (mark[s >> 6] >> (s & 63)) & 1; });
        for (uint32_t s : *h) mark[s >> 6] &= ~(uint64_t{1} << (s & 63));
        size_t n = static_cast<size_t>(split - cand.begin());
        holding = cand.subspan(0, n);
        not_holding = cand.subspan(n);
      }
      // Holders of hashes[mid] have overlap in [mid + 1, hi]; the rest in [lo, mid].
      bisect(hashes, mid + 1, hi, holding, mark, out);
      cand = not_holding;
      hi = mid;
    }
  }
};

ClusterState::ClusterState() : impl_(std::make_unique<Impl>()) {}
ClusterState::~ClusterState() = default;

absl::Status ClusterState::applySnapshot(const WorkerSnapshot& snap) {
  if (snap.worker.empty()) return absl::InvalidArgumentError("worker snapshot without a worker name");
  Impl& s = *impl_;
  auto it = s.by_name.find(absl_sv(snap.worker));
  uint32_t slot = it != s.by_name.end() ? it->second : s.allocateSlot(snap.worker);
  Impl::Worker& w = *s.slots[slot];
  s.clearHoldings(w, slot);
  const bool healthy = it != s.by_name.end() ? w.view.healthy : true;
  w.view = WorkerView{.name = snap.worker,
                      .name_hash = stableHash(snap.worker),
                      .ref = WorkerRef{WorkerSlot(slot), s.generations[slot]},
                      .role = snap.role,
                      .block_size = snap.block_size,
                      .hash_root = snap.hash_root,
                      .max_context_tokens = snap.max_context_tokens,
                      .load = snap.load,
                      .epoch = snap.epoch,
                      .seq = snap.seq,
                      .stale = false,
                      .healthy = healthy};
  w.refs.reserve(snap.cached.size());
  s.index.addCached(slot, w.refs, snap.cached);
  for (const auto& session : snap.sessions) s.storeSession(w, slot, session);
  s.refreshCounts(w);
  return absl::OkStatus();
}

absl::Status ClusterState::applyDelta(std::string_view worker, const WorkerDelta& delta) {
  Impl& s = *impl_;
  auto it = s.by_name.find(absl_sv(worker));
  if (it == s.by_name.end()) {
    return absl::FailedPreconditionError(strCat("resnapshot: no snapshot of worker ", worker, " yet"));
  }
  Impl::Worker& w = *s.slots[it->second];
  if (delta.epoch != w.view.epoch || delta.seq != w.view.seq + 1 || w.view.stale) {
    w.view.stale = true;
    return absl::FailedPreconditionError(strCat("resnapshot: worker ", worker, " sent epoch ", delta.epoch, " seq ",
                                                delta.seq, ", expected epoch ", w.view.epoch, " seq ", w.view.seq + 1));
  }
  s.applyBody(w, it->second, delta.body);
  w.view.seq = delta.seq;
  return absl::OkStatus();
}

bool ClusterState::markStale(std::string_view worker) {
  Impl::Worker* w = impl_->lookup(worker);
  if (w == nullptr || w->view.stale) return false;
  w->view.stale = true;
  return true;
}

void ClusterState::setHealthy(std::string_view worker, bool healthy) {
  if (Impl::Worker* w = impl_->lookup(worker)) w->view.healthy = healthy;
}

void ClusterState::removeWorker(std::string_view worker) {
  Impl& s = *impl_;
  auto it = s.by_name.find(absl_sv(worker));
  if (it == s.by_name.end()) return;
  uint32_t slot = it->second;
  s.clearHoldings(*s.slots[slot], slot);
  s.slots[slot].reset();
  s.free_slots.push_back(slot);
  s.by_name.erase(it);
}

std::optional<WorkerSlot> ClusterState::find(std::string_view worker) const {
  auto it = impl_->by_name.find(absl_sv(worker));
  if (it == impl_->by_name.end()) return std::nullopt;
  return WorkerSlot(it->second);
}

uint32_t ClusterState::slotEnd() const { return static_cast<uint32_t>(impl_->slots.size()); }

const WorkerView* ClusterState::worker(WorkerSlot slot) const {
  if (slot.value() >= impl_->slots.size() || !impl_->slots[slot.value()]) return nullptr;
  return &impl_->slots[slot.value()]->view;
}

size_t ClusterState::numWorkers() const { return impl_->by_name.size(); }

size_t ClusterState::numStale() const {
  size_t n = 0;
  for (const auto& w : impl_->slots) n += w && w->view.stale ? 1 : 0;
  return n;
}

size_t ClusterState::numIndexedBlocks() const { return impl_->index.numHashes(); }

void ClusterState::prefixOverlap(std::span<const BlockHash> hashes, std::span<int32_t> out) const {
  const Impl& s = *impl_;
  std::fill(out.begin(), out.end(), 0);
  // On the stack up to 1024 workers: no allocation on the decision path.
  absl::InlinedVector<uint32_t, 1024> cand;
  for (uint32_t slot = 0; slot < s.slots.size(); ++slot) {
    if (s.slots[slot] && !s.slots[slot]->view.stale) cand.push_back(slot);
  }
  if (hashes.empty() || cand.empty()) return;
  absl::InlinedVector<uint64_t, 16> mark((s.slots.size() + 63) / 64, 0);
  s.bisect(hashes, 0, static_cast<uint32_t>(hashes.size()), std::span<uint32_t>(cand.data(), cand.size()), mark, out);
}

std::vector<WorkerSlot> ClusterState::residentOn(const SessionId& session) const {
  std::vector<WorkerSlot> out;
  auto it = impl_->resident_on.find(session);
  if (it == impl_->resident_on.end()) return out;
  for (uint32_t slot : it->second) {
    if (!impl_->slots[slot]->view.stale) out.push_back(WorkerSlot(slot));
  }
  return out;
}

int64_t ClusterState::residentTokens(WorkerSlot slot, const SessionId& session) const {
  const WorkerView* v = worker(slot);
  if (v == nullptr || v->stale) return 0;
  const auto& sessions = impl_->slots[slot.value()]->sessions;
  auto it = sessions.find(session);
  return it == sessions.end() ? 0 : it->second.num_tokens;
}

int64_t ClusterState::residentBlocks(WorkerSlot slot, const SessionId& session) const {
  const WorkerView* v = worker(slot);
  if (v == nullptr || v->stale) return 0;
  const auto& sessions = impl_->slots[slot.value()]->sessions;
  auto it = sessions.find(session);
  return it == sessions.end() ? 0 : static_cast<int64_t>(it->second.hashes.size());
}

bool needsResnapshot(const absl::Status& status) { return absl::IsFailedPrecondition(status); }

}  // namespace tandem::routing
