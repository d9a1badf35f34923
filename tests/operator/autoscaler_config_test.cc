// The planner's configuration and routing knobs as the operator derives
// them from a pool (operator/autoscaler.h).
#include "operator/autoscaler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "agent/router/routing_knobs.h"
#include "operator/pool.h"

namespace tandem::op {
namespace {

using nlohmann::json;

PoolSpec poolWith(const std::string& policy) {
  auto p = parsePool(json::parse(R"({"metadata": {"name": "tiny", "namespace": "serving", "uid": "u-1"},
    "spec": {"model": {"name": "tiny", "path": "/srv/models/tiny"},
             "router": {"policy": )" + policy + R"(}, "autoscaling": {"enabled": true}}})"));
  EXPECT_TRUE(p.ok()) << p.status();
  return *p;
}

TEST(AutoscalerConfigTest, ThePoolsPolicyIsTheBaseOfTheKnobsAndItsWatermarkIsKept) {
  const planner::PlannerConfig derived = plannerConfigFor(poolWith(R"({"directMaxSuffix": 512})"), std::nullopt);
  EXPECT_EQ(derived.base_knobs.direct_max_suffix_tokens, 512);
  EXPECT_FALSE(derived.prefill_overload_from_pool) << "no watermark in the pool: the planner derives it";

  const planner::PlannerConfig fixed =
      plannerConfigFor(poolWith(R"({"prefillOverloadTokens": 20000, "loadFloorWeight": 0.5})"), std::nullopt);
  EXPECT_TRUE(fixed.prefill_overload_from_pool);
  EXPECT_EQ(fixed.base_knobs.prefill_overload_tokens, 20000);
  EXPECT_DOUBLE_EQ(fixed.base_knobs.load_floor_weight, 0.5);
}

TEST(AutoscalerConfigTest, GrowthIsCheckedEveryThirdOfTheIntervalUnlessThePoolSays) {
  PoolSpec pool = poolWith("{}");
  pool.autoscaling.interval_s = 60;
  EXPECT_DOUBLE_EQ(plannerConfigFor(pool, std::nullopt).scale_up_check_s, 20);
  pool.autoscaling.scale_up_check_s = 0;
  EXPECT_DOUBLE_EQ(plannerConfigFor(pool, std::nullopt).scale_up_check_s, 0);
  EXPECT_TRUE(planner::validatePlannerConfig(plannerConfigFor(pool, std::nullopt)).ok());
}

TEST(AutoscalerConfigTest, TheRoutingConfigMapCarriesEveryKnobTheRoutersRead) {
  const PoolSpec pool = poolWith("{}");
  const json cm = routingConfigMap(pool, json{{"apiVersion", "serving.tandem.dev/v1alpha1"}},
                                   planner::RoutingKnobs{.direct_max_suffix_tokens = 4096,
                                                         .load_floor_weight = 3,
                                                         .prefill_overload_tokens = 32000});
  EXPECT_EQ(cm["metadata"]["name"], "tiny-routing");
  EXPECT_EQ(cm["metadata"]["ownerReferences"][0]["uid"], "u-1");
  const json knobs = json::parse(cm["data"]["knobs.json"].get<std::string>());
  EXPECT_EQ(knobs, (json{{"directMaxSuffixTokens", 4096}, {"loadFloorWeight", 3.0}, {"prefillOverloadTokens", 32000}}));
  // What the routers read from it (agent/router/routing_knobs.h).
  auto applied = agent::applyRoutingKnobs(routing::RouterConfig{}, cm["data"]["knobs.json"].get<std::string>());
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_EQ(applied->direct_max_suffix_tokens, 4096);
  EXPECT_DOUBLE_EQ(applied->load_floor_weight, 3);
  EXPECT_EQ(applied->prefill_overload_tokens, 32000);
}

}  // namespace
}  // namespace tandem::op
