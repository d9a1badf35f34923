// The windowed failure detector on a FakeClock.

#include "agent/peer_health.h"

#include <gtest/gtest.h>

namespace tandem::agent {
namespace {

TEST(PeerHealthTest, UnhealthyAfterNFailuresWithinTheWindow) {
  FakeClock clock;
  PeerHealth h(3, std::chrono::seconds(10), clock);
  h.recordFailure();
  h.recordFailure();
  EXPECT_TRUE(h.healthy());
  clock.advance(std::chrono::seconds(9));
  h.recordFailure();
  EXPECT_FALSE(h.healthy());
}

TEST(PeerHealthTest, FailuresOutsideTheWindowAreForgotten) {
  FakeClock clock;
  PeerHealth h(3, std::chrono::seconds(10), clock);
  h.recordFailure();
  h.recordFailure();
  clock.advance(std::chrono::milliseconds(10001));
  h.recordFailure();
  EXPECT_TRUE(h.healthy()) << "the first two failures left the window";
  h.recordFailure();
  EXPECT_TRUE(h.healthy());
  h.recordFailure();
  EXPECT_FALSE(h.healthy());
}

TEST(PeerHealthTest, AProbeMakesItHealthyAgainAndStartsAFreshWindow) {
  FakeClock clock;
  PeerHealth h(2, std::chrono::seconds(10), clock);
  h.recordFailure();
  h.recordFailure();
  EXPECT_FALSE(h.healthy());
  clock.advance(std::chrono::hours(1));
  EXPECT_FALSE(h.healthy()) << "time alone does not heal it; a probe does";
  h.recordProbeSuccess();
  EXPECT_TRUE(h.healthy());
  h.recordFailure();
  EXPECT_TRUE(h.healthy());
}

}  // namespace
}  // namespace tandem::agent
