#include "src/k8s/leader_election.h"

#include "absl/time/time.h"
#include "src/common/log.h"
#include "src/common/status.h"
#include "src/common/strings.h"
#include "src/k8s/errors.h"

namespace tandem::k8s {

namespace {

const Logger kLog("k8s");

int64_t wholeSeconds(Duration d) { return std::chrono::duration_cast<std::chrono::seconds>(d).count(); }

std::string holderOf(const nlohmann::json& spec) {
  auto it = spec.find("holderIdentity");
  return it != spec.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<LeaderElector>> LeaderElector::create(Client& client, LeaderElectionOptions options) {
  if (options.leaseName.empty() || options.leaseNamespace.empty() || options.identity.empty()) {
    return absl::InvalidArgumentError("leader election: leaseName, leaseNamespace and identity are required");
  }
  if (!(options.leaseDuration > options.renewDeadline && options.renewDeadline > options.retryPeriod &&
        options.retryPeriod > Duration::zero())) {
    return absl::InvalidArgumentError("leader election: need leaseDuration > renewDeadline > retryPeriod > 0");
  }
  if (options.leaseDuration < std::chrono::seconds(1)) {
    return absl::InvalidArgumentError("leader election: leaseDuration must be at least 1s (it is sent in seconds)");
  }
  return std::unique_ptr<LeaderElector>(new LeaderElector(client, std::move(options)));
}

LeaderElector::LeaderElector(Client& client, LeaderElectionOptions options)
    : client_(client),
      options_(std::move(options)),
      clock_(options_.clock ? *options_.clock : SystemClock::instance()) {}

LeaderElector::~LeaderElector() = default;

nlohmann::json LeaderElector::spec(const std::string& acquireTime, int64_t transitions) const {
  return {{"holderIdentity", options_.identity},
          {"leaseDurationSeconds", wholeSeconds(options_.leaseDuration)},
          {"acquireTime", acquireTime},
          {"renewTime", formatMicroTime(clock_.wallNow())},
          {"leaseTransitions", transitions}};
}

absl::StatusOr<bool> LeaderElector::tryAcquireOrRenew() {
  const ResourceRef leases = leasesResource();
  absl::StatusOr<nlohmann::json> lease = client_.get(leases, options_.leaseNamespace, options_.leaseName);
  if (isNotFound(lease.status())) {
    nlohmann::json fresh = {{"apiVersion", "coordination.k8s.io/v1"},
                            {"kind", "Lease"},
                            {"metadata", {{"name", options_.leaseName}, {"namespace", options_.leaseNamespace}}},
                            {"spec", spec(formatMicroTime(clock_.wallNow()), 0)}};
    absl::StatusOr<nlohmann::json> created = client_.create(leases, options_.leaseNamespace, fresh);
    if (isAlreadyExists(created.status())) return false;
    TANDEM_RETURN_IF_ERROR(created.status());
    observedSpec_ = (*created)["spec"];
    observedTime_ = clock_.now();
    return true;
  }
  TANDEM_RETURN_IF_ERROR(lease.status());

  // Observation time is taken after the read returned: never earlier than
  // the write it shows.
  MonoTime observedAt = clock_.now();
  nlohmann::json current = lease->value("spec", nlohmann::json::object());
  if (current != observedSpec_) {
    observedSpec_ = current;
    observedTime_ = observedAt;
  }
  std::string holder = holderOf(current);
  {
    absl::MutexLock lock(&mu_);
    if (holder != observedHolder_) {
      observedHolder_ = holder;
      if (options_.onNewLeader) options_.onNewLeader(holder);
    }
  }
  int64_t durationSeconds = current.value("leaseDurationSeconds", wholeSeconds(options_.leaseDuration));
  if (!holder.empty() && holder != options_.identity &&
      observedTime_ + std::chrono::seconds(durationSeconds) > observedAt) {
    return false;  // held by someone else and not expired
  }

  int64_t transitions = current.value("leaseTransitions", int64_t{0});
  std::string acquireTime = current.value("acquireTime", "");
  if (holder != options_.identity) {
    ++transitions;
    acquireTime = formatMicroTime(clock_.wallNow());
  }
  nlohmann::json updated = *lease;  // keeps metadata.resourceVersion: the server checks it
  updated["spec"] = spec(acquireTime, transitions);
  absl::StatusOr<nlohmann::json> written = client_.update(leases, options_.leaseNamespace, updated);
  if (isConflict(written.status())) return false;
  TANDEM_RETURN_IF_ERROR(written.status());
  observedSpec_ = (*written)["spec"];
  observedTime_ = clock_.now();
  return true;
}

void LeaderElector::setLeading(bool leading, MonoTime renewedAt) {
  bool started = false;
  bool stopped = false;
  {
    absl::MutexLock lock(&mu_);
    if (leading) lastRenew_ = renewedAt;
    started = leading && !leading_;
    stopped = !leading && leading_;
    leading_ = leading;
    if (leading) observedHolder_ = options_.identity;
  }
  if (started) {
    kLog.info("became leader", {{"lease", options_.leaseName}, {"identity", options_.identity}});
    if (options_.onStartedLeading) options_.onStartedLeading();
  }
  if (stopped) {
    kLog.info("lost leadership", {{"lease", options_.leaseName}, {"identity", options_.identity}});
    if (options_.onStoppedLeading) options_.onStoppedLeading();
  }
}

absl::Status LeaderElector::tick() {
  if (released_) return absl::OkStatus();
  // Taken before the request: a renewal is never counted as later than it was.
  MonoTime now = clock_.now();
  bool lapsed = false;
  {
    absl::MutexLock lock(&mu_);
    lapsed = leading_ && now >= lastRenew_ + options_.renewDeadline;
  }
  if (lapsed) setLeading(false, now);  // a late renewal starts a new term
  absl::StatusOr<bool> held = tryAcquireOrRenew();
  if (held.ok() && *held) {
    setLeading(true, now);
    return absl::OkStatus();
  }
  bool lostToOther = false;
  MonoTime renewDeadlineAt;
  {
    absl::MutexLock lock(&mu_);
    lostToOther = held.ok() && !observedHolder_.empty() && observedHolder_ != options_.identity;
    renewDeadlineAt = lastRenew_ + options_.renewDeadline;
  }
  // A leader keeps trying until its renew deadline, unless it saw another
  // holder.
  if (lostToOther || clock_.now() >= renewDeadlineAt) setLeading(false, now);
  return held.ok() ? absl::OkStatus() : held.status();
}

bool LeaderElector::isLeader() const {
  absl::MutexLock lock(&mu_);
  return leading_ && clock_.now() < lastRenew_ + options_.renewDeadline;
}

std::string LeaderElector::leader() const {
  absl::MutexLock lock(&mu_);
  return observedHolder_;
}

absl::Status LeaderElector::release() {
  bool wasLeading;
  {
    absl::MutexLock lock(&mu_);
    wasLeading = leading_;
  }
  if (!wasLeading) return absl::OkStatus();
  setLeading(false, clock_.now());
  const ResourceRef leases = leasesResource();
  TANDEM_ASSIGN_OR_RETURN(nlohmann::json lease, client_.get(leases, options_.leaseNamespace, options_.leaseName));
  nlohmann::json current = lease.value("spec", nlohmann::json::object());
  if (holderOf(current) != options_.identity) return absl::OkStatus();
  std::string now = formatMicroTime(clock_.wallNow());
  lease["spec"]["holderIdentity"] = "";
  lease["spec"]["leaseDurationSeconds"] = 1;
  lease["spec"]["acquireTime"] = now;
  lease["spec"]["renewTime"] = now;
  absl::StatusOr<nlohmann::json> written = client_.update(leases, options_.leaseNamespace, lease);
  if (isConflict(written.status())) return absl::OkStatus();  // someone else wrote: not ours any more
  return written.status();
}

void LeaderElector::run() {
  while (!stopping_.HasBeenNotified()) {
    absl::Status s = tick();
    if (!s.ok()) kLog.warn("leader election attempt failed", {{"error", toStd(s.message())}});
    stopping_.WaitForNotificationWithTimeout(absl::FromChrono(options_.retryPeriod));
  }
  if (options_.releaseOnStop) {
    absl::Status s = release();
    if (!s.ok()) kLog.warn("releasing the lease failed", {{"error", toStd(s.message())}});
  }
  released_ = true;
}

void LeaderElector::stop() {
  if (!stopping_.HasBeenNotified()) stopping_.Notify();
}

}  // namespace tandem::k8s
