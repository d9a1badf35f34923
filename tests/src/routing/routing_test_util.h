#pragma once
// Helpers for the routing tests: build worker snapshots and requests in one
// line each, and run one request through a policy the way a router does.

#include <gtest/gtest.h>

#include <string>
#include <variant>
#include <vector>

#include "src/routing/cluster_state.h"
#include "src/routing/decision.h"
#include "src/routing/in_flight.h"
#include "src/routing/policy.h"
#include "src/routing/route_request.h"

namespace tandem::routing::test_util {

inline constexpr int kBlockSize = 16;

// n consecutive hash values starting at `first` (a synthetic chain).
inline std::vector<BlockHash> chain(uint64_t first, int n) {
  std::vector<BlockHash> out;
  for (int i = 0; i < n; ++i) out.push_back(BlockHash(first + static_cast<uint64_t>(i)));
  return out;
}

inline std::vector<BlockHash> concat(std::vector<BlockHash> a, const std::vector<BlockHash>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct WorkerSpec {
  std::string name;
  WorkerRole role = WorkerRole::kDecode;
  int64_t total_blocks = 1000;
  int64_t free_blocks = -1;  // -1: all free
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t waiting_prompt_tokens = 0;
  bool draining = false;
  int64_t max_context_tokens = 0;
  std::vector<BlockHash> cached;
  std::vector<ResidentSessionBlocks> sessions;
};

inline WorkerSnapshot snapshotOf(const WorkerSpec& s, uint64_t epoch = 1, uint64_t seq = 0) {
  WorkerSnapshot snap;
  snap.epoch = epoch;
  snap.seq = seq;
  snap.worker = s.name;
  snap.role = s.role;
  snap.block_size = kBlockSize;
  snap.max_context_tokens = s.max_context_tokens;
  snap.load = {.free_blocks = s.free_blocks < 0 ? s.total_blocks : s.free_blocks,
               .total_blocks = s.total_blocks,
               .running = s.running,
               .waiting = s.waiting,
               .waiting_prompt_tokens = s.waiting_prompt_tokens,
               .draining = s.draining};
  snap.cached = s.cached;
  snap.sessions = s.sessions;
  return snap;
}

inline void addWorker(ClusterState& c, const WorkerSpec& s) { ASSERT_TRUE(c.applySnapshot(snapshotOf(s)).ok()); }

inline ResidentSessionBlocks resident(const std::string& session, std::vector<BlockHash> hashes) {
  int64_t tokens = static_cast<int64_t>(hashes.size()) * kBlockSize;
  return {.session = SessionId(session), .hashes = std::move(hashes), .num_tokens = tokens};
}

// A request whose prompt is exactly `hashes` full blocks plus `extra_tokens`.
inline RouteRequest request(std::optional<std::string> session, std::vector<BlockHash> hashes, int64_t extra_tokens = 0,
                            int64_t output_tokens = 64) {
  RouteRequest r;
  if (session) r.session = SessionId(*session);
  r.prompt_tokens = static_cast<int64_t>(hashes.size()) * kBlockSize + extra_tokens;
  r.prompt_hashes = std::move(hashes);
  r.expected_output_tokens = output_tokens;
  return r;
}

// route() that must produce a Decision.
inline Decision mustRoute(Policy& p, const RouteRequest& r, const ClusterState& c, const InFlight& f) {
  RouteResult res = p.route(r, c, f);
  EXPECT_TRUE(std::holds_alternative<Decision>(res));
  if (!std::holds_alternative<Decision>(res)) return {};
  return std::get<Decision>(res);
}

}  // namespace tandem::routing::test_util
