// The agentic workload of issue 14's replay target, in the small model of
// session_sim.h: 52 sessions with staggered starts, about 24 active at once,
// a shared system prompt of ~3000 tokens, appends of ~300 tokens per turn,
// 8 decode workers each sized for about 4 active sessions. The tandem policy
// must serve >= 90 % of turns >= 1 direct-to-D, every session >= 50 %, and
// leave no worker cold. (tandem-replay measures the same with timing and
// queueing; this is the policy alone, turn by turn.)

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "src/routing/tandem_policy.h"
#include "tests/src/routing/session_sim.h"

namespace tandem::routing {
namespace {

using namespace test_util;  // NOLINT: test helpers

struct Outcome {
  DirectShare share;
  double direct_path_share = 0;
  int cold_workers = 0;
};

Outcome runAgentic(int num_decode, int64_t blocks_per_decode) {
  constexpr int kSessions = 52, kTurns = 20;
  SessionTraffic traffic{.system_blocks = 188, .append_blocks = 19, .output_tokens = 300};
  SessionSim sim({.num_decode = num_decode, .blocks_per_decode = blocks_per_decode});
  TandemPolicy policy;
  InFlight in_flight;
  Outcome out;
  int direct = 0, follow_ups = 0;
  // Session k starts at step k * 5 / 6 (1.2 arrivals per step x 20 turns = 24 active).
  for (int step = 0; step < kSessions + kTurns; ++step) {
    for (int k = 0; k < kSessions; ++k) {
      int turn = step - k * 5 / 6;
      if (turn < 0 || turn >= kTurns) continue;
      RouteRequest r = traffic.turn(k, turn);
      bool was_resident = false;
      Decision d = routeAndServe(policy, sim, in_flight, r, was_resident);
      out.share.record(r, turn, was_resident);
      if (turn > 0) {
        ++follow_ups;
        direct += d.path == RoutePath::kDirect ? 1 : 0;
      }
    }
  }
  out.direct_path_share = static_cast<double>(direct) / follow_ups;
  for (const auto& d : sim.decodeNames()) out.cold_workers += sim.numServed(d) == 0 ? 1 : 0;
  return out;
}

TEST(AgenticSessions, EightDecodeWorkersForAboutFourSessionsEach) {
  // A session reaches 188 + 20 * 19 = 568 blocks: 4 of them ~ 2300 blocks.
  Outcome o = runAgentic(8, 2300);
  EXPECT_GE(o.direct_path_share, 0.9);
  EXPECT_GE(o.share.overall(), 0.9);
  EXPECT_GE(o.share.minPerSession(), 0.5);
  EXPECT_EQ(o.cold_workers, 0);
}

TEST(AgenticSessions, SevenDecodeWorkersOfAHundredThousandTokens) {
  // 100K tokens = 6250 blocks of 16.
  Outcome o = runAgentic(7, 6250);
  EXPECT_GE(o.direct_path_share, 0.75);
  EXPECT_EQ(o.cold_workers, 0);
}

}  // namespace
}  // namespace tandem::routing
