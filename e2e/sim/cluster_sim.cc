#include "e2e/sim/cluster_sim.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <ostream>
#include <queue>
#include <utility>
#include <variant>

#include "absl/container/flat_hash_map.h"
#include "e2e/replay/worker_kv.h"
#include "src/common/block_hash.h"
#include "src/common/stats.h"
#include "src/common/status.h"
#include "src/common/strings.h"
#include "src/routing/cluster_state.h"
#include "src/routing/in_flight.h"
#include "src/routing/router_config.h"
#include "src/routing/tandem_policy.h"

namespace tandem::sim {
namespace {

constexpr uint64_t kEpoch = 1;
constexpr int kMaxAttempts = 3;
constexpr int64_t kBlockTokens = replay::kTraceBlockTokens;

enum class EventKind : uint8_t { kArrival, kComputed, kTransferred, kDecodeFinish, kReady, kTick, kCheck, kSample };

struct Event {
  double t = 0;
  uint64_t order = 0;
  EventKind kind = EventKind::kArrival;
  size_t a = 0;  // request, or worker
  size_t b = 0;  // worker, or the decode worker's version
  bool operator>(const Event& o) const { return t != o.t ? t > o.t : order > o.order; }
};

struct Request {
  routing::Decision decision;
  replay::KvRequest kv_d, kv_p;
  int64_t prompt_tokens = 0, output_tokens = 0;
  int64_t lane_tokens = 0;  // tokens its prefill lane computes (P, or D's own lane)
  int64_t pull_blocks = 0;  // prompt blocks D pulls from P
  size_t d = 0, p = 0;      // workers
  bool on_p = false;        // computed on a prefill replica (else on D's lane)
  double join_t = 0, first_token_t = 0, finish_v = 0;
};

struct Worker {
  std::string name;
  routing::WorkerRole role = routing::WorkerRole::kDecode;
  double created = 0, ready_at = 0, gone_at = -1;
  bool ready = false, removing = false;
  replay::WorkerKv kv;
  uint64_t seq = 0;
  routing::WorkerLoad published;
  // The prefill lane: P's queue, or D's direct turns.
  std::deque<size_t> lane;
  bool computing = false;
  int64_t lane_tokens = 0;  // queued and computing
  double busy_s = 0, computed_tokens = 0;  // this interval
  // Decode.
  std::deque<size_t> waiting;
  int64_t waiting_tokens = 0;
  int64_t reserved = 0;  // blocks reserved by admitted requests
  int64_t admitted = 0;  // admitted, not finished
  double v = 0, t_v = 0;  // tokens emitted per sequence so far, and when
  int64_t batch = 0;
  std::priority_queue<std::pair<double, size_t>, std::vector<std::pair<double, size_t>>, std::greater<>> finishing;
  uint64_t version = 0;

  Worker(std::string n, routing::WorkerRole r, int64_t blocks, double now)
      : name(std::move(n)), role(r), created(now), kv(blocks) {}
  bool gone() const { return gone_at >= 0; }
  bool idle() const { return admitted == 0 && waiting.empty() && lane.empty() && !computing; }
  bool routable() const { return ready && !removing; }
};

class Sim {
 public:
  Sim(const replay::ReplayInput& input, const SimOptions& options, ScalingPolicy& policy)
      : input_(input), o_(options), e_(options.engine), scaling_(policy), requests_(input.requests.size()) {}

  absl::StatusOr<SimResult> run();

 private:
  void schedule(double t, EventKind kind, size_t a, size_t b = 0) { events_.push(Event{t, order_++, kind, a, b}); }
  double tpot(int64_t batch) const { return e_.tpot_base_s + e_.tpot_per_seq_s * static_cast<double>(batch); }
  routing::WorkerSnapshot snapshot(const Worker& w) const;
  routing::WorkerLoad load(const Worker& w) const;
  absl::Status publish(Worker& w);
  absl::Status arrive(double now, size_t r);
  absl::Status admit(double now, size_t d);
  absl::Status startLane(double now, size_t w);
  absl::Status computed(double now, size_t w, size_t r);
  void join(double now, size_t d, size_t r);
  void advance(Worker& w, double now);
  void reschedule(size_t d);
  absl::Status finishDecodes(double now, size_t d, uint64_t version);
  void finished(double now, size_t r);
  absl::Status tick(double now);
  // Between two ticks: the policy's check (ScalingPolicy::check).
  void check(double now);
  void logDecision(double now, const char* what, const planner::Signals& s, PoolSize want);
  void sample(double now);
  // The gauges now: the Ready decode replicas' mean KV reserved, sequences
  // decoding and requests waiting for admission; the prompt tokens queued
  // on prefill replicas.
  struct Gauges {
    double kv_used_ratio = 0, running = 0, waiting = 0, prefill_queue_tokens = 0;
    int ready = 0;  // decode
  };
  Gauges gauges() const;
  // A request that arrived at `arrival` met its SLOs or not.
  void countIn(double arrival, bool met) {
    const size_t i = static_cast<size_t>(std::max(0.0, arrival) / o_.interval_s);
    if (by_interval_.size() <= i) by_interval_.resize(i + 1);
    ++by_interval_[i].first;
    by_interval_[i].second += met;
  }
  void resize(double now, routing::WorkerRole role, int32_t n);
  void maybeGone(double now, Worker& w);
  // The signals since the last tick; `interval_end`: the tick's own, which
  // start the next interval's window (a check between ticks reads the
  // window so far and leaves it).
  planner::Signals signals(double now, bool interval_end);

  const replay::ReplayInput& input_;
  SimOptions o_;
  EngineModel e_;
  ScalingPolicy& scaling_;
  routing::TandemPolicy routing_;
  routing::ClusterState cluster_;
  routing::InFlight in_flight_;
  std::deque<Worker> workers_;  // never moved: requests and events name workers by index
  absl::flat_hash_map<std::string, size_t> by_name_;
  std::vector<Request> requests_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  uint64_t order_ = 0;
  int next_name_[2] = {0, 0};
  int64_t open_ = 0;  // requests arrived or to arrive and not yet finished or dropped
  // Results.
  SimResult out_;
  std::vector<double> ttfts_, tpots_;
  int last_dir_[2] = {0, 0};
  std::vector<std::pair<int64_t, int64_t>> by_interval_;  // (arrived, met) by arrival interval
  // This interval.
  std::vector<double> i_ttfts_, i_tpots_;
  double i_uncached_ = 0, i_output_ = 0;
  // Over the interval's samples.
  double i_kv_peak_ = 0, i_running_peak_ = 0, i_waiting_peak_ = 0, i_queue_peak_ = 0;
  double s_uncached_ = 0;                       // uncached tokens arrived since the last sample
  double i_uncached_peak_ = 0;                  // the interval's highest rate between two samples
  int64_t i_disagg_ = 0, i_arrivals_ = 0, i_dropped_ = 0;
  double last_arrival_ = 0, end_ = 0;
  double last_tick_ = 0;
  // Where each session's KV was left and when (the decode working set).
  struct SessionSeen {
    double at = 0;
    size_t d = 0;
  };
  absl::flat_hash_map<SessionId, SessionSeen> sessions_;
};

// Sessions with a turn within this long count in the decode working set.
constexpr double kActiveSessionS = 300;

routing::WorkerLoad Sim::load(const Worker& w) const {
  if (w.role == routing::WorkerRole::kPrefill) {
    return routing::WorkerLoad{.free_blocks = w.kv.freeBlocks(),
                               .total_blocks = w.kv.capacityBlocks(),
                               .running = w.computing ? 1 : 0,
                               .waiting = static_cast<int64_t>(w.lane.size()),
                               .waiting_prompt_tokens = w.lane_tokens,
                               .draining = w.removing};
  }
  return routing::WorkerLoad{.free_blocks = w.kv.freeBlocks(),
                             .total_blocks = w.kv.capacityBlocks(),
                             .running = w.admitted,
                             .waiting = static_cast<int64_t>(w.waiting.size()),
                             .waiting_prompt_tokens = w.waiting_tokens,
                             .draining = w.removing};
}

routing::WorkerSnapshot Sim::snapshot(const Worker& w) const {
  routing::WorkerSnapshot s;
  s.epoch = kEpoch;
  s.seq = w.seq;
  s.worker = w.name;
  s.kv_address = w.role == routing::WorkerRole::kPrefill ? strCat(w.name, ":8200") : std::string();
  s.role = w.role;
  s.block_size = static_cast<int>(kBlockTokens);
  s.hash_root = kBlockHashRoot;
  s.load = load(w);
  return s;
}

absl::Status Sim::publish(Worker& w) {
  std::vector<routing::WorkerDeltaBody> bodies = w.kv.takeEvents();
  if (!w.routable()) return absl::OkStatus();  // the router does not follow it (yet, or any more)
  const routing::WorkerLoad now = load(w);
  if (!(now == w.published)) {
    bodies.emplace_back(now);
    w.published = now;
  }
  for (routing::WorkerDeltaBody& body : bodies) {
    TANDEM_RETURN_IF_ERROR(cluster_.applyDelta(w.name, routing::WorkerDelta{kEpoch, ++w.seq, std::move(body)}));
  }
  return absl::OkStatus();
}

absl::Status Sim::arrive(double now, size_t r) {
  const replay::ReplayRequest& in = input_.requests[r];
  Request& req = requests_[r];
  req.prompt_tokens = in.route.prompt_tokens;
  req.output_tokens = std::max<int64_t>(1, in.route.expected_output_tokens);
  const int64_t total = req.prompt_tokens + req.output_tokens;
  req.kv_d = replay::KvRequest{.session = in.route.session,
                               .prompt = in.route.prompt_hashes,
                               .resident = in.resident,
                               .total_blocks = (total + kBlockTokens - 1) / kBlockTokens,
                               .total_tokens = total};
  req.kv_p = replay::KvRequest{.prompt = in.route.prompt_hashes,
                               .resident = in.route.prompt_hashes,
                               .total_blocks = static_cast<int64_t>(in.route.prompt_hashes.size()),
                               .total_tokens = req.prompt_tokens};
  ++i_arrivals_;
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    routing::RouteResult result = routing_.route(in.route, cluster_, in_flight_);
    if (std::holds_alternative<routing::NoWorker>(result)) break;
    routing::Decision& d = std::get<routing::Decision>(result);
    auto w = by_name_.find(d.decode);
    if (w == by_name_.end()) return absl::InternalError(strCat("the policy chose unknown worker ", d.decode));
    Worker& dw = workers_[w->second];
    std::optional<routing::RejectReason> refused;
    if (req.kv_d.total_blocks > dw.kv.capacityBlocks()) refused = routing::RejectReason::kCapacity;
    if (static_cast<int>(dw.waiting.size()) >= e_.max_waiting) refused = routing::RejectReason::kQueueFull;
    routing_.onAssigned(in.route, d);
    if (refused) {
      routing_.onRejected(in.route, d, *refused);
      continue;
    }
    in_flight_.add(d);
    if (d.path == routing::RoutePath::kDisagg) {
      i_uncached_ += static_cast<double>(d.prefill_tokens);
      s_uncached_ += static_cast<double>(d.prefill_tokens);
      ++i_disagg_;
    }
    req.decision = std::move(d);
    req.d = w->second;
    dw.waiting.push_back(r);
    dw.waiting_tokens += req.decision.prefill_tokens;
    return admit(now, w->second);
  }
  ++out_.dropped;
  ++i_dropped_;
  countIn(input_.requests[r].arrival_s, false);
  --open_;
  return absl::OkStatus();
}

// D admits from the head of its queue while the reservations fit.
absl::Status Sim::admit(double now, size_t d) {
  Worker& w = workers_[d];
  while (!w.waiting.empty()) {
    const size_t r = w.waiting.front();
    Request& req = requests_[r];
    const std::optional<int64_t> hits = w.kv.tryAdmit(req.kv_d);
    if (!hits) break;
    w.waiting.pop_front();
    w.waiting_tokens -= req.decision.prefill_tokens;
    w.reserved += req.kv_d.total_blocks;
    ++w.admitted;
    in_flight_.remove(req.decision);
    const int64_t prompt_blocks = static_cast<int64_t>(req.kv_d.prompt.size());
    req.pull_blocks = std::max<int64_t>(0, prompt_blocks - *hits);
    std::optional<size_t> p;
    if (req.decision.prefill) {
      auto it = by_name_.find(*req.decision.prefill);
      if (it != by_name_.end() && workers_[it->second].routable()) p = it->second;
      // D sends the prefill when it admits the request, maybe long after the
      // router chose: like the agent (agent/prefill_peers.h), it keeps the
      // router's P unless that one has left or its queue is past the
      // router's overload mark while another's is not.
      if (!p || workers_[*p].lane_tokens > routing::RouterConfig{}.prefill_overload_tokens) {
        std::optional<size_t> least;
        for (size_t i = 0; i < workers_.size(); ++i) {
          const Worker& c = workers_[i];
          if (c.role != routing::WorkerRole::kPrefill || !c.routable()) continue;
          if (!least || c.lane_tokens < workers_[*least].lane_tokens) least = i;
        }
        if (least && (!p || workers_[*least].lane_tokens < routing::RouterConfig{}.prefill_overload_tokens)) p = least;
      }
    }
    size_t lane = d;
    if (req.decision.path == routing::RoutePath::kDisagg && p) {
      req.on_p = true;
      req.p = *p;
      lane = *p;
      req.lane_tokens = std::max<int64_t>(0, req.prompt_tokens - workers_[*p].kv.prefixHits(req.kv_p.prompt) * kBlockTokens);
    } else {
      req.lane_tokens = std::max<int64_t>(0, req.prompt_tokens - *hits * kBlockTokens);
    }
    Worker& lw = workers_[lane];
    lw.lane.push_back(r);
    lw.lane_tokens += req.lane_tokens;
    if (lane != d) TANDEM_RETURN_IF_ERROR(publish(lw));
    TANDEM_RETURN_IF_ERROR(startLane(now, lane));
  }
  return publish(w);
}

absl::Status Sim::startLane(double now, size_t wi) {
  Worker& w = workers_[wi];
  if (w.computing || w.lane.empty()) return absl::OkStatus();
  const size_t r = w.lane.front();
  Request& req = requests_[r];
  if (w.role == routing::WorkerRole::kPrefill) {
    // The prompt's blocks in P's prefix cache (one prompt at a time, so only
    // a prompt larger than the whole cache is computed without it).
    if (req.kv_p.total_blocks <= w.kv.capacityBlocks()) {
      const std::optional<int64_t> hits = w.kv.tryAdmit(req.kv_p);
      if (!hits) return absl::InternalError(strCat(w.name, ": a lone prompt did not fit its prefix cache"));
    }
  }
  const bool warming = w.ready && now - w.ready_at < e_.warmup_s;
  const double speed = e_.prefill_tokens_per_s * (warming ? e_.warmup_speed : 1.0);
  const double dt = e_.prefill_overhead_s + static_cast<double>(req.lane_tokens) / speed;
  w.computing = true;
  w.busy_s += dt;
  w.computed_tokens += static_cast<double>(req.lane_tokens);
  schedule(now + dt, EventKind::kComputed, r, wi);
  return publish(w);
}

absl::Status Sim::computed(double now, size_t wi, size_t r) {
  Worker& w = workers_[wi];
  Request& req = requests_[r];
  w.computing = false;
  w.lane.pop_front();
  w.lane_tokens -= req.lane_tokens;
  if (w.role == routing::WorkerRole::kPrefill) {
    if (req.kv_p.total_blocks <= w.kv.capacityBlocks()) {
      w.kv.publishComputed(req.kv_p);
      w.kv.finish(req.kv_p);  // its blocks stay in the prefix cache
    }
    schedule(now + static_cast<double>(req.pull_blocks) * e_.kv_transfer_s_per_block, EventKind::kTransferred, r,
             req.d);
  } else {
    w.kv.publishComputed(req.kv_d);
    join(now, req.d, r);
  }
  TANDEM_RETURN_IF_ERROR(startLane(now, wi));
  maybeGone(now, w);
  return publish(w);
}

void Sim::advance(Worker& w, double now) {
  if (w.batch > 0) w.v += (now - w.t_v) / tpot(w.batch);
  w.t_v = now;
}

void Sim::join(double now, size_t d, size_t r) {
  Worker& w = workers_[d];
  Request& req = requests_[r];
  advance(w, now);
  ++w.batch;
  req.join_t = now;
  req.first_token_t = now + tpot(w.batch);
  req.finish_v = w.v + static_cast<double>(req.output_tokens);
  w.finishing.emplace(req.finish_v, r);
  const double ttft = req.first_token_t - input_.requests[r].arrival_s;
  i_ttfts_.push_back(ttft);
  reschedule(d);
}

void Sim::reschedule(size_t d) {
  Worker& w = workers_[d];
  ++w.version;
  if (w.finishing.empty()) return;
  const double t = w.t_v + std::max(0.0, w.finishing.top().first - w.v) * tpot(w.batch);
  schedule(t, EventKind::kDecodeFinish, d, w.version);
}

absl::Status Sim::finishDecodes(double now, size_t d, uint64_t version) {
  Worker& w = workers_[d];
  if (version != w.version) return absl::OkStatus();  // the batch changed since: a later event stands
  advance(w, now);
  while (!w.finishing.empty() && w.finishing.top().first <= w.v + 1e-9) {
    const size_t r = w.finishing.top().second;
    w.finishing.pop();
    --w.batch;
    finished(now, r);
  }
  reschedule(d);
  TANDEM_RETURN_IF_ERROR(admit(now, d));
  maybeGone(now, w);
  return absl::OkStatus();
}

void Sim::finished(double now, size_t r) {
  Request& req = requests_[r];
  Worker& w = workers_[req.d];
  w.kv.finish(req.kv_d);
  w.reserved -= req.kv_d.total_blocks;
  --w.admitted;
  routing_.onFinished(input_.requests[r].route, req.decision);
  const double ttft = req.first_token_t - input_.requests[r].arrival_s;
  const double tpot_s =
      req.output_tokens > 1 ? (now - req.first_token_t) / static_cast<double>(req.output_tokens - 1) : 0.0;
  ttfts_.push_back(ttft);
  tpots_.push_back(tpot_s);
  i_tpots_.push_back(tpot_s);
  i_output_ += static_cast<double>(req.output_tokens);
  const bool met = ttft <= o_.slo.ttft_s && tpot_s <= o_.slo.tpot_s;
  if (met) ++out_.met;
  countIn(input_.requests[r].arrival_s, met);
  if (req.kv_d.session) sessions_[*req.kv_d.session] = SessionSeen{now, req.d};
  end_ = std::max(end_, now);
  --open_;
}

void Sim::maybeGone(double now, Worker& w) {
  if (w.removing && !w.gone() && w.idle()) w.gone_at = now;
}

void Sim::resize(double now, routing::WorkerRole role, int32_t n) {
  const int ri = role == routing::WorkerRole::kPrefill ? 0 : 1;
  std::vector<size_t> live;
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (workers_[i].role == role && !workers_[i].removing) live.push_back(i);
  }
  const int32_t current = static_cast<int32_t>(live.size());
  if (n == current) return;
  ++out_.actions;
  const int dir = n > current ? 1 : -1;
  if (last_dir_[ri] != 0 && dir != last_dir_[ri]) ++out_.reversals;
  last_dir_[ri] = dir;
  for (int32_t i = current; i < n; ++i) {
    const std::string name = strCat(role == routing::WorkerRole::kPrefill ? "prefill-" : "decode-", next_name_[ri]++);
    workers_.emplace_back(name, role, role == routing::WorkerRole::kPrefill ? e_.prefill_cache_blocks : e_.kv_blocks,
                          now);
    by_name_.emplace(name, workers_.size() - 1);
    schedule(now + e_.startup_s, EventKind::kReady, workers_.size() - 1);
  }
  if (n >= current) return;
  // Replicas still starting go first (newest first), then the least busy.
  auto busy = [&](size_t i) {
    const Worker& w = workers_[i];
    return std::make_tuple(w.ready, w.admitted + static_cast<int64_t>(w.waiting.size()) + w.lane_tokens / kBlockTokens,
                           -w.created);
  };
  std::sort(live.begin(), live.end(), [&](size_t a, size_t b) { return busy(a) < busy(b); });
  for (int32_t k = 0; k < current - n; ++k) {
    Worker& w = workers_[live[k]];
    w.removing = true;
    if (w.ready) cluster_.removeWorker(w.name);
    maybeGone(now, w);
  }
}

planner::Signals Sim::signals(double now, bool interval_end) {
  planner::Signals s;
  const double window = interval_end ? o_.interval_s : std::max(now - last_tick_, o_.scrape_s);
  s.at_s = now;
  const Gauges g = gauges();
  const int ready_d = g.ready;
  for (Worker& w : workers_) {
    if (w.removing) continue;
    planner::ReplicaSample r{.name = w.name, .ready = w.ready, .ready_for_s = w.ready ? now - w.ready_at : 0};
    if (w.role == routing::WorkerRole::kPrefill) {
      if (w.busy_s > 0) r.capacity = w.computed_tokens / w.busy_s;
      s.prefill.push_back(r);
      ++s.spec_prefill;
    } else {
      s.decode.push_back(r);
      ++s.spec_decode;
    }
    if (interval_end) w.busy_s = w.computed_tokens = 0;
  }
  // Gauges as Prometheus reads them for the planner: the peak of the
  // interval's scrapes (a burst between two decisions is not missed).
  s.prefill_queue_tokens = g.prefill_queue_tokens;
  s.decode_kv_used_ratio = std::max(i_kv_peak_, g.kv_used_ratio);
  s.decode_kv_total_blocks = static_cast<double>(ready_d * e_.kv_blocks);
  s.kv_block_tokens = static_cast<double>(kBlockTokens);
  s.decode_running = std::max(g.running, i_running_peak_);
  s.decode_waiting = i_waiting_peak_;
  s.prefill_queue_peak_tokens = std::max(i_queue_peak_, s.prefill_queue_tokens);
  if (interval_end) i_kv_peak_ = i_running_peak_ = i_waiting_peak_ = i_queue_peak_ = 0;
  double active = 0;
  absl::erase_if(sessions_, [&](const auto& e) { return e.second.at < now - kActiveSessionS; });
  for (const auto& [session, seen] : sessions_) {
    const Worker& w = workers_[seen.d];
    if (w.ready && !w.removing) {
      active += static_cast<double>(w.kv.residentBlocks(session)) / static_cast<double>(w.kv.capacityBlocks());
    }
  }
  s.decode_kv_active_ratio = ready_d > 0 ? s.decode_kv_used_ratio + active / ready_d : 0;
  // Arrivals at the interval's peak between two scrapes, as the planner's
  // query reads them (max_over_time of a short rate).
  s.uncached_prompt_tokens_per_s = std::max(i_uncached_ / window, i_uncached_peak_);
  s.mean_uncached_prompt_tokens = i_disagg_ > 0 ? i_uncached_ / static_cast<double>(i_disagg_) : 0;
  s.generation_tokens_per_s = i_output_ / window;
  s.requests_per_s = static_cast<double>(i_arrivals_) / window;
  if (!i_ttfts_.empty()) s.ttft_p95_s = nearestRank(i_ttfts_, 0.95);
  if (!i_tpots_.empty()) s.tpot_p95_s = nearestRank(i_tpots_, 0.95);
  s.fallback_share = i_arrivals_ > 0 ? static_cast<double>(i_dropped_) / static_cast<double>(i_arrivals_) : 0;
  if (!interval_end) return s;
  last_tick_ = now;
  i_uncached_peak_ = 0;
  i_ttfts_.clear();
  i_tpots_.clear();
  i_uncached_ = i_output_ = 0;
  i_disagg_ = i_arrivals_ = i_dropped_ = 0;
  return s;
}

Sim::Gauges Sim::gauges() const {
  Gauges g;
  double kv_used = 0;
  for (const Worker& w : workers_) {
    if (w.removing) continue;
    if (w.role == routing::WorkerRole::kPrefill) g.prefill_queue_tokens += static_cast<double>(w.lane_tokens);
    if (!w.ready || w.role != routing::WorkerRole::kDecode) continue;
    kv_used += static_cast<double>(w.reserved) / static_cast<double>(w.kv.capacityBlocks());
    g.running += static_cast<double>(w.batch);
    g.waiting += static_cast<double>(w.waiting.size());
    ++g.ready;
  }
  if (g.ready > 0) g.kv_used_ratio = kv_used / g.ready;
  return g;
}

void Sim::sample(double now) {
  const Gauges g = gauges();
  i_waiting_peak_ = std::max(i_waiting_peak_, g.waiting);
  if (g.ready > 0) i_kv_peak_ = std::max(i_kv_peak_, g.kv_used_ratio);
  i_uncached_peak_ = std::max(i_uncached_peak_, s_uncached_ / o_.scrape_s);
  s_uncached_ = 0;
  i_running_peak_ = std::max(i_running_peak_, g.running);
  i_queue_peak_ = std::max(i_queue_peak_, g.prefill_queue_tokens);
  if (open_ > 0) schedule(now + o_.scrape_s, EventKind::kSample, 0);
}

void Sim::logDecision(double now, const char* what, const planner::Signals& s, PoolSize want) {
  if (!o_.log) return;
  *o_.log << scaling_.name() << (*what ? " " : "") << what << " t=" << now << " P=" << s.spec_prefill << "->" << want.prefill
          << " D=" << s.spec_decode << "->" << want.decode << " uncached_tok_s=" << s.uncached_prompt_tokens_per_s
          << " queue_tok=" << s.prefill_queue_tokens << " ttft_p95=" << s.ttft_p95_s.value_or(-1)
          << " tpot_p95=" << s.tpot_p95_s.value_or(-1) << " running=" << s.decode_running
          << " kv_used=" << s.decode_kv_used_ratio << " kv_active=" << s.decode_kv_active_ratio;
  int64_t busy_p = 0, max_lane = 0, d_waiting = 0;
  for (const Worker& w : workers_) {
    if (w.gone()) continue;
    if (w.role == routing::WorkerRole::kPrefill) {
      busy_p += w.computing;
      max_lane = std::max(max_lane, w.lane_tokens);
    } else {
      d_waiting += static_cast<int64_t>(w.waiting.size());
    }
  }
  *o_.log << " busy_p=" << busy_p << " max_lane=" << max_lane << " d_waiting=" << d_waiting;
  if (const std::string why = scaling_.why(); !why.empty()) *o_.log << " why: " << why;
  *o_.log << "\n";
}

absl::Status Sim::tick(double now) {
  ++out_.intervals;
  const planner::Signals s = signals(now, true);
  const PoolSize want = scaling_.decide(s);
  logDecision(now, "", s, want);
  resize(now, routing::WorkerRole::kPrefill, std::max(1, want.prefill));
  resize(now, routing::WorkerRole::kDecode, std::max(1, want.decode));
  int32_t p = 0, d = 0;
  for (const Worker& w : workers_) {
    if (w.removing) continue;
    (w.role == routing::WorkerRole::kPrefill ? p : d)++;
  }
  out_.peak_prefill = std::max(out_.peak_prefill, p);
  out_.peak_decode = std::max(out_.peak_decode, d);
  if (open_ > 0) {
    schedule(now + o_.interval_s, EventKind::kTick, 0);
    if (const double every = scaling_.checkEvery(); every > 0) {
      for (double t = now + every; t < now + o_.interval_s - 1e-6; t += every) schedule(t, EventKind::kCheck, 0);
    }
  }
  return absl::OkStatus();
}

void Sim::check(double now) {
  const planner::Signals s = signals(now, false);
  const std::optional<PoolSize> want = scaling_.check(s);
  if (!want) return;
  logDecision(now, "check", s, *want);
  resize(now, routing::WorkerRole::kPrefill, std::max(1, want->prefill));
  resize(now, routing::WorkerRole::kDecode, std::max(1, want->decode));
}

absl::StatusOr<SimResult> Sim::run() {
  const PoolSize start = scaling_.initial();
  resize(0, routing::WorkerRole::kPrefill, std::max(1, start.prefill));
  resize(0, routing::WorkerRole::kDecode, std::max(1, start.decode));
  out_.actions = out_.reversals = 0;
  last_dir_[0] = last_dir_[1] = 0;
  // The initial replicas are up when the trace starts.
  while (!events_.empty()) events_.pop();
  for (Worker& w : workers_) {
    w.created = w.ready_at = -e_.startup_s - e_.warmup_s;
    w.ready = true;
    TANDEM_RETURN_IF_ERROR(cluster_.applySnapshot(snapshot(w)));
  }
  for (size_t i = 0; i < input_.requests.size(); ++i) {
    schedule(input_.requests[i].arrival_s, EventKind::kArrival, i);
    last_arrival_ = std::max(last_arrival_, input_.requests[i].arrival_s);
  }
  open_ = static_cast<int64_t>(input_.requests.size());
  schedule(o_.interval_s, EventKind::kTick, 0);
  schedule(o_.scrape_s, EventKind::kSample, 0);
  while (!events_.empty()) {
    const Event ev = events_.top();
    events_.pop();
    switch (ev.kind) {
      case EventKind::kArrival:
        TANDEM_RETURN_IF_ERROR(arrive(ev.t, ev.a));
        break;
      case EventKind::kComputed:
        TANDEM_RETURN_IF_ERROR(computed(ev.t, ev.b, ev.a));
        break;
      case EventKind::kTransferred: {
        Worker& d = workers_[ev.b];
        d.kv.publishComputed(requests_[ev.a].kv_d);
        join(ev.t, ev.b, ev.a);
        TANDEM_RETURN_IF_ERROR(publish(d));
        break;
      }
      case EventKind::kDecodeFinish:
        TANDEM_RETURN_IF_ERROR(finishDecodes(ev.t, ev.a, ev.b));
        break;
      case EventKind::kReady: {
        Worker& w = workers_[ev.a];
        if (w.removing) break;
        w.ready = true;
        w.ready_at = ev.t;
        w.published = load(w);
        TANDEM_RETURN_IF_ERROR(cluster_.applySnapshot(snapshot(w)));
        break;
      }
      case EventKind::kTick:
        TANDEM_RETURN_IF_ERROR(tick(ev.t));
        break;
      case EventKind::kCheck:
        check(ev.t);
        break;
      case EventKind::kSample:
        sample(ev.t);
        break;
    }
  }
  out_.policy = scaling_.name();
  out_.requests = static_cast<int64_t>(input_.requests.size());
  out_.duration_s = std::max(end_, last_arrival_);
  double gpu_s = 0;
  for (const Worker& w : workers_) {
    const double until = w.gone() ? w.gone_at : out_.duration_s;
    const int gpus = w.role == routing::WorkerRole::kPrefill ? e_.gpus_per_prefill : e_.gpus_per_decode;
    gpu_s += std::max(0.0, until - std::max(0.0, w.created)) * gpus;
  }
  out_.gpu_hours = gpu_s / 3600;
  if (out_.requests > 0) out_.slo_attainment = static_cast<double>(out_.met) / static_cast<double>(out_.requests);
  if (out_.duration_s > 0) out_.goodput = static_cast<double>(out_.met) / out_.duration_s;
  for (const auto& [n, met] : by_interval_) {
    out_.attainment_by_interval.push_back(n > 0 ? static_cast<double>(met) / static_cast<double>(n) : -1);
  }
  out_.p95_ttft_s = nearestRank(ttfts_, 0.95);
  out_.p95_tpot_s = nearestRank(tpots_, 0.95);
  return out_;
}

}  // namespace

absl::StatusOr<SimResult> runSim(const replay::ReplayInput& input, const SimOptions& options, ScalingPolicy& policy) {
  Sim sim(input, options, policy);
  return sim.run();
}

}  // namespace tandem::sim
