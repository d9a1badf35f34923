// The ReplicaSet and Deployment controllers' decisions (e2e/kubelet/workloads.h), pure.

#include "e2e/kubelet/workloads.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "src/k8s/resource.h"

namespace tandem::kubelet {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;

json labels(std::initializer_list<std::pair<const char*, const char*>> kv) {
  json j = json::object();
  for (auto& [k, v] : kv) j[k] = v;
  return j;
}

TEST(SelectorTest, MatchLabelsAndEveryExpressionOperator) {
  const json sel = {{"matchLabels", {{"app", "web"}}},
                    {"matchExpressions",
                     {{{"key", "tier"}, {"operator", "In"}, {"values", {"a", "b"}}},
                      {{"key", "canary"}, {"operator", "DoesNotExist"}},
                      {{"key", "zone"}, {"operator", "Exists"}},
                      {{"key", "env"}, {"operator", "NotIn"}, {"values", {"dev"}}}}}};
  EXPECT_TRUE(selectorMatches(sel, labels({{"app", "web"}, {"tier", "a"}, {"zone", "z1"}})));
  EXPECT_FALSE(selectorMatches(sel, labels({{"app", "db"}, {"tier", "a"}, {"zone", "z1"}})));
  EXPECT_FALSE(selectorMatches(sel, labels({{"app", "web"}, {"tier", "c"}, {"zone", "z1"}})));
  EXPECT_FALSE(selectorMatches(sel, labels({{"app", "web"}, {"tier", "a"}, {"zone", "z1"}, {"canary", "1"}})));
  EXPECT_FALSE(selectorMatches(sel, labels({{"app", "web"}, {"tier", "a"}})));
  EXPECT_FALSE(selectorMatches(sel, labels({{"app", "web"}, {"tier", "a"}, {"zone", "z1"}, {"env", "dev"}})));
  EXPECT_FALSE(selectorMatches(json::object(), labels({{"app", "web"}}))) << "an empty selector selects nothing";
  EXPECT_FALSE(selectorMatches({{"matchExpressions", {{{"key", "a"}, {"operator", "Near"}}}}}, labels({{"a", "1"}})));
}

json replicaSet(int replicas) {
  return {{"metadata", {{"name", "web-abc"}, {"namespace", "default"}, {"uid", "rs-uid"}, {"generation", 4}}},
          {"spec",
           {{"replicas", replicas},
            {"template", {{"metadata", {{"labels", {{"app", "web"}}}}}, {"spec", {{"containers", json::array()}}}}}}}};
}

json pod(const std::string& name, const std::string& created, bool scheduled, bool ready, int cost = 0) {
  json p = {{"metadata",
             {{"name", name},
              {"namespace", "default"},
              {"creationTimestamp", created},
              {"ownerReferences", {{{"uid", "rs-uid"}, {"controller", true}, {"kind", "ReplicaSet"}}}}}},
            {"spec", json::object()},
            {"status",
             {{"phase", scheduled ? "Running" : "Pending"},
              {"conditions", {{{"type", "Ready"}, {"status", ready ? "True" : "False"}}}}}}};
  if (scheduled) p["spec"]["nodeName"] = "n1";
  if (cost != 0) p["metadata"]["annotations"]["controller.kubernetes.io/pod-deletion-cost"] = std::to_string(cost);
  return p;
}

TEST(ReplicaSetPlanTest, CreatesWhatIsMissingAndCountsOnlyItsActivePods) {
  json gone = pod("d", "2026-01-01T00:00:04Z", true, true);
  gone["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z";
  json stranger = pod("e", "2026-01-01T00:00:05Z", true, true);
  stranger["metadata"]["ownerReferences"][0]["uid"] = "other";
  ReplicaSetPlan plan = planReplicaSet(replicaSet(4), {pod("a", "2026-01-01T00:00:01Z", true, true),
                                                       pod("b", "2026-01-01T00:00:02Z", true, false), gone, stranger});
  EXPECT_EQ(plan.create, 2);
  EXPECT_TRUE(plan.remove.empty());
  EXPECT_EQ(plan.status["replicas"], 2);
  EXPECT_EQ(plan.status["readyReplicas"], 1);
  EXPECT_EQ(plan.status["observedGeneration"], 4);
}

TEST(ReplicaSetPlanTest, SurplusPodsGoInKubernetesOrderDeletionCostBeforeAge) {
  const std::vector<json> pods = {
      pod("ready-old", "2026-01-01T00:00:01Z", true, true),
      pod("ready-new", "2026-01-01T00:00:09Z", true, true),
      pod("ready-cheap", "2026-01-01T00:00:02Z", true, true, -10),
      pod("not-ready", "2026-01-01T00:00:03Z", true, false),
      pod("unscheduled", "2026-01-01T00:00:04Z", false, false),
  };
  EXPECT_THAT(planReplicaSet(replicaSet(1), pods).remove,
              ElementsAre("unscheduled", "not-ready", "ready-cheap", "ready-new"));
  EXPECT_THAT(planReplicaSet(replicaSet(3), pods).remove, ElementsAre("unscheduled", "not-ready"));
}

TEST(ReplicaSetPlanTest, PodsFromTheTemplateAreOwnedAndNamedAfterIt) {
  json p = podFromTemplate(replicaSet(1));
  EXPECT_EQ(p["metadata"]["generateName"], "web-abc-");
  EXPECT_EQ(p["metadata"]["labels"]["app"], "web");
  EXPECT_EQ(p["metadata"]["ownerReferences"][0]["uid"], "rs-uid");
  EXPECT_EQ(p["metadata"]["ownerReferences"][0]["controller"], true);
  EXPECT_TRUE(controlledBy(p, "rs-uid"));
}

TEST(PodTemplateHashTest, StableForATemplateAndDifferentForAnother) {
  const json a = {{"metadata", {{"labels", {{"app", "web"}}}}}, {"spec", {{"containers", {{{"name", "c"}}}}}}};
  json b = a;
  b["spec"]["containers"][0]["env"] = {{{"name", "X"}, {"value", "1"}}};
  EXPECT_EQ(podTemplateHash(a), podTemplateHash(json::parse(a.dump())));
  EXPECT_NE(podTemplateHash(a), podTemplateHash(b));
  EXPECT_EQ(podTemplateHash(a).size(), 10u);
}

json deployment(int replicas, const std::string& image, json strategy = nullptr) {
  json d = {{"metadata", {{"name", "web"}, {"namespace", "default"}, {"uid", "d-uid"}, {"generation", 2}}},
            {"spec",
             {{"replicas", replicas},
              {"selector", {{"matchLabels", {{"app", "web"}}}}},
              {"template",
               {{"metadata", {{"labels", {{"app", "web"}}}}},
                {"spec", {{"containers", {{{"name", "c"}, {"image", image}}}}}}}}}}};
  if (!strategy.is_null()) d["spec"]["strategy"] = strategy;
  return d;
}

// The ReplicaSet the controller would have made for `d`, at `replicas`, with `available` pods up.
json ownedSet(const json& d, int replicas, int available, const std::string& created, int revision) {
  const std::string hash = podTemplateHash(d["spec"]["template"]);
  return {{"metadata",
           {{"name", "web-" + hash},
            {"uid", "rs-" + hash},
            {"namespace", "default"},
            {"creationTimestamp", created},
            {"labels", {{"app", "web"}, {"pod-template-hash", hash}}},
            {"annotations", {{"deployment.kubernetes.io/revision", std::to_string(revision)}}},
            {"ownerReferences", {{{"uid", "d-uid"}, {"controller", true}}}}}},
          {"spec", {{"replicas", replicas}}},
          {"status", {{"replicas", available}, {"readyReplicas", available}, {"availableReplicas", available}}}};
}

const WallTime kNow = WallTime(std::chrono::hours(24 * 365 * 56));

TEST(DeploymentPlanTest, AFirstRolloutCreatesOneReplicaSetNamedWithTheTemplateHash) {
  const json d = deployment(3, "tandem:1");
  DeploymentPlan plan = planDeployment(d, {}, {}, kNow);
  ASSERT_TRUE(plan.create.has_value());
  const std::string hash = podTemplateHash(d["spec"]["template"]);
  EXPECT_EQ((*plan.create)["metadata"]["name"], "web-" + hash);
  EXPECT_EQ((*plan.create)["spec"]["replicas"], 3);
  EXPECT_EQ((*plan.create)["spec"]["selector"]["matchLabels"]["pod-template-hash"], hash);
  EXPECT_EQ((*plan.create)["spec"]["template"]["metadata"]["labels"]["pod-template-hash"], hash);
  EXPECT_EQ((*plan.create)["metadata"]["annotations"]["deployment.kubernetes.io/revision"], "1");
  EXPECT_EQ(plan.status["observedGeneration"], 2);
  EXPECT_EQ(plan.status["conditions"][1]["reason"], "NewReplicaSetCreated");
}

TEST(DeploymentPlanTest, ARollingUpdateStaysWithinSurgeAndUnavailableUntilComplete) {
  const json v1 = deployment(4, "tandem:1", {{"type", "RollingUpdate"}, {"rollingUpdate", {{"maxSurge", 1}, {"maxUnavailable", 0}}}});
  json v2 = v1;
  v2["spec"]["template"]["spec"]["containers"][0]["image"] = "tandem:2";
  json old_rs = ownedSet(v1, 4, 4, "2026-01-01T00:00:00Z", 1);

  // Step 1: the new set gets the one surge pod; nothing old goes (nothing new is available).
  DeploymentPlan plan = planDeployment(v2, {old_rs}, {}, kNow);
  ASSERT_TRUE(plan.create.has_value());
  EXPECT_EQ((*plan.create)["spec"]["replicas"], 1);
  EXPECT_EQ((*plan.create)["metadata"]["annotations"]["deployment.kubernetes.io/revision"], "2");
  EXPECT_TRUE(plan.scale.empty());

  // Step 2: the new pod is available: one old pod may go.
  json new_rs = ownedSet(v2, 1, 1, "2026-01-01T00:01:00Z", 2);
  plan = planDeployment(v2, {old_rs, new_rs}, {}, kNow);
  EXPECT_FALSE(plan.create.has_value());
  EXPECT_EQ(plan.scale.at(k8s::objectName(old_rs)), 3);
  EXPECT_FALSE(plan.scale.contains(k8s::objectName(new_rs)));

  // Step 3: old at 3: the new set surges again.
  old_rs["spec"]["replicas"] = 3;
  old_rs["status"] = {{"replicas", 3}, {"readyReplicas", 3}, {"availableReplicas", 3}};
  plan = planDeployment(v2, {old_rs, new_rs}, {}, kNow);
  EXPECT_EQ(plan.scale.at(k8s::objectName(new_rs)), 2);

  // Done: everything new, nothing old.
  old_rs["spec"]["replicas"] = 0;
  old_rs["status"] = {{"replicas", 0}, {"readyReplicas", 0}, {"availableReplicas", 0}};
  new_rs = ownedSet(v2, 4, 4, "2026-01-01T00:01:00Z", 2);
  plan = planDeployment(v2, {old_rs, new_rs}, {}, kNow);
  EXPECT_TRUE(plan.scale.empty());
  EXPECT_EQ(plan.status["updatedReplicas"], 4);
  EXPECT_EQ(plan.status["availableReplicas"], 4);
  EXPECT_EQ(plan.status["conditions"][0]["status"], "True");
  EXPECT_EQ(plan.status["conditions"][1]["reason"], "NewReplicaSetAvailable");
}

TEST(DeploymentPlanTest, RecreateStopsTheOldPodsBeforeStartingNewOnes) {
  const json v1 = deployment(2, "tandem:1", {{"type", "Recreate"}});
  json v2 = v1;
  v2["spec"]["template"]["spec"]["containers"][0]["image"] = "tandem:2";
  json old_rs = ownedSet(v1, 2, 2, "2026-01-01T00:00:00Z", 1);
  auto oldPod = [&](const std::string& name, bool terminating) {
    json p = pod(name, "2026-01-01T00:00:00Z", true, !terminating);
    p["metadata"]["ownerReferences"][0]["uid"] = k8s::objectUid(old_rs);
    if (terminating) p["metadata"]["deletionTimestamp"] = "2026-01-01T00:02:00Z";
    return p;
  };
  DeploymentPlan plan = planDeployment(v2, {old_rs}, {oldPod("a", false), oldPod("b", false)}, kNow);
  ASSERT_TRUE(plan.create.has_value());
  EXPECT_EQ((*plan.create)["spec"]["replicas"], 0);
  EXPECT_EQ(plan.scale.at(k8s::objectName(old_rs)), 0);
  // The old set is at 0 but one pod still stops (its ReplicaSet no longer counts it): wait.
  old_rs["spec"]["replicas"] = 0;
  old_rs["status"] = {{"replicas", 0}};
  json new_rs = ownedSet(v2, 0, 0, "2026-01-01T00:01:00Z", 2);
  plan = planDeployment(v2, {old_rs, new_rs}, {oldPod("b", true)}, kNow);
  EXPECT_FALSE(plan.scale.contains(k8s::objectName(new_rs))) << "new pods would overlap a stopping old one";
  plan = planDeployment(v2, {old_rs, new_rs}, {}, kNow);
  EXPECT_EQ(plan.scale.at(k8s::objectName(new_rs)), 2);
}

TEST(DeploymentPlanTest, ScalingChangesTheOneReplicaSetAndHistoryIsBounded) {
  json d = deployment(5, "tandem:3");
  d["spec"]["revisionHistoryLimit"] = 1;
  json v1 = deployment(5, "tandem:1"), v2 = deployment(5, "tandem:2");
  const json current = ownedSet(d, 2, 2, "2026-01-01T00:02:00Z", 3);
  DeploymentPlan plan = planDeployment(d, {ownedSet(v1, 0, 0, "2026-01-01T00:00:00Z", 1),
                                           ownedSet(v2, 0, 0, "2026-01-01T00:01:00Z", 2), current},
                                       {}, kNow);
  EXPECT_EQ(plan.scale.at(k8s::objectName(current)), 5);
  EXPECT_THAT(plan.remove, ElementsAre("web-" + podTemplateHash(v1["spec"]["template"])));
}

TEST(DeploymentPlanTest, NoProgressPastTheDeadlineIsReportedAsExceeded) {
  json d = deployment(2, "tandem:1");
  d["spec"]["progressDeadlineSeconds"] = 60;
  const json rs = ownedSet(d, 2, 1, "2026-01-01T00:00:00Z", 1);
  DeploymentPlan first = planDeployment(d, {rs}, {}, kNow);
  EXPECT_EQ(first.status["conditions"][1]["status"], "True");
  d["status"] = first.status;
  DeploymentPlan later = planDeployment(d, {rs}, {}, kNow + std::chrono::seconds(61));
  EXPECT_EQ(later.status["conditions"][1]["status"], "False");
  EXPECT_EQ(later.status["conditions"][1]["reason"], "ProgressDeadlineExceeded");
  DeploymentPlan sooner = planDeployment(d, {rs}, {}, kNow + std::chrono::seconds(30));
  EXPECT_EQ(sooner.status["conditions"][1]["status"], "True");
}

TEST(EndpointSliceTest, SelectedPodsWithAddressesAndTheirConditionsAndResolvedPorts) {
  const json svc = {{"metadata", {{"name", "decode"}, {"namespace", "default"}, {"uid", "svc-uid"}}},
                    {"spec",
                     {{"selector", {{"role", "decode"}}},
                      {"ports", {{{"name", "http"}, {"port", 80}, {"targetPort", "api"}},
                                 {{"name", "kv"}, {"port", 8200}}}}}}};
  auto podAt = [](const std::string& name, const std::string& ip, bool ready) {
    json p = pod(name, "2026-01-01T00:00:00Z", true, ready);
    p["metadata"]["labels"] = {{"role", "decode"}};
    p["spec"]["containers"] = {{{"name", "agent"}, {"ports", {{{"name", "api"}, {"containerPort", 8100}}}}}};
    if (!ip.empty()) p["status"]["podIP"] = ip;
    return p;
  };
  json leaving = podAt("d-c", "10.244.77.4", true);
  leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z";
  json other = podAt("p-a", "10.244.77.9", true);
  other["metadata"]["labels"] = {{"role", "prefill"}};
  auto slice = planEndpointSlice(svc, {podAt("d-b", "10.244.77.3", false), podAt("d-a", "10.244.77.2", true),
                                       podAt("d-nip", "", true), leaving, other});
  ASSERT_TRUE(slice.has_value());
  EXPECT_EQ((*slice)["metadata"]["labels"]["kubernetes.io/service-name"], "decode");
  EXPECT_EQ((*slice)["metadata"]["ownerReferences"][0]["uid"], "svc-uid");
  EXPECT_EQ((*slice)["addressType"], "IPv4");
  const json& e = (*slice)["endpoints"];
  ASSERT_EQ(e.size(), 3u) << "the pod without an address and the prefill pod are not in it";
  EXPECT_EQ(e[0]["addresses"][0], "10.244.77.2");
  EXPECT_EQ(e[0]["conditions"], json({{"ready", true}, {"serving", true}, {"terminating", false}}));
  EXPECT_EQ(e[1]["conditions"], json({{"ready", false}, {"serving", false}, {"terminating", false}}));
  EXPECT_EQ(e[2]["conditions"], json({{"ready", false}, {"serving", true}, {"terminating", true}}));
  EXPECT_EQ((*slice)["ports"][0], json({{"name", "http"}, {"port", 8100}, {"protocol", "TCP"}}));
  EXPECT_EQ((*slice)["ports"][1], json({{"name", "kv"}, {"port", 8200}, {"protocol", "TCP"}}));
  // Before any pod has an address a name resolves to nothing; a number written as a string is that number.
  json early = svc;
  early["spec"]["ports"][1]["targetPort"] = "8300";
  auto none = planEndpointSlice(early, {podAt("d-nip", "", true)});
  ASSERT_TRUE(none.has_value());
  EXPECT_TRUE((*none)["endpoints"].empty());
  EXPECT_EQ((*none)["ports"][0]["port"], 0);
  EXPECT_EQ((*none)["ports"][1]["port"], 8300);
  json headless = svc;
  headless["spec"].erase("selector");
  EXPECT_FALSE(planEndpointSlice(headless, {}).has_value()) << "a Service without a selector: its slices are the user's";
}

}  // namespace
}  // namespace tandem::kubelet
