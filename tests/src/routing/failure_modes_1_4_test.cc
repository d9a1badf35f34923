// Issue 14's failure modes 1-4, each as a scenario: the behaviour the issue
// describes, implemented as described, fails it; the tandem policy passes.
// (Modes 5-8: failure_modes_5_8_test.cc.)

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "src/routing/tandem_policy.h"
#include "tests/src/routing/session_sim.h"

namespace tandem::routing {
namespace {

using namespace test_util;  // NOLINT: test helpers

// ---------------------------------------------------------------------------
// Mode 1: two independent round-robin counters (router and session owner)
// drift apart, so turn >= 1 of a session lands on a worker that does not hold it.

// The router places a request it has no owner for with its own round-robin
// counter; the session registry gives each new session an owner with its own
// counter; later turns go to the registered owner.
class TwoCounterRouter {
 public:
  explicit TwoCounterRouter(std::vector<std::string> workers) : workers_(std::move(workers)) {}
  std::string route(const RouteRequest& r) {
    if (r.session) {
      auto it = owner_.find(r.session->value());
      if (it != owner_.end()) return it->second;
      owner_[r.session->value()] = workers_[owner_next_++ % workers_.size()];
    }
    return workers_[router_next_++ % workers_.size()];
  }

 private:
  std::vector<std::string> workers_;
  size_t router_next_ = 0, owner_next_ = 0;
  std::map<std::string, std::string> owner_;
};

// One request without a session (a health probe, a one-shot completion)
// first, then 8 sessions of 5 turns, interleaved.
template <typename RouteFn>
DirectShare runMode1(SessionSim& sim, RouteFn&& route) {
  SessionTraffic traffic;
  DirectShare share;
  RouteRequest one_shot = request(std::nullopt, chain(777, 4));
  sim.serve(route(one_shot), one_shot);
  for (int t = 0; t < 5; ++t) {
    for (int s = 0; s < 8; ++s) {
      RouteRequest r = traffic.turn(s, t);
      share.record(r, t, sim.serve(route(r), r));
    }
  }
  return share;
}

TEST(FailureMode1, TwoRoundRobinCountersDriftButOwnershipFollowsWorkerState) {
  SessionSim bad_sim({.num_decode = 4});
  TwoCounterRouter bad(bad_sim.decodeNames());
  DirectShare bad_share = runMode1(bad_sim, [&](const RouteRequest& r) { return bad.route(r); });
  // Turn 0 was placed by the router's counter, the owner by the registry's,
  // one apart: every session's first follow-up lands where it is not held
  // (1 miss in each session's 4 follow-ups; the KV then follows the owner).
  EXPECT_EQ(bad_share.overall(), 0.75);
  EXPECT_EQ(bad_share.minPerSession(), 0.75);

  SessionSim sim({.num_decode = 4});
  TandemPolicy ours;
  InFlight in_flight;
  DirectShare share = runMode1(sim, [&](const RouteRequest& r) {
    Decision d = mustRoute(ours, r, sim.cluster(), in_flight);
    if (r.session && sim.isResident(d.decode, *r.session)) {
      EXPECT_EQ(d.path, RoutePath::kDirect);
    }
    return d.decode;
  });
  EXPECT_EQ(share.overall(), 1.0);
}

// ---------------------------------------------------------------------------
// Mode 2: a hard cap of sessions per D starves some sessions forever (bimodal:
// some sessions always on the fast path, others never).

// Sessions get an owner D while it has fewer than `cap` owned sessions; a
// session over the cap gets no owner: each turn goes to the least-loaded D
// and D keeps no KV for it.
class CappedRouter {
 public:
  CappedRouter(std::vector<std::string> workers, int cap) : workers_(std::move(workers)), cap_(cap) {}
  // Returns the D and whether the session is owned (its KV is kept).
  std::pair<std::string, bool> route(const RouteRequest& r) {
    auto it = owner_.find(r.session->value());
    if (it != owner_.end()) return {it->second, true};
    for (const auto& w : workers_) {
      if (owned_[w] < cap_) {
        ++owned_[w];
        owner_[r.session->value()] = w;
        return {w, true};
      }
    }
    std::string least = *std::min_element(workers_.begin(), workers_.end(),
                                          [&](const auto& a, const auto& b) { return served_[a] < served_[b]; });
    ++served_[least];
    return {least, false};
  }

 private:
  std::vector<std::string> workers_;
  int cap_;
  std::map<std::string, int> owned_, served_;
  std::map<std::string, std::string> owner_;
};

TEST(FailureMode2, AHardSessionCapStarvesSessionsButMemoryBasedResidencyServesAll) {
  // 4 D of 1000 blocks; 16 sessions of up to 64 + 6 * 8 = 112 blocks fit
  // resident together (4 per D). The cap (2 per D) was set conservatively.
  SessionTraffic traffic;
  SessionSim bad_sim({.num_decode = 4});
  CappedRouter bad(bad_sim.decodeNames(), 2);
  DirectShare bad_share;
  SessionSim sim({.num_decode = 4});
  TandemPolicy ours;
  InFlight in_flight;
  DirectShare share;
  int direct = 0, turns_after_first = 0;
  for (int t = 0; t < 6; ++t) {
    for (int s = 0; s < 16; ++s) {
      RouteRequest r = traffic.turn(s, t);
      auto [d, owned] = bad.route(r);
      bad_share.record(r, t, bad_sim.serve(d, r, owned));
      bool was_resident = false;
      Decision ours_d = routeAndServe(ours, sim, in_flight, r, was_resident);
      share.record(r, t, was_resident);
      if (t > 0) direct += ours_d.path == RoutePath::kDirect ? 1 : 0, ++turns_after_first;
    }
  }
  EXPECT_EQ(bad_share.sessionsAtZero(), 8) << "half the sessions never get the fast path";
  EXPECT_EQ(bad_share.minPerSession(), 0.0);
  EXPECT_GE(share.minPerSession(), 0.5);
  EXPECT_EQ(share.sessionsAtZero(), 0);
  EXPECT_EQ(direct, turns_after_first);
}

// ---------------------------------------------------------------------------
// Mode 3: an overlap-first score: a shared boilerplate prefix pulls every new
// session to the same two hot workers while a third stays cold.

// Highest prefix overlap wins; ties go to the worker with fewer resident
// sessions, then the first.
std::string overlapFirst(const ClusterState& c, const RouteRequest& r) {
  std::vector<int32_t> overlap(c.slotEnd());
  c.prefixOverlap(r.prompt_hashes, overlap);
  const WorkerView* best = nullptr;
  for (uint32_t s = 0; s < c.slotEnd(); ++s) {
    const WorkerView* w = c.worker(WorkerSlot(s));
    if (w == nullptr || !w->canDecode()) continue;
    if (best == nullptr || overlap[s] > overlap[best->ref.slot.value()] ||
        (overlap[s] == overlap[best->ref.slot.value()] && w->num_resident_sessions < best->num_resident_sessions)) {
      best = w;
    }
  }
  return best->name;
}

TEST(FailureMode3, OverlapFirstLeavesAWorkerColdButTheLoadFloorBonusFillsIt) {
  SessionTraffic traffic;  // every prompt starts with the same 64-block system prompt
  auto run = [&](SessionSim& sim, auto&& route) {
    // Two earlier sessions made d0 and d1 hold the boilerplate.
    sim.serve("d0", traffic.turn(100, 0));
    sim.serve("d1", traffic.turn(101, 0));
    for (int s = 0; s < 12; ++s) {
      for (int t = 0; t < 3; ++t) {
        RouteRequest r = traffic.turn(s, t);
        sim.serve(route(r), r);
      }
    }
  };
  SessionSim bad_sim({.num_decode = 3});
  run(bad_sim, [&](const RouteRequest& r) { return overlapFirst(bad_sim.cluster(), r); });
  EXPECT_EQ(bad_sim.numServed("d2"), 0) << "d2 stays cold for the whole run";

  SessionSim sim({.num_decode = 3});
  TandemPolicy ours;
  InFlight in_flight;
  run(sim, [&](const RouteRequest& r) { return mustRoute(ours, r, sim.cluster(), in_flight).decode; });
  for (const auto& d : sim.decodeNames()) {
    EXPECT_GE(sim.numResident(d), 4) << d << ": the 14 sessions spread over the 3 workers";
  }
}

// ---------------------------------------------------------------------------
// Mode 4: on a cache miss, "the worker with the smallest cache" ignores load
// and sends everything to one overloaded worker.

// Highest overlap wins; on a miss (no worker holds the first block), the
// worker holding the fewest blocks.
std::string smallestCacheOnMiss(const ClusterState& c, const RouteRequest& r) {
  std::vector<int32_t> overlap(c.slotEnd());
  c.prefixOverlap(r.prompt_hashes, overlap);
  const WorkerView* best = nullptr;
  bool miss = *std::max_element(overlap.begin(), overlap.end()) == 0;
  for (uint32_t s = 0; s < c.slotEnd(); ++s) {
    const WorkerView* w = c.worker(WorkerSlot(s));
    if (w == nullptr || !w->canDecode()) continue;
    bool better = best == nullptr ||
                  (miss ? w->num_blocks_held < best->num_blocks_held : overlap[s] > overlap[best->ref.slot.value()]);
    if (better) best = w;
  }
  return best->name;
}

TEST(FailureMode4, SmallestCacheOnMissPilesOntoOneWorkerButAMissGoesToTheLeastLoaded) {
  auto setup = [](SessionSim& sim) {
    // d0 restarted (empty cache) and is busy; d1 and d2 hold other sessions and are idle.
    sim.setRunning("d0", 30);
    sim.serve("d1", request("old1", chain(50'000, 200)));
    sim.serve("d2", request("old2", chain(60'000, 200)));
  };
  auto misses = [] {
    std::vector<RouteRequest> out;
    for (int i = 0; i < 12; ++i) out.push_back(request(std::nullopt, chain(900'000 + 1000 * i, 20)));
    return out;
  };
  SessionSim bad_sim({.num_decode = 3});
  setup(bad_sim);
  std::map<std::string, int> bad_count;
  for (const auto& r : misses()) ++bad_count[smallestCacheOnMiss(bad_sim.cluster(), r)];
  EXPECT_EQ(bad_count["d0"], 12) << "every miss goes to the overloaded worker";

  SessionSim sim({.num_decode = 3});
  setup(sim);
  TandemPolicy ours;
  InFlight in_flight;  // a burst: all decided before any finishes
  std::map<std::string, int> count;
  for (const auto& r : misses()) {
    Decision d = mustRoute(ours, r, sim.cluster(), in_flight);
    EXPECT_EQ(d.reason, DecisionReason::kLeastLoaded);
    in_flight.add(d);
    ++count[d.decode];
  }
  EXPECT_EQ(count["d0"], 0);
  EXPECT_EQ(count["d1"], 6);
  EXPECT_EQ(count["d2"], 6);
}

}  // namespace
}  // namespace tandem::routing
