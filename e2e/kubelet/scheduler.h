#pragma once
// The local cluster's scheduler over simulated Nodes (docs/local-cluster.md):
// which node a pod goes to, or why none can take it, worded as
// kube-scheduler words it, so a pod that fits nowhere shows in `kubectl
// describe` as on a real cluster (PodScheduled=False, reason Unschedulable):
//
//   0/3 nodes are available: 1 node(s) had untolerated taint {gpu: true}, 2 Insufficient nvidia.com/gpu.
//
// Filters, per node, in kube-scheduler's order, a node counted under the
// first one it fails: not cordoned (spec.unschedulable), NoSchedule/NoExecute
// taints tolerated, nodeSelector labels, and every requested resource
// (cpu, memory, extended resources such as nvidia.com/gpu or an RDMA
// device) within what is allocatable less what the pods already bound there
// request. Among the nodes that pass, the one with the most room left for
// the pod's requests (the sum of its free fractions), ties by name: pods
// spread, as the default scoring does. No preemption.
//
// Pure; quantities are Kubernetes' ("500m", "2", "1Gi", "512Mi", "1G").

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::kubelet {

// A resource quantity in thousandths ("500m" -> 500, "2" -> 2000, "1Ki" ->
// 1024000). InvalidArgument naming the text for anything else (a negative
// value, an unknown suffix, more than three decimals).
absl::StatusOr<int64_t> parseQuantityMilli(std::string_view text);

struct Taint {
  std::string key, value, effect;  // effect: NoSchedule, PreferNoSchedule, NoExecute
};
struct Toleration {
  std::string key;                  // empty with operator Exists: every key
  std::string op = "Equal";         // Equal or Exists
  std::string value;
  std::string effect;               // empty: every effect
};

struct NodeInfo {
  std::string name;
  std::map<std::string, int64_t> allocatable;  // resource -> thousandths
  std::map<std::string, std::string> labels;
  std::vector<Taint> taints;
  bool unschedulable = false;  // cordoned
};

struct PodNeeds {
  std::map<std::string, int64_t> requests;  // resource -> thousandths, summed over the pod's containers
  std::map<std::string, std::string> node_selector;
  std::vector<Toleration> tolerations;
};

// Why no node can take a pod: kube-scheduler's message.
struct Unschedulable {
  std::string message;
};

// `bound`: per node name, the requests of the pods already bound there.
std::variant<std::string, Unschedulable> schedule(const PodNeeds& pod, const std::vector<NodeInfo>& nodes,
                                                  const std::map<std::string, std::map<std::string, int64_t>>& bound);

}  // namespace tandem::kubelet
