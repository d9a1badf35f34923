#include "e2e/replay/replay.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "src/common/stats.h"
#include "src/common/status.h"
#include "src/common/strings.h"
#include "src/routing/cluster_state.h"
#include "src/routing/in_flight.h"

namespace tandem::replay {
namespace {

enum class EventKind : uint8_t { kArrival, kPrefillDone, kDecodeDone };

struct Event {
  double t = 0;
  uint64_t order = 0;  // scheduling order: ties run first-scheduled first
  EventKind kind = EventKind::kArrival;
  size_t request = 0;
  size_t worker = 0;
  bool operator>(const Event& o) const { return t != o.t ? t > o.t : order > o.order; }
};

// What the run measured, turned into a ReplayResult at the end.
struct Tally {
  int64_t hit_blocks = 0;
  int64_t prompt_blocks = 0;
  std::vector<double> waits;
  std::vector<int64_t> served_by_worker;
  std::vector<int64_t> session_later_turns;  // by session: turns >= 1 served
  std::vector<int64_t> session_direct;       // ... of which direct-to-D
  std::vector<int> session_last_worker;      // -1: none yet
  int64_t dropped = 0;
  int64_t rejections = 0;
  int64_t migrations = 0;
};

class ReplayRun {
 public:
  ReplayRun(const ReplayInput& input, int num_workers, const WorkerModel& model, routing::Policy& policy)
      : input_(input), model_(model), policy_(policy) {
    for (int i = 0; i < num_workers; ++i) {
      workers_.emplace_back(strCat("worker-", i), model);
      by_name_.emplace(workers_.back().name(), i);
    }
    tally_.served_by_worker.assign(num_workers, 0);
    tally_.session_later_turns.assign(input.num_sessions, 0);
    tally_.session_direct.assign(input.num_sessions, 0);
    tally_.session_last_worker.assign(input.num_sessions, -1);
    jobs_.resize(input.requests.size());
  }

  absl::StatusOr<ReplayResult> run();

 private:
  void schedule(double t, EventKind kind, size_t request, size_t worker) {
    events_.push(Event{t, next_order_++, kind, request, worker});
  }
  absl::Status arrive(double now, size_t request);
  absl::Status startNext(double now, size_t worker);
  void recordAdmission(double now, size_t worker, const Admitted& a);
  Job makeJob(size_t request, routing::Decision decision) const;
  ReplayResult summarize() const;

  const ReplayInput& input_;
  WorkerModel model_;
  routing::Policy& policy_;
  routing::ClusterState cluster_;
  routing::InFlight in_flight_;
  std::vector<SimWorker> workers_;
  absl::flat_hash_map<std::string, size_t> by_name_;
  std::vector<Job> jobs_;  // by request: the live job of an admitted request
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  uint64_t next_order_ = 0;
  Tally tally_;
};

Job ReplayRun::makeJob(size_t request, routing::Decision decision) const {
  const ReplayRequest& r = input_.requests[request];
  const int64_t prompt = r.route.prompt_tokens;
  const int64_t output = r.route.expected_output_tokens;
  return Job{.request = request,
             .decision = std::move(decision),
             .arrival_s = r.arrival_s,
             .kv = KvRequest{.session = r.route.session,
                             .prompt = r.route.prompt_hashes,
                             .resident = r.resident,
                             .total_blocks = (prompt + output + kTraceBlockTokens - 1) / kTraceBlockTokens,
                             .total_tokens = prompt + output},
             .prompt_tokens = prompt,
             .output_tokens = output};
}

absl::Status ReplayRun::arrive(double now, size_t request) {
  const routing::RouteRequest& route = input_.requests[request].route;
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    routing::RouteResult result = policy_.route(route, cluster_, in_flight_);
    if (std::holds_alternative<routing::NoWorker>(result)) break;
    routing::Decision& d = std::get<routing::Decision>(result);
    auto w = by_name_.find(d.decode);
    if (w == by_name_.end()) return absl::InternalError(strCat("policy chose unknown worker ", d.decode));
    policy_.onAssigned(route, d);
    in_flight_.add(d);
    std::optional<routing::RejectReason> refused = workers_[w->second].offer(makeJob(request, d));
    if (!refused) {
      TANDEM_RETURN_IF_ERROR(workers_[w->second].publish(cluster_));
      return startNext(now, w->second);
    }
    ++tally_.rejections;
    in_flight_.remove(d);
    policy_.onRejected(route, d, *refused);
  }
  ++tally_.dropped;
  return absl::OkStatus();
}

absl::Status ReplayRun::startNext(double now, size_t worker) {
  std::optional<Admitted> a = workers_[worker].startNext();
  if (a) {
    // D has the request in its own accounting now (its load shows it).
    in_flight_.remove(a->job.decision);
    recordAdmission(now, worker, *a);
    const size_t request = a->job.request;
    schedule(now + a->prefill_s, EventKind::kPrefillDone, request, worker);
    jobs_[request] = std::move(a->job);
  }
  return workers_[worker].publish(cluster_);
}

void ReplayRun::recordAdmission(double now, size_t worker, const Admitted& a) {
  const ReplayRequest& r = input_.requests[a.job.request];
  tally_.hit_blocks += a.hit_blocks;
  tally_.prompt_blocks += static_cast<int64_t>(r.route.prompt_hashes.size());
  tally_.waits.push_back(now - a.job.arrival_s);
  ++tally_.served_by_worker[worker];
  if (r.session < 0) return;
  int& last = tally_.session_last_worker[r.session];
  if (r.turn >= 1) {
    ++tally_.session_later_turns[r.session];
    tally_.session_direct[r.session] += a.direct ? 1 : 0;
    if (last >= 0 && last != static_cast<int>(worker)) ++tally_.migrations;
  }
  last = static_cast<int>(worker);
}

absl::StatusOr<ReplayResult> ReplayRun::run() {
  for (SimWorker& w : workers_) TANDEM_RETURN_IF_ERROR(cluster_.applySnapshot(w.snapshot()));
  for (size_t i = 0; i < input_.requests.size(); ++i) {
    schedule(input_.requests[i].arrival_s, EventKind::kArrival, i, 0);
  }
  while (!events_.empty()) {
    const Event e = events_.top();
    events_.pop();
    switch (e.kind) {
      case EventKind::kArrival:
        TANDEM_RETURN_IF_ERROR(arrive(e.t, e.request));
        break;
      case EventKind::kPrefillDone: {
        const Job& job = jobs_[e.request];
        workers_[e.worker].prefillDone(job);
        schedule(e.t + static_cast<double>(job.output_tokens) / model_.decode_tokens_per_s, EventKind::kDecodeDone,
                 e.request, e.worker);
        TANDEM_RETURN_IF_ERROR(startNext(e.t, e.worker));
        break;
      }
      case EventKind::kDecodeDone: {
        const Job& job = jobs_[e.request];
        workers_[e.worker].finish(job);
        policy_.onFinished(input_.requests[e.request].route, job.decision);
        TANDEM_RETURN_IF_ERROR(startNext(e.t, e.worker));
        break;
      }
    }
  }
  return summarize();
}

ReplayResult ReplayRun::summarize() const {
  ReplayResult out;
  out.policy = std::string(policy_.name());
  out.requests = static_cast<int64_t>(tally_.waits.size());
  out.dropped = tally_.dropped;
  out.rejections = tally_.rejections;
  out.migrations = tally_.migrations;
  out.hit_bound = input_.hit_bound;
  if (tally_.prompt_blocks > 0) {
    out.hit_ratio = static_cast<double>(tally_.hit_blocks) / static_cast<double>(tally_.prompt_blocks);
  }
  std::vector<double> waits = tally_.waits;
  std::sort(waits.begin(), waits.end());
  out.p50_wait_s = nearestRankSorted(waits, 0.50);
  out.p99_wait_s = nearestRankSorted(waits, 0.99);
  const auto& served = tally_.served_by_worker;
  const double mean = static_cast<double>(out.requests) / static_cast<double>(std::max<size_t>(1, served.size()));
  if (mean > 0) out.imbalance = static_cast<double>(*std::max_element(served.begin(), served.end())) / mean;
  out.cold_workers = std::count_if(served.begin(), served.end(),
                                   [&](int64_t n) { return static_cast<double>(n) < kColdWorkerShare * mean; });
  int64_t later = 0;
  int64_t direct = 0;
  for (size_t s = 0; s < tally_.session_later_turns.size(); ++s) {
    const int64_t n = tally_.session_later_turns[s];
    if (n == 0) continue;
    later += n;
    direct += tally_.session_direct[s];
    const double share = static_cast<double>(tally_.session_direct[s]) / static_cast<double>(n);
    out.min_session_direct_share = std::min(out.min_session_direct_share.value_or(1.0), share);
  }
  if (later > 0) out.direct_share = static_cast<double>(direct) / static_cast<double>(later);
  return out;
}

}  // namespace

absl::StatusOr<ReplayResult> runReplay(const ReplayInput& input, int num_workers, const WorkerModel& model,
                                       routing::Policy& policy) {
  ReplayRun run(input, num_workers, model, policy);
  return run.run();
}

}  // namespace tandem::replay
