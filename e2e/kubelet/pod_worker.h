#pragma once
// One pod on this kubelet, from its binding to its deletion, on a thread of
// its own (as a real kubelet has a worker per pod), so a container that
// takes its whole grace period to stop holds up no other pod.
//
//   network  the pod's namespace and IP (PodNetwork)
//   plan     planPod(); a spec that cannot run here (an unknown image, no
//            command, an unsupported field) is reported in the container's
//            status (waiting, CreateContainerConfigError, the message names
//            the field) and in a Warning event, and nothing runs; what may
//            change (a missing ConfigMap or Secret, a failed API read, a
//            hostPath not there yet) is tried again every 5 s
//   volumes  pod_volumes.h: written under <pods_dir>/<ns>/<pod>/volumes and
//            bind-mounted in each container's mount namespace; configMap,
//            secret, projected and downwardAPI volumes are re-read every
//            volume_sync_period; FailedMount events while one cannot be set up
//   token    the service account's token, from the TokenRequest API
//            (bound to the pod, valid kTokenLifetime), asked again at a
//            volume sync once less than a fifth of its life is left; a
//            ServiceAccount that does not exist keeps the pod waiting
//   run      each container a process (ContainerProcess), its log
//            <pods_dir>/<ns>/<pod>/<container>.log (the previous instance's
//            <container>.log.previous), its process group in ProcessRecords
//   health   readiness and liveness httpGet probes on the pod IP
//            (ProbeTracker); a failed liveness probe stops the container
//   restart  per restartPolicy, with CrashLoopBackOff (RestartBackoff) and
//            restartCount
//   status   phase, podIP, hostIP, startTime, conditions (PodScheduled kept,
//            Initialized, ContainersReady, Ready) and containerStatuses,
//            written (merge patch of /status) whenever they change
//   delete   once the pod has a deletionTimestamp: the preStop httpGet
//            hook (within the grace period), then SIGTERM to every
//            container, SIGKILL after deletionGracePeriodSeconds, the
//            network removed, then the pod deleted with grace 0 (what lets
//            the API server erase it)
//
// Thread-safety: update(), apiDeleted() and shutdown() from any thread.

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "e2e/kubelet/pod_network.h"
#include "e2e/kubelet/pod_spec.h"
#include "e2e/kubelet/pod_volumes.h"
#include "e2e/kubelet/process_records.h"
#include "src/common/clock.h"
#include "src/common/log.h"
#include "src/k8s/client.h"
#include "src/k8s/event_recorder.h"

namespace tandem::kubelet {

struct PodWorkerEnv {
  k8s::Client* client = nullptr;      // not owned
  k8s::EventRecorder* events = nullptr;
  PodNetwork* network = nullptr;
  ProcessRecords* records = nullptr;
  const Clock* clock = nullptr;
  std::string bin_dir;   // where images that run the local build find their commands
  std::string pods_dir;  // <pods_dir>/<ns>/<pod>/<container>.log
  std::string host_ip = "127.0.0.1";
  MountPoints* mounts = nullptr;  // mount points created on the host
  // In-cluster API access for the pods (empty api_host: none): the
  // `kubernetes` Service's address, the API server's CA (PEM).
  std::string api_host, api_port, api_ca_pem;
  Duration volume_sync_period = std::chrono::seconds(10);  // configMap/secret volumes re-read this often
  Duration poll_interval = std::chrono::milliseconds(100);  // how often exits are noticed
};

class PodWorker {
 public:
  // How long the service-account tokens the kubelet asks for last (a real
  // kubelet's default for projected tokens).
  static constexpr std::chrono::seconds kTokenLifetime{3600};

  PodWorker(PodWorkerEnv env, nlohmann::json pod);
  // shutdown(0) if it still runs, then joins.
  ~PodWorker();
  PodWorker(const PodWorker&) = delete;
  PodWorker& operator=(const PodWorker&) = delete;

  // The pod as the API server now has it (its deletionTimestamp starts the deletion).
  void update(nlohmann::json pod);
  // The pod is gone from the API server (deleted with grace 0 by someone
  // else): its containers are stopped within the pod's grace period.
  void apiDeleted();
  // The kubelet is stopping: containers stopped within `grace` (at most the
  // pod's), the network removed, nothing written to the API server.
  void shutdown(Duration grace);
  // The pod's processes and network are gone.
  bool finished() const;
  // "<namespace>/<name>"
  std::string key() const { return ns_ + "/" + name_; }

 private:
  struct Container;
  void run();
  void runContainers();
  void terminate();
  bool waitForChange(MonoTime until);
  void writeStatus(const nlohmann::json& status);
  PodFacts facts(const std::string& ip, const std::string& node) const;
  absl::Status setUpVolumes(const std::vector<VolumeSpec>& volumes, const nlohmann::json& pod, const PodFacts& facts,
                            bool first);
  // Puts a token for the pod's service account in facts.api_token when the
  // volumes hold one: token_ while it has more than a fifth of its life
  // left, else a new one from the TokenRequest API.
  absl::Status refreshToken(const std::vector<VolumeSpec>& volumes, const nlohmann::json& pod, PodFacts& facts);
  std::vector<std::string> launchPrefix(const PodAddress& address, const ContainerPlan& plan,
                                        const std::vector<VolumeSpec>& volumes, absl::Status& error);
  void stopContainer(Container& c, Duration grace, const std::string& ip, const k8s::ObjectReference& ref);

  const PodWorkerEnv env_;
  const Logger log_{"kubelet"};
  const std::string ns_, name_, uid_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  nlohmann::json latest_;
  bool changed_ = false;
  bool api_deleted_ = false;
  std::optional<Duration> shutdown_grace_;
  bool finished_ = false;

  nlohmann::json last_status_ = nlohmann::json::object();  // worker thread only
  // The service account's token and its life (worker thread only).
  std::string token_;
  WallTime token_issued_{}, token_expires_{};
  std::thread thread_;
};

}  // namespace tandem::kubelet
