#include "agent/router/router_core.h"

#include "src/common/status.h"
#include "src/common/strings.h"

#include <algorithm>

namespace tandem::agent {

RouterCore::RouterCore(std::unique_ptr<routing::Policy> policy, const Clock& clock, Options options)
    : clock_(clock), options_(options), policy_(std::move(policy)) {}

RouterCore::~RouterCore() = default;

absl::Status RouterCore::applySnapshot(const routing::WorkerSnapshot& snapshot, std::string http_address,
                                       std::string kv_address) {
  absl::MutexLock lock(&mu_);
  if (auto it = addresses_.find(snapshot.worker); it != addresses_.end() && it->second.http != http_address) {
    // Two configured addresses answer with one name: their states would mix.
    return absl::FailedPreconditionError(strCat("workers at ", it->second.http, " and ", http_address,
                                                " both call themselves \"", snapshot.worker,
                                                "\"; give each agent its own --worker name"));
  }
  TANDEM_RETURN_IF_ERROR(cluster_.applySnapshot(snapshot));
  // A snapshot is the stream's proof of life: forget earlier failures.
  failures_.erase(snapshot.worker);
  cluster_.setHealthy(snapshot.worker, true);
  addresses_[snapshot.worker] = {.http = std::move(http_address), .kv = std::move(kv_address)};
  return absl::OkStatus();
}

absl::Status RouterCore::applyDelta(std::string_view worker, const routing::WorkerDelta& delta) {
  absl::MutexLock lock(&mu_);
  return cluster_.applyDelta(worker, delta);
}

void RouterCore::markStale(std::string_view worker) {
  absl::MutexLock lock(&mu_);
  cluster_.markStale(worker);
}

void RouterCore::removeWorker(std::string_view worker) {
  absl::MutexLock lock(&mu_);
  cluster_.removeWorker(worker);
  const std::string name(worker);
  addresses_.erase(name);
  failures_.erase(name);
  unresponsive_since_.erase(name);
}

void RouterCore::setResponsive(std::string_view worker, bool responsive) {
  absl::MutexLock lock(&mu_);
  const std::string name(worker);
  if (responsive) {
    unresponsive_since_.erase(name);
  } else {
    unresponsive_since_.try_emplace(name, clock_.now());
  }
}

std::optional<MonoTime> RouterCore::unresponsiveSince(std::string_view worker) const {
  absl::MutexLock lock(&mu_);
  auto it = unresponsive_since_.find(std::string(worker));
  if (it == unresponsive_since_.end()) return std::nullopt;
  return it->second;
}

bool RouterCore::otherResponsiveDecodeWorker(std::string_view worker) const {
  absl::MutexLock lock(&mu_);
  const MonoTime now = clock_.now();
  for (uint32_t s = 0; s < cluster_.slotEnd(); ++s) {
    const routing::WorkerView* w = cluster_.worker(routing::WorkerSlot(s));
    if (w == nullptr || !w->canDecode() || !w->healthy || w->name == worker || w->load.draining) continue;
    if (!unresponsive_since_.contains(w->name) && !failedTooOften(w->name, now)) return true;
  }
  return false;
}

bool RouterCore::failedTooOften(const std::string& worker, MonoTime now) const {
  auto f = failures_.find(worker);
  if (f == failures_.end()) return false;
  const auto recent = std::count_if(f->second.begin(), f->second.end(),
                                    [&](MonoTime t) { return now - t <= options_.failure_window; });
  return recent >= options_.unhealthy_failures;
}

absl::Status RouterCore::setRouterConfig(const routing::RouterConfig& config) {
  TANDEM_RETURN_IF_ERROR(routing::validateRouterConfig(config));
  absl::MutexLock lock(&mu_);
  if (!policy_->setConfig(config)) return absl::FailedPreconditionError(strCat("policy ", policy_->name(), " has no knobs"));
  return absl::OkStatus();
}

std::optional<HashSpec> RouterCore::hashSpec() const {
  absl::MutexLock lock(&mu_);
  for (uint32_t s = 0; s < cluster_.slotEnd(); ++s) {
    const routing::WorkerView* w = cluster_.worker(routing::WorkerSlot(s));
    if (w != nullptr && w->canDecode() && w->block_size > 0) return HashSpec{w->block_size, w->hash_root};
  }
  return std::nullopt;
}

std::variant<RouterCore::Assignment, routing::NoWorker> RouterCore::route(const routing::RouteRequest& request,
                                                                          const std::vector<std::string>& avoid,
                                                                          bool allow_unresponsive) {
  absl::MutexLock lock(&mu_);
  // Workers that failed too often within the window sit out, as do those to
  // avoid and (unless allowed) the unresponsive ones; all only for this
  // decision (the marks are restored before the lock is released, so
  // nothing else ever sees them).
  const MonoTime now = clock_.now();
  std::vector<std::string> benched = avoid;
  if (!allow_unresponsive) {
    for (const auto& [name, since] : unresponsive_since_) benched.push_back(name);
  }
  for (auto& [name, times] : failures_) {
    std::erase_if(times, [&](MonoTime t) { return now - t > options_.failure_window; });  // forgotten
    if (failedTooOften(name, now)) benched.push_back(name);
  }
  std::vector<std::pair<std::string, bool>> restore;
  for (const std::string& name : benched) {
    std::optional<routing::WorkerSlot> slot = cluster_.find(name);
    if (!slot) continue;
    restore.emplace_back(name, cluster_.worker(*slot)->healthy);
    cluster_.setHealthy(name, false);
  }
  routing::RouteResult result = policy_->route(request, cluster_, in_flight_);
  for (auto it = restore.rbegin(); it != restore.rend(); ++it) cluster_.setHealthy(it->first, it->second);
  if (const auto* none = std::get_if<routing::NoWorker>(&result)) return *none;
  Assignment a{.decision = std::get<routing::Decision>(std::move(result))};
  in_flight_.add(a.decision);
  policy_->onAssigned(request, a.decision);
  return a;
}

std::optional<WorkerAddress> RouterCore::address(std::string_view worker) const {
  absl::MutexLock lock(&mu_);
  auto it = addresses_.find(absl::string_view(worker.data(), worker.size()));
  if (it == addresses_.end()) return std::nullopt;
  return it->second;
}

void RouterCore::release(Assignment& a) {
  if (!a.in_flight) return;
  in_flight_.remove(a.decision);
  a.in_flight = false;
}

void RouterCore::admitted(Assignment& a) {
  absl::MutexLock lock(&mu_);
  release(a);
}

void RouterCore::finished(const routing::RouteRequest& request, Assignment& a) {
  absl::MutexLock lock(&mu_);
  release(a);
  policy_->onFinished(request, a.decision);
}

void RouterCore::rejected(const routing::RouteRequest& request, Assignment& a, routing::RejectReason reason) {
  absl::MutexLock lock(&mu_);
  release(a);
  policy_->onRejected(request, a.decision, reason);
}

void RouterCore::unreachable(const routing::RouteRequest& request, Assignment& a) {
  absl::MutexLock lock(&mu_);
  release(a);
  policy_->onFinished(request, a.decision);
  failures_[a.decision.decode].push_back(clock_.now());
}

bool RouterCore::hasDecodeSnapshot() const {
  absl::MutexLock lock(&mu_);
  for (uint32_t s = 0; s < cluster_.slotEnd(); ++s) {
    const routing::WorkerView* w = cluster_.worker(routing::WorkerSlot(s));
    if (w != nullptr && w->canDecode()) return true;
  }
  return false;
}

bool RouterCore::responsive(std::string_view worker) const {
  absl::MutexLock lock(&mu_);
  return !unresponsive_since_.contains(std::string(worker));
}

int64_t RouterCore::numUnresponsive() const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const auto& [name, since] : unresponsive_since_) {
    std::optional<routing::WorkerSlot> slot = cluster_.find(name);
    if (slot && cluster_.worker(*slot)->canDecode()) ++n;
  }
  return n;
}

int64_t RouterCore::numStale() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(cluster_.numStale());
}

std::vector<RouterCore::WorkerLoadView> RouterCore::workerLoads() const {
  absl::MutexLock lock(&mu_);
  std::vector<WorkerLoadView> out;
  for (uint32_t s = 0; s < cluster_.slotEnd(); ++s) {
    const routing::WorkerView* w = cluster_.worker(routing::WorkerSlot(s));
    if (w == nullptr) continue;
    out.push_back({.name = w->name, .sessions = w->num_resident_sessions, .in_flight = in_flight_.at(w->ref).requests});
  }
  return out;
}

}  // namespace tandem::agent
