// Issue 14's failure modes 5-8, each as a scenario: the behaviour the issue
// describes, implemented as described, fails it; the tandem policy passes.
// (Modes 1-4: failure_modes_1_4_test.cc.)

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "src/routing/reject_reason.h"
#include "src/routing/tandem_policy.h"
#include "tests/src/routing/session_sim.h"

namespace tandem::routing {
namespace {

using namespace test_util;  // NOLINT: test helpers

// ---------------------------------------------------------------------------
// Mode 5: load updated too late: a burst of requests all see the same idle
// worker and all go there.

// Fewest running + waiting requests as the workers last reported them.
std::string leastReportedLoad(const ClusterState& c) {
  const WorkerView* best = nullptr;
  for (uint32_t s = 0; s < c.slotEnd(); ++s) {
    const WorkerView* w = c.worker(WorkerSlot(s));
    if (w == nullptr || !w->canDecode()) continue;
    if (best == nullptr || w->load.running + w->load.waiting < best->load.running + best->load.waiting) best = w;
  }
  return best->name;
}

TEST(FailureMode5, ABurstPilesOntoOneIdleWorkerUnlessInFlightCounts) {
  // d1 is idle, the others run 2 requests each; 30 new sessions arrive before any report.
  SessionSim sim({.num_decode = 4});
  for (const char* d : {"d0", "d2", "d3"}) sim.setRunning(d, 2);
  SessionTraffic traffic;
  std::map<std::string, int> bad_count;
  for (int s = 0; s < 30; ++s) ++bad_count[leastReportedLoad(sim.cluster())];
  EXPECT_EQ(bad_count["d1"], 30) << "the whole burst lands on the worker that looked idle";

  TandemPolicy ours;
  InFlight in_flight;
  std::map<std::string, int> count;
  for (int s = 0; s < 30; ++s) {
    Decision d = mustRoute(ours, traffic.turn(s, 0), sim.cluster(), in_flight);
    in_flight.add(d);
    ++count[d.decode];
  }
  // Equal total load at the end (9 each): d1 takes 2 more than the others.
  EXPECT_EQ(count["d1"], 9);
  for (const char* d : {"d0", "d2", "d3"}) EXPECT_EQ(count[d], 7) << d;
}

TEST(FailureMode5, ABurstNeverOverbooksAWorkersFreeBlocks) {
  // Each D has room for the reservations of 4 requests: 72 prompt blocks + 5
  // tokens + 128 output tokens = 81 blocks each.
  SessionSim sim({.num_decode = 4, .blocks_per_decode = 4 * 81});
  SessionTraffic traffic;
  TandemPolicy ours;
  InFlight in_flight;
  std::map<std::string, int64_t> reserved;
  for (int s = 0; s < 16; ++s) {
    Decision d = mustRoute(ours, traffic.turn(s, 0), sim.cluster(), in_flight);
    EXPECT_NE(d.reason, DecisionReason::kNoneFree) << "request " << s;
    in_flight.add(d);
    reserved[d.decode] += d.reserve_blocks;
  }
  for (const auto& [d, blocks] : reserved) EXPECT_EQ(blocks, 4 * 81) << d;
  // The 17th fits nowhere now: it queues on the least-loaded worker, saying so.
  Decision d = mustRoute(ours, traffic.turn(16, 0), sim.cluster(), in_flight);
  EXPECT_EQ(d.reason, DecisionReason::kNoneFree);
}

// ---------------------------------------------------------------------------
// Mode 6: rejection reasons matched by substring, so the migration backstop
// never fired.

// What a decode worker's refusal looked like as text, and the substring
// matcher of the failing router.
constexpr const char* kCapacityRefusalText = "kv pool exhausted: need 12 blocks, 3 free";
bool substringSaysCapacity(const std::string& message) { return message.find("capacity") != std::string::npos; }

TEST(FailureMode6, SubstringMatchingNeverMigratesButTypedReasonsDo) {
  // s1 is resident on d0, which reports room but refuses every turn (its
  // report lags its pool). d1 is free.
  ClusterState cluster;
  addWorker(cluster, {.name = "p0", .role = WorkerRole::kPrefill});
  addWorker(cluster, {.name = "d0", .sessions = {resident("s1", chain(100, 40))}});
  addWorker(cluster, {.name = "d1"});
  RouteRequest turn = request("s1", chain(100, 42));

  auto run = [&](auto&& deliver) {
    TandemPolicy policy;
    InFlight in_flight;
    std::vector<std::string> tried;
    for (int attempt = 0; attempt < 5; ++attempt) {
      Decision d = mustRoute(policy, turn, cluster, in_flight);
      tried.push_back(d.decode);
      if (d.decode == "d1") break;  // served
      deliver(policy, d);
    }
    return tried;
  };
  // The failing router learns the reason from the text.
  auto bad = run([&](Policy& p, const Decision& d) {
    if (substringSaysCapacity(kCapacityRefusalText)) p.onRejected(turn, d, RejectReason::kCapacity);
  });
  EXPECT_EQ(bad, std::vector<std::string>(5, "d0")) << "the backstop never fires; the session is stuck";

  // Ours: D sends the enum's name; the router parses it exactly.
  auto ours = run([&](Policy& p, const Decision& d) {
    std::optional<RejectReason> reason = parseRejectReason(rejectReasonName(RejectReason::kCapacity));
    ASSERT_TRUE(reason.has_value());
    p.onRejected(turn, d, *reason);
  });
  EXPECT_EQ(ours, (std::vector<std::string>{"d0", "d0", "d1"}));
}

TEST(FailureMode6, ReasonsParseExactlyNeverBySubstring) {
  for (RejectReason r : {RejectReason::kCapacity, RejectReason::kQueueFull, RejectReason::kDraining,
                         RejectReason::kPromptTooLong, RejectReason::kUnknownPrefill, RejectReason::kPrefillFailed}) {
    EXPECT_EQ(parseRejectReason(rejectReasonName(r)), r);
  }
  EXPECT_EQ(parseRejectReason("draining; capacity released"), std::nullopt);
  EXPECT_EQ(parseRejectReason("no capacity"), std::nullopt);
  EXPECT_EQ(parseRejectReason("Capacity"), std::nullopt);
}

TEST(FailureMode6, OnlyCapacityRejectionsCountTowardMigration) {
  ClusterState cluster;
  addWorker(cluster, {.name = "d0", .sessions = {resident("s1", chain(100, 40))}});
  addWorker(cluster, {.name = "d1"});
  RouteRequest turn = request("s1", chain(100, 42));
  TandemPolicy policy;
  InFlight in_flight;
  for (RejectReason r : {RejectReason::kQueueFull, RejectReason::kDraining, RejectReason::kPrefillFailed}) {
    Decision d = mustRoute(policy, turn, cluster, in_flight);
    ASSERT_EQ(d.decode, "d0");
    policy.onRejected(turn, d, r);
  }
  EXPECT_EQ(mustRoute(policy, turn, cluster, in_flight).decode, "d0");
}

// ---------------------------------------------------------------------------
// Mode 7: affinity state kept per router replica, so turns scatter across
// replicas.

// A replica keeps its own session -> D table, filled on first sight with
// the worker that has the fewest resident sessions then.
class PerReplicaAffinity {
 public:
  std::string route(const ClusterState& c, const RouteRequest& r) {
    auto [it, inserted] = owner_.try_emplace(r.session->value());
    if (inserted) {
      const WorkerView* best = nullptr;
      for (uint32_t s = 0; s < c.slotEnd(); ++s) {
        const WorkerView* w = c.worker(WorkerSlot(s));
        if (w != nullptr && w->canDecode() &&
            (best == nullptr || w->num_resident_sessions < best->num_resident_sessions)) {
          best = w;
        }
      }
      it->second = best->name;
    }
    return it->second;
  }

 private:
  std::map<std::string, std::string> owner_;
};

TEST(FailureMode7, PerReplicaAffinityScattersButWorkerStateAffinityHolds) {
  // A load balancer alternates requests between two router replicas.
  SessionTraffic traffic;
  auto run = [&](SessionSim& sim, auto&& replica_route) {
    DirectShare share;
    int n = 0;
    for (int t = 0; t < 6; ++t) {
      for (int s = 0; s < 7; ++s) {  // odd: a session's turns alternate replicas
        RouteRequest r = traffic.turn(s, t);
        share.record(r, t, sim.serve(replica_route(n++ % 2, r), r));
      }
    }
    return share;
  };
  SessionSim bad_sim({.num_decode = 4});
  PerReplicaAffinity bad_a, bad_b;
  DirectShare bad = run(bad_sim, [&](int replica, const RouteRequest& r) {
    return (replica == 0 ? bad_a : bad_b).route(bad_sim.cluster(), r);
  });
  EXPECT_LT(bad.overall(), 0.5);

  // Two tandem replicas: own policy objects and in-flight views, the same
  // worker streams (here: the same ClusterState).
  SessionSim sim({.num_decode = 4});
  TandemPolicy a, b;
  InFlight fa, fb;
  DirectShare ours = run(sim, [&](int replica, const RouteRequest& r) {
    return replica == 0 ? mustRoute(a, r, sim.cluster(), fa).decode : mustRoute(b, r, sim.cluster(), fb).decode;
  });
  EXPECT_EQ(ours.overall(), 1.0);
}

TEST(FailureMode7, ReplicasFedTheSameStatePickTheSameWorkerForNewSessions) {
  ClusterState cluster;
  for (int d = 0; d < 6; ++d) addWorker(cluster, {.name = "d" + std::to_string(d), .cached = chain(1, 8)});
  TandemPolicy a, b;
  InFlight fa, fb;
  std::set<std::string> used;
  for (int s = 0; s < 60; ++s) {
    RouteRequest r = request("s" + std::to_string(s), concat(chain(1, 8), chain(1000 * (s + 1), 4)));
    std::string da = mustRoute(a, r, cluster, fa).decode;
    EXPECT_EQ(da, mustRoute(b, r, cluster, fb).decode) << "session " << s;
    used.insert(da);
  }
  EXPECT_EQ(used.size(), 6u) << "equal workers: the rendezvous hash spreads sessions over all of them";
}

TEST(FailureMode7, ReplicasAgreeWhateverOrderTheyLearnedTheWorkersIn) {
  // Replica b subscribed to the workers in the opposite order: other slots,
  // same names and state.
  std::vector<WorkerSpec> workers;
  for (int p = 0; p < 3; ++p) workers.push_back({.name = "p" + std::to_string(p), .role = WorkerRole::kPrefill});
  for (int d = 0; d < 5; ++d) {
    workers.push_back({.name = "d" + std::to_string(d),
                       .running = d % 2,
                       .cached = chain(1, 8),
                       .sessions = {resident("old" + std::to_string(d), chain(500 * (d + 1), 3))}});
  }
  ClusterState ca, cb;
  for (const auto& w : workers) addWorker(ca, w);
  for (auto it = workers.rbegin(); it != workers.rend(); ++it) addWorker(cb, *it);
  TandemPolicy a, b;
  InFlight fa, fb;
  for (int s = 0; s < 40; ++s) {
    RouteRequest r = request("s" + std::to_string(s), concat(chain(1, 8), chain(1000 * (s + 1), 4)));
    Decision da = mustRoute(a, r, ca, fa), db = mustRoute(b, r, cb, fb);
    EXPECT_EQ(da.decode, db.decode) << "session " << s;
    EXPECT_EQ(da.prefill, db.prefill) << "session " << s;
  }
}

// ---------------------------------------------------------------------------
// Mode 8: a router silently falls back to guessing when a worker stops
// publishing; an "overloaded" mark that never clears; a recovery that replays
// millions of events after a worker restarts.

TEST(FailureMode8, AStaleWorkerEarnsNoCacheCreditButStaysRoutable) {
  // d0 held s1; its stream broke and it restarted with an empty pool. The
  // failing router keeps guessing from the last view it had.
  auto setup = [](ClusterState& c) {
    addWorker(c, {.name = "p0", .role = WorkerRole::kPrefill});
    addWorker(c, {.name = "d0", .sessions = {resident("s1", chain(100, 40))}});
    addWorker(c, {.name = "d1", .running = 3});
  };
  RouteRequest turn = request("s1", chain(100, 42));
  ClusterState guessing;
  setup(guessing);
  TandemPolicy policy;
  InFlight in_flight;
  Decision bad = mustRoute(policy, turn, guessing, in_flight);
  EXPECT_EQ(bad.path, RoutePath::kDirect) << "direct to a D that no longer holds the session";

  ClusterState ours;
  setup(ours);
  ours.markStale("d0");
  Decision d = mustRoute(policy, turn, ours, in_flight);
  EXPECT_EQ(d.decode, "d0") << "still routable: the least-loaded worker";
  EXPECT_EQ(d.decode_cached_blocks, 0);
  EXPECT_EQ(d.path, RoutePath::kDisagg);
  EXPECT_EQ(d.reason, DecisionReason::kLeastLoaded);
}

// Marks a P overloaded when its queue exceeds the threshold; the mark is never cleared.
class StickyOverloadMark {
 public:
  std::string route(const ClusterState& c, int64_t threshold) {
    const WorkerView* best = nullptr;
    for (uint32_t s = 0; s < c.slotEnd(); ++s) {
      const WorkerView* w = c.worker(WorkerSlot(s));
      if (w == nullptr || !w->canPrefill()) continue;
      if (w->load.waiting_prompt_tokens > threshold) overloaded_.insert(w->name);
      if (overloaded_.count(w->name) != 0) continue;
      if (best == nullptr || w->load.waiting_prompt_tokens < best->load.waiting_prompt_tokens) best = w;
    }
    return best == nullptr ? "" : best->name;
  }

 private:
  std::set<std::string> overloaded_;
};

TEST(FailureMode8, AnOverloadedMarkClearsWhenTheQueueDrains) {
  RouterConfig config;
  ClusterState c;
  addWorker(c, {.name = "d0"});
  addWorker(c, {.name = "p0", .role = WorkerRole::kPrefill, .waiting_prompt_tokens = 200'000});
  addWorker(c, {.name = "p1", .role = WorkerRole::kPrefill, .waiting_prompt_tokens = 10'000});
  StickyOverloadMark bad;
  TandemPolicy ours(config);
  InFlight in_flight;
  RouteRequest r = request("s1", chain(100, 40));
  EXPECT_EQ(bad.route(c, config.prefill_overload_tokens), "p1");
  EXPECT_EQ(mustRoute(ours, r, c, in_flight).prefill, "p1");
  // p0 drained; p1 is now busy (but under the threshold).
  addWorker(c, {.name = "p0", .role = WorkerRole::kPrefill, .waiting_prompt_tokens = 0});
  addWorker(c, {.name = "p1", .role = WorkerRole::kPrefill, .waiting_prompt_tokens = 30'000});
  EXPECT_EQ(bad.route(c, config.prefill_overload_tokens), "p1") << "p0 stays marked forever";
  EXPECT_EQ(mustRoute(ours, r, c, in_flight).prefill, "p0");
}

TEST(FailureMode8, RecoveryIsOneSnapshotNotAReplayOfHistory) {
  // A worker's history: 200K block events since it started.
  constexpr int kBatches = 2000, kBatch = 100;
  WorkerSnapshot start = snapshotOf({.name = "d0"});
  std::vector<WorkerDelta> history;
  for (int b = 0; b < kBatches; ++b) {
    history.push_back({.epoch = 1, .seq = uint64_t(b) + 1, .body = BlocksStored{chain(uint64_t(b) * kBatch, kBatch)}});
  }
  // The router that followed the whole stream.
  ClusterState followed;
  ASSERT_TRUE(followed.applySnapshot(start).ok());
  for (const auto& d : history) ASSERT_TRUE(followed.applyDelta("d0", d).ok());

  // A router that missed one delta: the next one is refused, it asks for a
  // snapshot (the worker's state now) and applies it once. The failing
  // design would re-apply all of `history` (kBatches deltas, 200K events).
  ClusterState recovering;
  ASSERT_TRUE(recovering.applySnapshot(start).ok());
  ASSERT_TRUE(recovering.applyDelta("d0", history[0]).ok());
  EXPECT_TRUE(needsResnapshot(recovering.applyDelta("d0", history[2])));
  WorkerSnapshot now = start;
  now.seq = kBatches;
  now.cached = chain(0, kBatches * kBatch);
  int applied = 0;
  ASSERT_TRUE(recovering.applySnapshot(now).ok());
  ++applied;
  EXPECT_EQ(applied, 1);
  EXPECT_FALSE(recovering.worker(*recovering.find("d0"))->stale);
  EXPECT_EQ(recovering.numIndexedBlocks(), followed.numIndexedBlocks());
  std::vector<int32_t> a(1), b(1);
  auto prompt = chain(0, kBatches * kBatch + 5);
  followed.prefixOverlap(prompt, a);
  recovering.prefixOverlap(prompt, b);
  EXPECT_EQ(a, b);
  // And the stream continues from the snapshot's seq.
  EXPECT_TRUE(recovering.applyDelta("d0", {.epoch = 1, .seq = kBatches + 1, .body = BlocksStored{}}).ok());
}

}  // namespace
}  // namespace tandem::routing
