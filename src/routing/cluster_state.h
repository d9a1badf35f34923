#pragma once
// The router's view of every worker, built from their worker-state streams
// (worker_state.h): load, draining, the block hashes each holds and the
// sessions resident on each, plus an index block hash -> workers holding it
// so that a request's prefix overlap on every worker costs O(log N) hash
// lookups per group of workers with the same overlap, not O(N * W).
//
// Stream rules: a snapshot replaces what was known of that worker (any epoch,
// any seq) and clears its stale mark; a delta applies only if it has the
// snapshot's epoch and seq = last + 1. Any other delta (a gap, another epoch,
// an unknown worker) is refused with kFailedPrecondition, meaning "take a
// fresh snapshot", and marks the worker stale until that snapshot arrives:
// recovery costs one snapshot, never a replay of history.
//
// Stale: a worker whose stream is down (markStale) or out of step keeps its
// load and stays routable, but its cache view earns no credit: prefixOverlap
// reports 0 for it and residentOn leaves it out.
//
// Overlap assumes a worker's holdings of one chain are prefix-closed (holding
// block i means holding blocks 0..i-1: engines can only use a cached chain
// from its start, so that is all a worker advertises usefully). If a worker
// holds a block past a hole, the overlap is counted as if the hole were
// filled: an optimistic estimate D's admission corrects (a capacity
// rejection), never a wrong answer.
//
// Not thread-safe: one owner (the router's state thread, the replay loop).
// Pure: no I/O, no clock.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "src/common/ids.h"
#include "src/routing/worker_ref.h"
#include "src/routing/worker_state.h"

namespace tandem::routing {

// What the policy reads about one worker.
struct WorkerView {
  std::string name;
  uint64_t name_hash = 0;  // for rendezvous hashing (rendezvous.h)
  WorkerRef ref;
  WorkerRole role = WorkerRole::kDecode;
  int block_size = 0;
  BlockHash hash_root{0};
  int64_t max_context_tokens = 0;  // 0: unknown, no limit
  WorkerLoad load;
  uint64_t epoch = 0;
  uint64_t seq = 0;
  bool stale = false;   // its stream is down or out of step: no cache credit
  bool healthy = true;  // set by the caller's failure detector (setHealthy)
  int64_t num_resident_sessions = 0;
  int64_t num_blocks_held = 0;     // distinct hashes, cached or resident
  int64_t num_session_blocks = 0;  // distinct hashes held by resident sessions (D evicts idle sessions LRU to admit)

  bool canDecode() const { return role != WorkerRole::kPrefill; }
  bool canPrefill() const { return role != WorkerRole::kDecode; }
};

class ClusterState {
 public:
  ClusterState();
  ~ClusterState();
  ClusterState(const ClusterState&) = delete;
  ClusterState& operator=(const ClusterState&) = delete;

  // Adds the worker or replaces everything known about it; clears stale.
  absl::Status applySnapshot(const WorkerSnapshot& snapshot);
  // kFailedPrecondition: take a fresh snapshot of `worker` (it is now stale).
  absl::Status applyDelta(std::string_view worker, const WorkerDelta& delta);
  // The worker's stream is down: keep routing to it without cache credit.
  // Returns true when this call made it stale (it was fresh), so the caller
  // logs the transition once; false for an unknown or already stale worker.
  bool markStale(std::string_view worker);
  // The caller's failure detector: an unhealthy worker is not routed to.
  void setHealthy(std::string_view worker, bool healthy);
  // Forgets the worker and everything it held; its slot may be reused.
  void removeWorker(std::string_view worker);

  std::optional<WorkerSlot> find(std::string_view worker) const;
  // Workers live in slots [0, slotEnd()); a slot may be empty.
  uint32_t slotEnd() const;
  // nullptr for an empty slot.
  const WorkerView* worker(WorkerSlot slot) const;
  size_t numWorkers() const;
  // Workers whose cache view is stale now (tandem_router_stale_workers).
  size_t numStale() const;
  // Distinct block hashes held by at least one worker.
  size_t numIndexedBlocks() const;

  // out[slot] = how many leading hashes of `hashes` that worker holds, cached
  // or resident under any session; 0 for a stale worker or an empty slot.
  // Precondition: out.size() >= slotEnd().
  void prefixOverlap(std::span<const BlockHash> hashes, std::span<int32_t> out) const;
  // Fresh workers where `session` is resident.
  std::vector<WorkerSlot> residentOn(const SessionId& session) const;
  // Tokens / full blocks of `session` resident on that worker (0 when not
  // resident or stale).
  int64_t residentTokens(WorkerSlot slot, const SessionId& session) const;
  int64_t residentBlocks(WorkerSlot slot, const SessionId& session) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// True for applyDelta's "take a fresh snapshot" answer.
bool needsResnapshot(const absl::Status& status);

}  // namespace tandem::routing
