// Which decode pod goes first on scale-down (operator/deletion_cost.h).

#include "operator/deletion_cost.h"

#include <gtest/gtest.h>

namespace tandem::op {
namespace {

TEST(DeletionCostTest, ReadsTheAgentsGaugesSummedOverSeries) {
  auto load = parseDecodeLoad(R"(# HELP tandem_requests_running Requests running.
# TYPE tandem_requests_running gauge
tandem_requests_running{pool="tiny",role="decode"} 2
tandem_requests_waiting{pool="tiny",role="decode"} 1
tandem_sessions_resident{pool="tiny",role="decode"} 7
tandem_sessions_resident_other{pool="tiny"} 100
tandem_kv_blocks_free{pool="tiny",role="decode"} 400
)");
  ASSERT_TRUE(load.ok()) << load.status();
  EXPECT_EQ(load->running, 2);
  EXPECT_EQ(load->waiting, 1);
  EXPECT_EQ(load->sessions, 7) << "a longer name with the same prefix is another metric";
  EXPECT_EQ(deletionCost(*load), 3007);
}

TEST(DeletionCostTest, RequestsInFlightOutweighSessionsAndTheCostStaysInRange) {
  EXPECT_LT(deletionCost({.sessions = 999}), deletionCost({.running = 1}));
  EXPECT_EQ(deletionCost({}), 0);
  EXPECT_EQ(deletionCost({.running = int64_t{1} << 40}), INT32_MAX);
}

TEST(DeletionCostTest, MetricsWithoutTheGaugesAreRefused) {
  auto load = parseDecodeLoad("tandem_router_ttft_seconds_count 3\n");
  EXPECT_FALSE(load.ok());
  EXPECT_EQ(load.status().message(),
            "no tandem_requests_running, tandem_requests_waiting or tandem_sessions_resident in the agent's metrics");
}

}  // namespace
}  // namespace tandem::op
