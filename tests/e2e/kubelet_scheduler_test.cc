// The local cluster's scheduler (e2e/kubelet/scheduler.h): quantities, the
// filters (cordon, nodeSelector, taints, resources) and kube-scheduler's
// wording of why a pod fits nowhere.

#include "e2e/kubelet/scheduler.h"

#include <gtest/gtest.h>

namespace tandem::kubelet {
namespace {

TEST(QuantityTest, KubernetesQuantitiesInThousandths) {
  EXPECT_EQ(*parseQuantityMilli("500m"), 500);
  EXPECT_EQ(*parseQuantityMilli("2"), 2000);
  EXPECT_EQ(*parseQuantityMilli("0.5"), 500);
  EXPECT_EQ(*parseQuantityMilli("1.25"), 1250);
  EXPECT_EQ(*parseQuantityMilli("1Ki"), 1024000);
  EXPECT_EQ(*parseQuantityMilli("512Mi"), int64_t{512} * 1024 * 1024 * 1000);
  EXPECT_EQ(*parseQuantityMilli("1G"), int64_t{1000000000} * 1000);
  EXPECT_EQ(*parseQuantityMilli("1.5Gi"), int64_t{3} * (int64_t{1} << 29) * 1000);
  for (const char* bad : {"", "-1", "1.2345", "1x", "m", ".5", "5.", "1.5m", "1..2", "99999999999Ti", "999999999999999999"}) {
    auto q = parseQuantityMilli(bad);
    EXPECT_FALSE(q.ok()) << bad;
    EXPECT_NE(std::string(q.status().message()).find("quantity \"" + std::string(bad) + "\""), std::string::npos);
  }
}

NodeInfo node(std::string name, int64_t gpus, std::vector<Taint> taints = {}) {
  return {.name = std::move(name),
          .allocatable = {{"cpu", 8000}, {"memory", int64_t{32} << 30}, {"nvidia.com/gpu", gpus * 1000}},
          .labels = {{"kubernetes.io/hostname", "x"}},
          .taints = std::move(taints)};
}

TEST(SchedulerTest, APodGoesWhereItFitsWithTheMostRoomLeft) {
  const std::vector<NodeInfo> nodes = {node("node-a", 4), node("node-b", 4)};
  const PodNeeds pod{.requests = {{"cpu", 1000}, {"nvidia.com/gpu", 1000}}};
  EXPECT_EQ(std::get<std::string>(schedule(pod, nodes, {})), "node-a");  // a tie: by name
  // node-a holds a pod already: node-b has more room.
  EXPECT_EQ(std::get<std::string>(schedule(pod, nodes, {{"node-a", {{"cpu", 1000}, {"nvidia.com/gpu", 1000}}}})),
            "node-b");
}

TEST(SchedulerTest, APodThatFitsNowhereIsExplainedAsKubeSchedulerDoes) {
  const std::vector<NodeInfo> nodes = {node("gpu-0", 8, {{.key = "gpu", .value = "true", .effect = "NoSchedule"}}),
                                       node("cpu-0", 0), node("cpu-1", 0)};
  const PodNeeds greedy{.requests = {{"nvidia.com/gpu", 16000}}};
  EXPECT_EQ(std::get<Unschedulable>(schedule(greedy, nodes, {})).message,
            "0/3 nodes are available: 1 node(s) had untolerated taint {gpu: true}, 2 Insufficient nvidia.com/gpu.")
      << "the tainted node is counted for its taint only";
  // Tolerating the taint, it still needs more GPUs than any node has.
  PodNeeds tolerant = greedy;
  tolerant.tolerations = {{.key = "gpu", .op = "Equal", .value = "true", .effect = "NoSchedule"}};
  EXPECT_EQ(std::get<Unschedulable>(schedule(tolerant, nodes, {})).message,
            "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.");
  // Asking for what one node has, tolerating its taint: it goes there.
  tolerant.requests = {{"nvidia.com/gpu", 8000}};
  EXPECT_EQ(std::get<std::string>(schedule(tolerant, nodes, {})), "gpu-0");
  // An Exists toleration without a key tolerates every taint.
  PodNeeds anything{.requests = {{"nvidia.com/gpu", 1000}}, .tolerations = {{.op = "Exists"}}};
  EXPECT_EQ(std::get<std::string>(schedule(anything, nodes, {})), "gpu-0");
}

TEST(SchedulerTest, CordonedAndUnselectedNodesAreCountedByReason) {
  std::vector<NodeInfo> nodes = {node("a", 1), node("b", 1), node("c", 1)};
  nodes[0].unschedulable = true;
  nodes[1].labels["pool"] = "decode";
  nodes[2].labels["pool"] = "prefill";
  PodNeeds pod{.requests = {{"nvidia.com/gpu", 1000}}, .node_selector = {{"pool", "decode"}}};
  EXPECT_EQ(std::get<std::string>(schedule(pod, nodes, {})), "b");
  EXPECT_EQ(std::get<Unschedulable>(schedule(pod, nodes, {{"b", {{"nvidia.com/gpu", 1000}}}})).message,
            "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't match Pod's node "
            "affinity/selector, 1 node(s) were unschedulable.");
  EXPECT_EQ(std::get<Unschedulable>(schedule(pod, {}, {})).message, "no nodes available to schedule pods");
}

TEST(SchedulerTest, PreferNoScheduleTaintsDoNotFilter) {
  const std::vector<NodeInfo> nodes = {node("soft", 1, {{.key = "spot", .value = "", .effect = "PreferNoSchedule"}})};
  EXPECT_EQ(std::get<std::string>(schedule({.requests = {{"cpu", 100}}}, nodes, {})), "soft");
}

}  // namespace
}  // namespace tandem::kubelet
