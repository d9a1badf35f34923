#pragma once
// What the process kubelet runs for a Pod object (docs/local-cluster.md):
// each container's command line and environment, the pod's resource needs
// and placement constraints for the scheduler, the probes and the grace
// period, read from the Pod's JSON as the API server stores it.
//
// Images: the machine has no container runtime, so a container whose image's
// repository ends in `tandem` (`ghcr.io/acme/tandem:0.1`, `tandem`) runs its
// command from the local build (`<bin_dir>/<command[0]>` when command[0]
// names no directory); any other image is refused, naming it.
//
// Errors name the field by its path (spec.containers[0].env[2].valueFrom...).
// Pure.

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/statusor.h"
#include "e2e/kubelet/container_process.h"
#include "e2e/kubelet/pod_health.h"
#include "e2e/kubelet/pod_volumes.h"
#include "e2e/kubelet/scheduler.h"

namespace tandem::kubelet {

struct HttpProbe {
  ProbeSpec spec;
  std::string path = "/";
  int port = 0;
};

struct ContainerPlan {
  std::string name;
  ContainerSpec spec;  // argv and env; the kubelet adds the log file and the namespace
  std::optional<HttpProbe> readiness, liveness;
  std::vector<int> ports;  // containerPort of each ports[] entry
  std::vector<MountSpec> mounts;
  std::optional<HttpProbe> pre_stop;  // lifecycle.preStop.httpGet: called before SIGTERM
};

struct PodPlan {
  std::vector<ContainerPlan> containers;
  std::vector<VolumeSpec> volumes;
  PodNeeds needs;  // requests summed over the containers; nodeSelector; tolerations
  Duration grace = std::chrono::seconds(30);  // terminationGracePeriodSeconds
};

absl::StatusOr<PodPlan> planPod(const nlohmann::json& pod, const PodFacts& facts);
// What the scheduler reads (the requests, nodeSelector and tolerations), for
// a pod whose containers may not run here (a bad image is the kubelet's to
// report, after scheduling, as on a real cluster).
absl::StatusOr<PodNeeds> podNeeds(const nlohmann::json& pod);

}  // namespace tandem::kubelet
