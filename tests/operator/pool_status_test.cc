// An InferencePool's status from what is observed (operator/pool_status.h):
// each role's counts, the Ready reasons (Unschedulable naming the role,
// Creating, RollingOut, NotReady), the endpoint, and transition times that
// move only with the status.

#include "operator/pool_status.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tandem::op {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

PoolSpec pool() {
  auto p = parsePool(json::parse(R"({"metadata": {"name": "tiny", "namespace": "default", "uid": "u", "generation": 4},
                                     "spec": {"model": {"name": "tiny"}}})"));
  EXPECT_TRUE(p.ok());
  return *p;
}

json deployment(int desired, int ready, int updated, int current, int generation = 1, int observed = 1) {
  return {{"metadata", {{"generation", generation}}},
          {"spec", {{"replicas", desired}}},
          {"status",
           {{"observedGeneration", observed}, {"replicas", current}, {"readyReplicas", ready}, {"updatedReplicas", updated}}}};
}

Observed converged() {
  Observed o;
  o.deployments[0] = deployment(1, 1, 1, 1);
  o.deployments[1] = deployment(2, 2, 2, 2);
  o.deployments[2] = deployment(1, 1, 1, 1);
  o.router_service = json{{"spec", {{"clusterIP", "10.96.0.9"}}}};
  return o;
}

const json& cond(const json& status, const std::string& type) {
  for (const json& c : status["conditions"]) {
    if (c["type"] == type) return c;
  }
  static const json none;
  return none;
}

TEST(PoolStatusTest, ConvergedIsReadyWithCountsAndTheEndpoint) {
  const json s = computeStatus(pool(), converged(), json::object(), "t1");
  EXPECT_EQ(s["observedGeneration"], 4);
  EXPECT_EQ(s["decode"]["summary"], "2/2");
  EXPECT_EQ(s["prefill"]["readyReplicas"], 1);
  EXPECT_EQ(s["endpoint"], "10.96.0.9:8000");
  EXPECT_EQ(cond(s, "Ready")["status"], "True");
  EXPECT_EQ(cond(s, "Progressing")["reason"], "Stable");
  EXPECT_EQ(cond(s, "Degraded")["status"], "False");
}

TEST(PoolStatusTest, UnschedulableNamesTheRoleAndWinsOverNotReady) {
  Observed o = converged();
  PoolSpec p = pool();
  p.decode.replicas = 3;
  o.deployments[1] = deployment(3, 2, 3, 3);
  o.pods[1] = {json::parse(R"({"status": {"conditions": [{"type": "PodScheduled", "status": "False",
      "reason": "Unschedulable", "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."}]}})")};
  const json s = computeStatus(p, o, json::object(), "t1");
  EXPECT_EQ(cond(s, "Ready")["reason"], "Unschedulable");
  EXPECT_EQ(cond(s, "Ready")["message"], "decode: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu.");
  EXPECT_EQ(cond(s, "Progressing")["status"], "False") << "blocked on capacity, not progressing";
  EXPECT_EQ(s["decode"]["summary"], "2/3");
}

TEST(PoolStatusTest, CreatingRollingOutAndNotReadyAreToldApart) {
  Observed creating = converged();
  creating.deployments[2].reset();
  EXPECT_EQ(cond(computeStatus(pool(), creating, json::object(), "t"), "Ready")["reason"], "Creating");

  Observed rolling = converged();
  rolling.deployments[1] = deployment(2, 2, 1, 3);
  const json r = computeStatus(pool(), rolling, json::object(), "t");
  EXPECT_EQ(cond(r, "Ready")["reason"], "RollingOut");
  EXPECT_THAT(cond(r, "Ready")["message"].get<std::string>(), HasSubstr("decode: 1/2 updated"));
  EXPECT_EQ(cond(r, "Progressing")["status"], "True");

  Observed unseen = converged();
  unseen.deployments[0] = deployment(1, 1, 1, 1, /*generation=*/2, /*observed=*/1);
  EXPECT_EQ(cond(computeStatus(pool(), unseen, json::object(), "t"), "Ready")["reason"], "RollingOut")
      << "the Deployment controller has not seen the change yet";

  Observed slow = converged();
  slow.deployments[1] = deployment(2, 1, 2, 2);
  const json n = computeStatus(pool(), slow, json::object(), "t");
  EXPECT_EQ(cond(n, "Ready")["reason"], "NotReady");
  EXPECT_EQ(cond(n, "Ready")["message"], "decode: 1/2 ready");

  PoolSpec scaled = pool();
  scaled.decode.replicas = 3;
  Observed edited = converged();  // a Deployment whose replicas someone else changed
  const json e = computeStatus(scaled, edited, json::object(), "t");
  EXPECT_EQ(cond(e, "Ready")["status"], "False") << "status follows the pool, never what was last written";
}

TEST(PoolStatusTest, AnInvalidSpecIsDegradedAndTransitionTimesMoveOnlyWithTheStatus) {
  const json bad = computeStatus(pool(), Observed{}, json::object(), "t1", "spec.decode.replicas: must be between 0 and 1000");
  EXPECT_EQ(cond(bad, "Degraded")["status"], "True");
  EXPECT_EQ(cond(bad, "Degraded")["message"], "spec.decode.replicas: must be between 0 and 1000");
  EXPECT_EQ(cond(bad, "Ready")["reason"], "InvalidSpec");

  const json first = computeStatus(pool(), converged(), json::object(), "t1");
  const json again = computeStatus(pool(), converged(), first, "t2");
  EXPECT_EQ(cond(again, "Ready")["lastTransitionTime"], "t1");
  Observed slow = converged();
  slow.deployments[1] = deployment(2, 1, 2, 2);
  const json changed = computeStatus(pool(), slow, again, "t3");
  EXPECT_EQ(cond(changed, "Ready")["lastTransitionTime"], "t3");
}

}  // namespace
}  // namespace tandem::op
