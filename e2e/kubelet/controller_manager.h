#pragma once
// The controllers tandem-kubelet plays besides the node (docs/local-cluster.md):
// Deployment → ReplicaSets → Pods, and Service → EndpointSlice
// (workloads.h decides; this reads the informers' caches and writes).
// Level-triggered: informers on deployments, replicasets, pods, services
// and endpointslices feed one work queue of object keys.
//
// A ReplicaSet that has just created or deleted pods waits (up to 5 s) until
// its informer shows as many active pods as it asked for before it acts
// again, so a cache that lags its own writes never doubles a scale-up
// (client-go's "expectations").

#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "src/common/clock.h"
#include "src/common/log.h"
#include "src/k8s/client.h"
#include "src/k8s/event_recorder.h"
#include "src/k8s/informer.h"
#include "src/k8s/work_queue.h"

namespace tandem::kubelet {

class ControllerManager {
 public:
  // Starts the informers and the worker; returns once they listed.
  static absl::StatusOr<std::unique_ptr<ControllerManager>> start(k8s::Client& client);
  ~ControllerManager();
  void stop();

 private:
  explicit ControllerManager(k8s::Client& client);
  absl::Status begin();
  void process();
  void syncReplicaSet(const std::string& key);
  void syncDeployment(const std::string& key);
  void syncService(const std::string& key);
  void enqueueOwner(const nlohmann::json& obj, const char* kind, const char* prefix);
  std::vector<k8s::Informer*> informers() {
    return {deployments_.get(), replicaSets_.get(), pods_.get(), services_.get(), slices_.get()};
  }

  k8s::Client& client_;
  const Logger log_{"controllers"};
  std::unique_ptr<k8s::EventRecorder> events_;
  k8s::WorkQueue queue_;
  std::unique_ptr<k8s::Informer> deployments_, replicaSets_, pods_, services_, slices_;
  std::thread worker_;
  struct Expectation {
    int active = 0;
    MonoTime until;
  };
  std::map<std::string, Expectation> expectations_;  // by ReplicaSet key; worker thread only
  bool stopped_ = false;
};

}  // namespace tandem::kubelet
