#include "e2e/kubelet/pod_worker.h"

#include <algorithm>
#include <filesystem>
#include <future>

#include "e2e/kubelet/container_process.h"
#include "e2e/kubelet/pod_health.h"
#include "e2e/kubelet/pod_spec.h"
#include "src/common/strings.h"
#include "src/http/client.h"
#include "src/k8s/resource.h"

namespace tandem::kubelet {

using nlohmann::json;
namespace fs = std::filesystem;

struct PodWorker::Container {
  ContainerPlan plan;
  std::string log_file;
  std::unique_ptr<ContainerProcess> proc;
  RestartBackoff backoff;
  std::optional<ProbeTracker> readiness, liveness;
  MonoTime started{};
  std::string started_at;
  std::optional<MonoTime> restart_at;  // when a stopped container runs again
  json state = json::object();         // containerStatuses[].state
  json last_state = json::object();
  bool finished = false;  // will not run again (restartPolicy)
  bool ever_started = false;
  bool ready() const { return proc != nullptr && (!readiness || readiness->ready()); }
};

namespace {

std::string str(const json& j, const json::json_pointer& p) {
  return j.contains(p) && j.at(p).is_string() ? j.at(p).get<std::string>() : "";
}

json waiting(std::string reason, std::string message) {
  json w = {{"reason", std::move(reason)}};
  if (!message.empty()) w["message"] = std::move(message);
  return {{"waiting", w}};
}

json condition(const char* type, bool status, const json& previous, const std::string& now) {
  // lastTransitionTime moves only when the status does.
  const std::string s = status ? "True" : "False";
  std::string since = now;
  for (const auto& c : previous) {
    if (c.value("type", "") == type && c.value("status", "") == s) since = c.value("lastTransitionTime", now);
  }
  return {{"type", type}, {"status", s}, {"lastProbeTime", nullptr}, {"lastTransitionTime", since}};
}

bool httpProbe(const std::string& ip, const HttpProbe& p) {
  auto r = http::httpGet(strCat("http://", ip, ":", p.port, p.path), p.spec.timeout);
  return r.ok() && r->status >= 200 && r->status < 400;
}

}  // namespace

PodWorker::PodWorker(PodWorkerEnv env, json pod)
    : env_(std::move(env)),
      ns_(str(pod, "/metadata/namespace"_json_pointer)),
      name_(str(pod, "/metadata/name"_json_pointer)),
      uid_(str(pod, "/metadata/uid"_json_pointer)),
      latest_(std::move(pod)) {
  thread_ = std::thread([this] { run(); });
}

PodWorker::~PodWorker() {
  shutdown(Duration::zero());
  if (thread_.joinable()) thread_.join();
}

void PodWorker::update(json pod) {
  std::lock_guard l(mu_);
  latest_ = std::move(pod);
  changed_ = true;
  cv_.notify_all();
}

void PodWorker::apiDeleted() {
  std::lock_guard l(mu_);
  api_deleted_ = true;
  cv_.notify_all();
}

void PodWorker::shutdown(Duration grace) {
  std::lock_guard l(mu_);
  if (!shutdown_grace_ || grace < *shutdown_grace_) shutdown_grace_ = grace;
  cv_.notify_all();
}

bool PodWorker::finished() const {
  std::lock_guard l(mu_);
  return finished_;
}

// Waits until `until` or a change; true when the pod is to stop.
bool PodWorker::waitForChange(MonoTime until) {
  std::unique_lock l(mu_);
  const auto stopping = [&] {
    return api_deleted_ || shutdown_grace_.has_value() || latest_["metadata"].contains("deletionTimestamp");
  };
  while (!stopping() && !changed_ && env_.clock->now() < until) {
    cv_.wait_for(l, std::min<Duration>(until - env_.clock->now(), env_.poll_interval));
  }
  changed_ = false;
  return stopping();
}

void PodWorker::writeStatus(const json& status) {
  if (status == last_status_) return;
  {
    std::lock_guard l(mu_);
    if (api_deleted_ || shutdown_grace_) return;
  }
  auto r = env_.client->mergePatchStatus(k8s::podsResource(), ns_, name_, {{"status", status}});
  if (r.ok()) {
    last_status_ = status;
  } else if (!absl::IsNotFound(r.status())) {
    log_.warn("cannot write the pod's status", {{"pod", strCat(ns_, "/", name_)}, {"error", std::string(r.status().message())}});
  }
}

PodFacts PodWorker::facts(const std::string& ip, const std::string& node) const {
  PodFacts f{.name = name_, .ns = ns_, .pod_ip = ip, .node_name = node, .bin_dir = env_.bin_dir};
  f.lookup = [this](std::string_view kind, std::string_view name) -> absl::StatusOr<json> {
    return env_.client->get(kind == "Secret" ? k8s::secretsResource() : k8s::configMapsResource(), ns_, name);
  };
  f.api_host = env_.api_host;
  f.api_port = env_.api_port;
  f.api_ca_pem = env_.api_ca_pem;
  return f;
}

absl::Status PodWorker::setUpVolumes(const std::vector<VolumeSpec>& volumes, const json& pod, const PodFacts& facts,
                                     bool first) {
  const fs::path dir = fs::path(env_.pods_dir) / ns_ / name_ / "volumes";
  for (const VolumeSpec& v : volumes) {
    absl::Status s;
    if (v.kind == VolumeSpec::Kind::kFiles) {
      absl::StatusOr<std::vector<VolumeFile>> files = renderVolume(v, pod, facts);
      s = files.ok() ? writeVolumeFiles((dir / v.name).string(), *files).status() : files.status();
    } else if (first && v.kind == VolumeSpec::Kind::kEmptyDir) {
      std::error_code ec;
      fs::create_directories(dir / v.name, ec);
      if (ec) s = absl::InternalError(strCat("cannot create ", (dir / v.name).string(), ": ", ec.message()));
    } else if (first && v.kind == VolumeSpec::Kind::kHostPath) {
      s = prepareHostPath(v);
    }
    if (!s.ok()) {
      return absl::Status(s.code(), strCat("MountVolume.SetUp failed for volume \"", v.name, "\" : ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status PodWorker::refreshToken(const std::vector<VolumeSpec>& volumes, const json& pod, PodFacts& facts) {
  if (!needsServiceAccountToken(volumes)) return absl::OkStatus();
  const WallTime now = env_.clock->wallNow();
  if (!token_.empty() && now < token_expires_ - (token_expires_ - token_issued_) / 5) {
    facts.api_token = token_;
    return absl::OkStatus();
  }
  std::string sa = str(pod, "/spec/serviceAccountName"_json_pointer);
  if (sa.empty()) sa = str(pod, "/spec/serviceAccount"_json_pointer);
  if (sa.empty()) sa = "default";
  const json request = {
      {"apiVersion", "authentication.k8s.io/v1"},
      {"kind", "TokenRequest"},
      {"spec",
       {{"expirationSeconds", kTokenLifetime.count()},
        {"boundObjectRef", {{"apiVersion", "v1"}, {"kind", "Pod"}, {"name", name_}, {"uid", uid_}}}}}};
  absl::StatusOr<json> r = env_.client->send({.method = "POST",
                                              .path = strCat("/api/v1/namespaces/", ns_, "/serviceaccounts/", sa, "/token"),
                                              .contentType = "application/json",
                                              .body = request.dump()});
  const std::string token = r.ok() ? str(*r, "/status/token"_json_pointer) : "";
  if (token.empty()) {
    return absl::Status(r.ok() ? absl::StatusCode::kInternal : r.status().code(),
                        strCat("cannot get a token for service account ", ns_, "/", sa, ": ",
                               r.ok() ? "the TokenRequest's answer has no status.token" : r.status().message()));
  }
  token_ = token;
  token_issued_ = now;
  token_expires_ = now + std::chrono::seconds(r->value("/spec/expirationSeconds"_json_pointer, kTokenLifetime.count()));
  facts.api_token = token_;
  return absl::OkStatus();
}

// The command that starts a container inside the pod: the network
// namespace (`ip netns exec`, which also gives it a mount namespace of its
// own), a UTS namespace with the pod's name as host name, then each volume
// bind-mounted at its mountPath (read-only ones remounted so), then exec.
std::vector<std::string> PodWorker::launchPrefix(const PodAddress& address, const ContainerPlan& plan,
                                                 const std::vector<VolumeSpec>& volumes, absl::Status& error) {
  std::vector<std::string> prefix = env_.network->execPrefix(address);
  if (!env_.network->usesNamespaces()) {
    if (!plan.mounts.empty()) {
      error = absl::InvalidArgumentError(
          strCat("container ", plan.name, " mounts volumes, which need the kubelet's namespaces (it runs without root here)"));
    }
    return prefix;
  }
  static constexpr const char* kScript =
      "hostname \"$0\" || exit 1\n"
      "while [ \"$1\" != -- ]; do\n"
      "  mount --bind \"$1\" \"$2\" || exit 1\n"
      "  if [ \"$3\" = ro ]; then mount -o remount,bind,ro \"$2\" || exit 1; fi\n"
      "  shift 3\n"
      "done\n"
      "shift\n"
      "exec \"$@\"";
  for (const char* a : {"unshare", "--uts", "--", "/bin/sh", "-c", kScript}) prefix.push_back(a);
  prefix.push_back(name_.substr(0, 63));
  std::vector<MountSpec> mounts = plan.mounts;
  const fs::path volumes_dir = fs::path(env_.pods_dir) / ns_ / name_ / "volumes";
  // The volumes' files live in this kubelet's state directory on the host,
  // so a mount over one of its ancestors (an emptyDir at /tmp while the
  // state is under /tmp) would hide every source mounted after it: such
  // mounts go last. Otherwise a parent before what is mounted inside it.
  const std::string state = fs::weakly_canonical(volumes_dir).string();
  auto hidesState = [&](const MountSpec& m) {
    const std::string dir = m.mount_path.back() == '/' ? m.mount_path : m.mount_path + "/";
    return state.compare(0, dir.size(), dir) == 0;
  };
  std::sort(mounts.begin(), mounts.end(), [&](const MountSpec& a, const MountSpec& b) {
    const bool ha = hidesState(a), hb = hidesState(b);
    return ha != hb ? hb : a.mount_path < b.mount_path;
  });
  for (const MountSpec& hiding : mounts) {
    if (!hidesState(hiding)) continue;
    for (const MountSpec& m : mounts) {
      if (!hidesState(m) && m.mount_path.rfind(hiding.mount_path + "/", 0) == 0) {
        error = absl::InvalidArgumentError(
            strCat("container ", plan.name, ": mountPath ", m.mount_path, " is inside ", hiding.mount_path,
                   ", which holds this kubelet's state directory (", state, "): not supported here"));
        return prefix;
      }
    }
  }
  for (const MountSpec& m : mounts) {
    auto vol = std::find_if(volumes.begin(), volumes.end(), [&](const VolumeSpec& v) { return v.name == m.volume; });
    const bool host = vol != volumes.end() && vol->kind == VolumeSpec::Kind::kHostPath;
    fs::path source = host ? fs::path(vol->host_path) : volumes_dir / m.volume;
    std::error_code ec;
    if (!m.sub_path.empty()) {
      source /= m.sub_path;
      // As a real kubelet does for a directory volume: a missing subPath is created.
      if (!fs::exists(source, ec) && vol != volumes.end() && vol->kind == VolumeSpec::Kind::kEmptyDir) {
        fs::create_directories(source, ec);
      }
    }
    if (!fs::exists(source, ec)) {
      error = absl::FailedPreconditionError(strCat("container ", plan.name, ": ", source.string(), " (volume \"",
                                                   m.volume, "\") does not exist"));
      return prefix;
    }
    if (absl::Status s = env_.mounts->ensure(m.mount_path, !fs::is_directory(source, ec)); !s.ok()) {
      error = absl::Status(s.code(), strCat("container ", plan.name, ": ", s.message()));
      return prefix;
    }
    prefix.push_back(source.string());
    prefix.push_back(m.mount_path);
    prefix.push_back(m.read_only ? "ro" : "rw");
  }
  prefix.push_back("--");
  return prefix;
}

// preStop (httpGet, within the grace period), then SIGTERM and SIGKILL
// once what is left of the grace period is over.
void PodWorker::stopContainer(Container& c, Duration grace, const std::string& ip, const k8s::ObjectReference& ref) {
  if (c.plan.pre_stop && !c.proc->poll()) {
    const MonoTime began = env_.clock->now();
    const HttpProbe& hook = *c.plan.pre_stop;
    const std::string url = strCat("http://", ip, ":", hook.port, hook.path);
    auto r = http::httpGet(url, std::max<Duration>(grace, std::chrono::seconds(1)));
    if (!r.ok() || r->status < 200 || r->status >= 400) {
      const std::string why = r.ok() ? strCat("HTTP ", r->status) : std::string(r.status().message());
      (void)env_.events->record(ref, k8s::EventType::kWarning, "FailedPreStopHook", "Kill",
                                strCat("PreStopHook failed for container ", c.plan.name, ": GET ", url, ": ", why));
    }
    grace = std::max<Duration>(Duration::zero(), grace - (env_.clock->now() - began));
  }
  c.proc->stop(grace);
}

void PodWorker::run() {
  runContainers();
  terminate();
  std::lock_guard l(mu_);
  finished_ = true;
}

void PodWorker::runContainers() {
  json pod;
  {
    std::lock_guard l(mu_);
    pod = latest_;
  }
  const std::string key = strCat(ns_, "/", name_);
  const k8s::ObjectReference ref = k8s::ObjectReference::of(pod);
  const std::string restart_policy = pod["spec"].value("restartPolicy", "Always");
  const std::string node = pod["spec"].value("nodeName", "");
  const std::string start_time = k8s::formatTime(env_.clock->wallNow());
  // Bound to this node: scheduled, whatever an earlier (Unschedulable) condition said.
  const json scheduled = condition("PodScheduled", true, pod.value("/status/conditions"_json_pointer, json::array()),
                                   start_time);

  // The network first: the plan's environment may name the pod's IP.
  const std::string hostname = name_.substr(0, 63);
  absl::StatusOr<PodAddress> address = env_.network->addPod(strCat(ns_, ".", name_), hostname);
  while (!address.ok()) {
    log_.warn("cannot give the pod its network", {{"pod", key}, {"error", std::string(address.status().message())}});
    (void)env_.events->record(ref, k8s::EventType::kWarning, "FailedCreatePodSandBox", "Create",
                        strCat("cannot set up the pod's network: ", address.status().message()));
    if (waitForChange(env_.clock->now() + std::chrono::seconds(5))) return;
    address = env_.network->addPod(strCat(ns_, ".", name_), hostname);
  }
  const std::string ip = address->ip;
  const fs::path dir = fs::path(env_.pods_dir) / ns_ / name_;
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);

  // The plan, the volumes and each container's command: tried again while
  // what they need (a ConfigMap, a Secret) is missing.
  PodFacts pod_facts = facts(ip, node);
  std::vector<Container> containers;
  std::optional<PodPlan> plan;
  std::string plan_error, waiting_reason;
  std::optional<MonoTime> prepare_at = env_.clock->now();
  MonoTime volume_sync_at{};
  const auto prepare = [&] {
    prepare_at.reset();
    absl::StatusOr<PodPlan> planned = planPod(pod, pod_facts);
    absl::Status failed = planned.status();
    waiting_reason = "CreateContainerConfigError";
    const char* event_reason = "Failed";
    if (failed.ok()) {
      failed = refreshToken(planned->volumes, pod, pod_facts);
      if (failed.ok()) failed = setUpVolumes(planned->volumes, pod, pod_facts, /*first=*/true);
      waiting_reason = "ContainerCreating";
      event_reason = "FailedMount";
    }
    std::vector<Container> built;
    for (size_t i = 0; failed.ok() && i < planned->containers.size(); ++i) {
      ContainerPlan& c = planned->containers[i];
      Container k;
      k.log_file = (dir / (c.name + ".log")).string();
      c.spec.log_file = k.log_file;
      c.spec.exec_prefix = launchPrefix(*address, c, planned->volumes, failed);
      k.plan = std::move(c);
      k.restart_at = env_.clock->now();
      built.push_back(std::move(k));
    }
    if (!failed.ok()) {
      plan_error = std::string(failed.message());
      // A spec that cannot run here (InvalidArgument, naming the field) never
      // will; anything else (a ConfigMap not there yet, the API server
      // failing a read, a hostPath not made yet) is tried again, as a real
      // kubelet keeps trying to mount.
      const bool waits = !absl::IsInvalidArgument(failed);
      log_.warn(waits ? "the pod waits for what it needs" : "the pod cannot run here",
                {{"pod", key}, {"error", plan_error}});
      (void)env_.events->record(ref, k8s::EventType::kWarning, event_reason, "Create", plan_error);
      if (waits) prepare_at = env_.clock->now() + std::chrono::seconds(5);
      return;
    }
    plan = std::move(*planned);
    containers = std::move(built);
    plan_error.clear();
    volume_sync_at = env_.clock->now() + env_.volume_sync_period;
  };
  prepare();

  bool stopping = false;
  while (!stopping) {
    if (prepare_at && *prepare_at <= env_.clock->now()) prepare();
    const MonoTime now = env_.clock->now();
    MonoTime next = now + std::chrono::seconds(1);
    if (prepare_at) next = std::min(next, *prepare_at);
    if (plan && volume_sync_at <= now) {
      // ConfigMaps and Secrets change under running pods, as on a real node.
      json latest;
      {
        std::lock_guard l(mu_);
        latest = latest_;
      }
      if (absl::Status s = refreshToken(plan->volumes, latest, pod_facts); !s.ok()) {
        log_.warn("cannot renew the pod's service-account token (the old one stays)",
                  {{"pod", key}, {"error", std::string(s.message())}});
      }
      if (absl::Status s = setUpVolumes(plan->volumes, latest, pod_facts, /*first=*/false); !s.ok()) {
        log_.warn("cannot refresh the pod's volumes (the old contents stay)", {{"pod", key}, {"error", std::string(s.message())}});
      }
      volume_sync_at = now + env_.volume_sync_period;
    }
    for (Container& c : containers) {
      const std::string cname = c.plan.name;
      if (c.proc) {
        std::optional<int> exit = c.proc->poll();
        if (!exit && c.liveness && c.liveness->failed()) {
          (void)env_.events->record(ref, k8s::EventType::kNormal, "Killing", "Kill",
                              strCat("Container ", cname, " failed liveness probe, will be restarted"));
          stopContainer(c, plan->grace, ip, ref);
          exit = c.proc->poll();
        }
        if (exit) {
          (void)env_.records->remove(c.proc->pid());
          c.proc.reset();
          const std::string finished_at = k8s::formatTime(env_.clock->wallNow());
          json terminated = {{"exitCode", *exit},
                             {"reason", *exit == 0 ? "Completed" : "Error"},
                             {"startedAt", c.started_at},
                             {"finishedAt", finished_at}};
          c.last_state = {{"terminated", terminated}};
          // A container its liveness probe stopped exits non-zero (SIGTERM): restarted unless Never.
          const bool again = restart_policy == "Always" || (restart_policy == "OnFailure" && *exit != 0);
          if (again) {
            const Duration wait = c.backoff.onExit(c.started, now);
            c.restart_at = now + wait;
            c.state = waiting("CrashLoopBackOff",
                              strCat("back-off ", std::chrono::duration_cast<std::chrono::seconds>(wait).count(),
                                     "s restarting failed container=", cname, " pod=", name_, "_", ns_));
            (void)env_.events->record(ref, k8s::EventType::kWarning, "BackOff", "Start",
                                strCat("Back-off restarting failed container ", cname, " (exit code ", *exit, ")"));
          } else {
            c.finished = true;
            c.state = {{"terminated", terminated}};
          }
        }
      }
      if (!c.proc && !c.finished && c.restart_at && *c.restart_at <= now) {
        std::error_code ignored;
        if (fs::exists(c.log_file)) fs::rename(c.log_file, c.log_file + ".previous", ignored);
        absl::StatusOr<std::unique_ptr<ContainerProcess>> p = ContainerProcess::start(c.plan.spec);
        if (!p.ok()) {
          c.state = waiting("CreateContainerError", std::string(p.status().message()));
          (void)env_.events->record(ref, k8s::EventType::kWarning, "Failed", "Start", std::string(p.status().message()));
          c.restart_at = now + RestartBackoff::kInitial;  // tried again; not a restart of a container that ran
        } else {
          c.proc = std::move(*p);
          c.ever_started = true;
          if (absl::Status r = env_.records->add(c.proc->pid()); !r.ok()) {
            log_.warn("cannot record the container's process group: a kubelet crash would leave it running",
                      {{"pod", key}, {"error", std::string(r.message())}});
          }
          c.started = now;
          c.started_at = k8s::formatTime(env_.clock->wallNow());
          c.restart_at.reset();
          c.state = {{"running", {{"startedAt", c.started_at}}}};
          if (c.plan.readiness) c.readiness.emplace(ProbeKind::kReadiness, c.plan.readiness->spec, now);
          if (c.plan.liveness) c.liveness.emplace(ProbeKind::kLiveness, c.plan.liveness->spec, now);
          (void)env_.events->record(ref, k8s::EventType::kNormal, "Started", "Start", strCat("Started container ", cname));
        }
      }
      if (c.proc) {
        for (auto* probe : {&c.readiness, &c.liveness}) {
          if (!*probe) continue;
          const HttpProbe& spec = probe == &c.readiness ? *c.plan.readiness : *c.plan.liveness;
          if ((*probe)->nextProbe() <= env_.clock->now()) {
            const MonoTime began = env_.clock->now();
            const bool ok = httpProbe(ip, spec);
            (*probe)->record(ok, began, env_.clock->now());
            if (!ok) {  // every failure, as a real kubelet reports them (the recorder counts repeats)
              (void)env_.events->record(ref, k8s::EventType::kWarning, "Unhealthy", "Probe",
                                  strCat(probe == &c.readiness ? "Readiness" : "Liveness", " probe failed: GET http://",
                                         ip, ":", spec.port, spec.path));
            }
          }
          next = std::min(next, (*probe)->nextProbe());
        }
      }
      if (c.restart_at) next = std::min(next, *c.restart_at);
    }

    // Status.
    const std::string now_text = k8s::formatTime(env_.clock->wallNow());
    json statuses = json::array();
    bool all_ready = !containers.empty(), any_running = false, all_finished = !containers.empty(), all_zero = true;
    for (Container& c : containers) {
      const bool ready = c.ready();
      all_ready = all_ready && ready;
      // Running once a container has started and is running or being restarted.
      any_running = any_running || c.proc != nullptr || (c.ever_started && !c.finished);
      all_finished = all_finished && c.finished;
      if (c.finished && c.state["terminated"].value("exitCode", 0) != 0) all_zero = false;
      json s = {{"name", c.plan.name},
                {"ready", ready},
                {"started", c.proc != nullptr},
                {"restartCount", c.backoff.restartCount()},
                {"image", ""},
                {"imageID", ""},
                {"state", c.state.empty() ? waiting("ContainerCreating", "") : c.state},
                {"lastState", c.last_state}};
      if (c.proc) s["containerID"] = strCat("process://", c.proc->pid());
      statuses.push_back(std::move(s));
    }
    if (!plan) {
      for (const auto& c : pod["spec"].value("containers", json::array())) {
        statuses.push_back({{"name", c.value("name", "")},
                            {"ready", false},
                            {"started", false},
                            {"restartCount", 0},
                            {"image", c.value("image", "")},
                            {"imageID", ""},
                            {"state", waiting(plan_error.empty() ? "ContainerCreating" : waiting_reason, plan_error)},
                            {"lastState", json::object()}});
      }
    } else {
      for (size_t i = 0; i < statuses.size(); ++i) {
        statuses[i]["image"] = pod["spec"]["containers"][i].value("image", "");
      }
    }
    const std::string phase = !plan                      ? "Pending"
                              : all_finished             ? (all_zero ? "Succeeded" : "Failed")
                              : any_running              ? "Running"
                                                         : "Pending";
    const json previous = last_status_.value("conditions", json::array());
    json status = {{"phase", phase},
                   {"hostIP", env_.host_ip},
                   {"podIP", ip},
                   {"podIPs", json::array({{{"ip", ip}}})},
                   {"startTime", last_status_.value("startTime", start_time)},
                   {"conditions",
                    json::array({condition("Initialized", true, previous, now_text),
                                 condition("Ready", all_ready, previous, now_text),
                                 condition("ContainersReady", all_ready, previous, now_text), scheduled})},
                   {"containerStatuses", statuses}};
    writeStatus(status);
    stopping = waitForChange(next);
  }
  // Stop every container at once, each within the grace period.
  Duration grace = plan ? plan->grace : Duration::zero();
  {
    std::lock_guard l(mu_);
    const json& md = latest_["metadata"];
    if (md.contains("deletionGracePeriodSeconds")) {
      grace = std::chrono::seconds(md["deletionGracePeriodSeconds"].get<int64_t>());
    }
    if (shutdown_grace_) grace = std::min(grace, *shutdown_grace_);
  }
  std::vector<std::future<void>> stops;
  for (Container& c : containers) {
    if (!c.proc) continue;
    (void)env_.events->record(ref, k8s::EventType::kNormal, "Killing", "Kill", strCat("Stopping container ", c.plan.name));
    stops.push_back(std::async(std::launch::async, [&c, grace, &ip, &ref, this] {
      stopContainer(c, grace, ip, ref);
      (void)env_.records->remove(c.proc->pid());
      c.proc.reset();
    }));
  }
  for (auto& s : stops) s.wait();
}

void PodWorker::terminate() {
  const std::string key = strCat(ns_, "/", name_);
  // Its volumes go with it (the logs stay for `kubectl logs` until the pod is gone).
  std::error_code ec;
  fs::remove_all(fs::path(env_.pods_dir) / ns_ / name_ / "volumes", ec);
  absl::Status removed = env_.network->removePod(strCat(ns_, ".", name_));
  if (!removed.ok()) {
    log_.warn("cannot remove the pod's network (kept in the state file; the next kubelet removes it)",
              {{"pod", key}, {"error", std::string(removed.message())}});
  }
  bool confirm = false;
  {
    std::lock_guard l(mu_);
    confirm = !api_deleted_ && !shutdown_grace_ && latest_["metadata"].contains("deletionTimestamp");
  }
  if (!confirm) return;
  // The containers have stopped: the API server may erase the pod now.
  k8s::DeleteOptions options;
  options.gracePeriodSeconds = 0;
  options.preconditionUid = uid_;
  auto r = env_.client->remove(k8s::podsResource(), ns_, name_, options);
  if (!r.ok() && !absl::IsNotFound(r.status()) && !absl::IsFailedPrecondition(r.status()) &&
      !absl::IsAborted(r.status())) {
    log_.warn("cannot delete the stopped pod", {{"pod", key}, {"error", std::string(r.status().message())}});
  }
  log_.info("pod stopped", {{"pod", key}});
}

}  // namespace tandem::kubelet
