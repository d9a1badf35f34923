#include "src/routing/tandem_policy.h"

#include <algorithm>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "src/routing/rendezvous.h"

namespace tandem::routing {
namespace {

int64_t ceilDiv(int64_t a, int64_t b) { return b <= 0 ? 0 : (a + b - 1) / b; }

// One decode worker that passed the hard checks (health, draining, context).
struct Candidate {
  const WorkerView* w = nullptr;
  PendingLoad pending;
  int64_t overlap = 0;    // leading prompt blocks it holds
  int64_t reserve = 0;    // blocks the request needs there
  int64_t assigned = 0;   // resident sessions + running + waiting + in-flight requests
  bool resident = false;  // the request's session is resident there
  bool fits_now = false;  // reserve <= available blocks (see makeCandidate)
  double score = 0;
  uint64_t tie = 0;  // rendezvous weight
};

// One prefill worker that passed the hard checks.
struct PrefillCandidate {
  const WorkerView* w = nullptr;
  int64_t queued = 0;   // prompt tokens: reported waiting + the router's in-flight
  int64_t overlap = 0;  // leading prompt blocks it holds
  uint64_t tie = 0;     // rendezvous weight
};

double freeFraction(const Candidate& c) {
  const WorkerLoad& l = c.w->load;
  return l.total_blocks <= 0
             ? 0.0
             : static_cast<double>(l.free_blocks - c.pending.blocks) / static_cast<double>(l.total_blocks);
}

// Least assigned, then most free KV, then the rendezvous weight.
bool lessLoaded(const Candidate& a, const Candidate& b) {
  if (a.assigned != b.assigned) return a.assigned < b.assigned;
  double fa = freeFraction(a), fb = freeFraction(b);
  if (fa != fb) return fa > fb;
  return a.tie > b.tie;
}

}  // namespace

struct TandemPolicy::Scratch {
  std::vector<int32_t> overlap;  // by slot
  std::vector<Candidate> candidates;
  std::vector<PrefillCandidate> prefill;
};

struct TandemPolicy::Migration {
  int capacity_rejections = 0;
  std::vector<std::string> refused_by;  // decode workers that refused the session for capacity
};

TandemPolicy::TandemPolicy(RouterConfig config) : config_(config), scratch_(std::make_unique<Scratch>()) {}
TandemPolicy::~TandemPolicy() = default;

namespace {

struct RouteContext {
  const RouteRequest& request;
  const ClusterState& cluster;
  const InFlight& in_flight;
  const RouterConfig& config;
  const std::vector<int32_t>& overlap;
  uint64_t key;
  const std::vector<std::string>* excluded;  // migrating away from these, or nullptr
};

bool isExcluded(const RouteContext& ctx, const WorkerView& w) {
  return ctx.excluded != nullptr &&
         std::find(ctx.excluded->begin(), ctx.excluded->end(), w.name) != ctx.excluded->end();
}

// The hard checks: a worker failing one cannot take the request now or later.
bool canEverTake(const RouteContext& ctx, const WorkerView& w) {
  const int64_t total_tokens = ctx.request.prompt_tokens + ctx.request.expected_output_tokens;
  if (w.max_context_tokens > 0 && total_tokens > w.max_context_tokens) return false;
  if (w.load.total_blocks > 0 && ceilDiv(total_tokens, w.block_size) > w.load.total_blocks) return false;
  return true;
}

Candidate makeCandidate(const RouteContext& ctx, const WorkerView& w, bool resident) {
  Candidate c{.w = &w, .pending = ctx.in_flight.at(w.ref)};
  c.overlap = ctx.overlap[w.ref.slot.value()];
  const int64_t total_tokens = ctx.request.prompt_tokens + ctx.request.expected_output_tokens;
  c.reserve = std::max<int64_t>(0, ceilDiv(total_tokens, w.block_size) - c.overlap);
  c.assigned = w.num_resident_sessions + w.load.running + w.load.waiting + c.pending.requests;
  c.resident = resident;
  // Available: reported free (incl. evictable prefix cache), minus the
  // router's in-flight reservations, plus the blocks of the other idle
  // sessions resident there, which D evicts (LRU) to admit a request.
  int64_t own = resident ? ctx.cluster.residentBlocks(w.ref.slot, *ctx.request.session) : 0;
  c.fits_now = c.reserve <= w.load.free_blocks - c.pending.blocks + (w.num_session_blocks - own);
  c.tie = rendezvousWeight(ctx.key, w.name_hash);
  return c;
}

// Decode workers that pass the hard checks, with the migration exclusion
// applied unless it would leave none.
void collectCandidates(const RouteContext& ctx, const std::vector<WorkerSlot>& resident_on, std::vector<Candidate>& out,
                       bool& any_alive) {
  out.clear();
  any_alive = false;
  for (bool honour_exclusion : {true, false}) {
    for (uint32_t s = 0; s < ctx.cluster.slotEnd(); ++s) {
      const WorkerView* w = ctx.cluster.worker(WorkerSlot(s));
      if (w == nullptr || !w->canDecode() || !w->healthy || w->load.draining) continue;
      any_alive = true;
      if (!canEverTake(ctx, *w) || (honour_exclusion && isExcluded(ctx, *w))) continue;
      bool resident = std::find(resident_on.begin(), resident_on.end(), WorkerSlot(s)) != resident_on.end();
      out.push_back(makeCandidate(ctx, *w, resident && !isExcluded(ctx, *w)));
    }
    if (!out.empty() || ctx.excluded == nullptr) return;
  }
}

// The score of issue 14 §3 for the candidates that fit now; returns the best
// (near-ties within tie_epsilon go to the highest rendezvous weight).
const Candidate* bestScored(const RouteContext& ctx, std::span<Candidate> feasible, bool resident_somewhere) {
  double mean = 0;
  for (const Candidate& c : feasible) mean += static_cast<double>(c.assigned);
  mean /= static_cast<double>(feasible.size());
  const double prompt_blocks = static_cast<double>(std::max<size_t>(1, ctx.request.prompt_hashes.size()));
  double best = -std::numeric_limits<double>::infinity();
  for (Candidate& c : feasible) {
    c.score = ctx.config.overlap_weight * static_cast<double>(c.overlap) / prompt_blocks;
    if (c.resident) c.score += ctx.config.sticky_weight;
    // Graduated bonus below the mean; never pulls a session away from where it is resident.
    const bool floor_applies = ctx.request.session.has_value() || ctx.config.load_floor_without_session;
    if (floor_applies && mean > 0 && (!resident_somewhere || c.resident)) {
      c.score += ctx.config.load_floor_weight * std::clamp((mean - static_cast<double>(c.assigned)) / mean, 0.0, 1.0);
    }
    c.score -= ctx.config.queue_penalty * static_cast<double>(c.w->load.waiting + c.pending.requests);
    best = std::max(best, c.score);
  }
  const Candidate* pick = nullptr;
  for (const Candidate& c : feasible) {
    if (c.score >= best - ctx.config.tie_epsilon && (pick == nullptr || c.tie > pick->tie)) pick = &c;
  }
  return pick;
}

// A prefill worker by token-load balance among non-overloaded P; P-side
// overlap breaks ties within prefill_balance_tokens. nullptr when there is none.
const WorkerView* choosePrefill(const RouteContext& ctx, std::vector<PrefillCandidate>& ps, int64_t& overlap_out) {
  using P = PrefillCandidate;
  ps.clear();
  bool any_not_overloaded = false;
  for (uint32_t s = 0; s < ctx.cluster.slotEnd(); ++s) {
    const WorkerView* w = ctx.cluster.worker(WorkerSlot(s));
    if (w == nullptr || !w->canPrefill() || !w->healthy || w->load.draining || !canEverTake(ctx, *w)) continue;
    int64_t queued = w->load.waiting_prompt_tokens + ctx.in_flight.at(w->ref).tokens;
    ps.push_back({w, queued, ctx.overlap[s], rendezvousWeight(ctx.key, w->name_hash)});
    any_not_overloaded |= queued <= ctx.config.prefill_overload_tokens;
  }
  if (any_not_overloaded) {
    std::erase_if(ps, [&](const P& p) { return p.queued > ctx.config.prefill_overload_tokens; });
  }
  if (ps.empty()) return nullptr;
  int64_t min_queued = std::numeric_limits<int64_t>::max();
  for (const P& p : ps) min_queued = std::min(min_queued, p.queued);
  const P* pick = nullptr;
  for (const P& p : ps) {
    if (p.queued > min_queued + ctx.config.prefill_balance_tokens) continue;
    if (pick == nullptr || p.overlap > pick->overlap ||
        (p.overlap == pick->overlap && (p.queued < pick->queued || (p.queued == pick->queued && p.tie > pick->tie)))) {
      pick = &p;
    }
  }
  overlap_out = pick->overlap;
  return pick->w;
}

// Fills the path and the prefill worker of `d` for the chosen decode worker `c`.
void choosePath(const RouteContext& ctx, const Candidate& c, std::vector<PrefillCandidate>& scratch, Decision& d) {
  const int64_t bs = c.w->block_size;
  const int64_t suffix = std::max<int64_t>(0, ctx.request.prompt_tokens - c.overlap * bs);
  if (c.resident && suffix <= ctx.config.direct_max_suffix_tokens) {
    d.path = RoutePath::kDirect;
    d.prefill_tokens = suffix;
    return;
  }
  int64_t p_overlap = 0;
  const WorkerView* p = choosePrefill(ctx, scratch, p_overlap);
  if (p == nullptr || p == c.w) {  // no prefill worker, or D itself (role kBoth): D computes the prompt
    d.path = RoutePath::kDirect;
    d.prefill_tokens = suffix;
    return;
  }
  d.path = RoutePath::kDisagg;
  d.prefill = p->name;
  d.prefill_ref = p->ref;
  d.prefill_cached_blocks = p_overlap;
  d.prefill_tokens = std::max<int64_t>(0, ctx.request.prompt_tokens - p_overlap * p->block_size);
}

}  // namespace

RouteResult TandemPolicy::route(const RouteRequest& request, const ClusterState& cluster, const InFlight& in_flight) {
  Scratch& s = *scratch_;
  s.overlap.assign(cluster.slotEnd(), 0);
  cluster.prefixOverlap(request.prompt_hashes, s.overlap);
  const Migration* migration = nullptr;
  if (request.session) {
    auto it = migrations_.find(request.session->value());
    if (it != migrations_.end() && it->second->capacity_rejections >= config_.capacity_rejections_to_migrate) {
      migration = it->second.get();
    }
  }
  RouteContext ctx{request,
                   cluster,
                   in_flight,
                   config_,
                   s.overlap,
                   rendezvousKey(request),
                   migration != nullptr ? &migration->refused_by : nullptr};
  std::vector<WorkerSlot> resident_on;
  if (request.session) resident_on = cluster.residentOn(*request.session);

  bool any_alive = false;
  collectCandidates(ctx, resident_on, s.candidates, any_alive);
  if (s.candidates.empty()) {
    return NoWorker{any_alive ? NoWorkerReason::kTooLong : NoWorkerReason::kNoDecodeWorker};
  }
  auto fits_end =
      std::partition(s.candidates.begin(), s.candidates.end(), [](const Candidate& c) { return c.fits_now; });
  std::span<Candidate> feasible(s.candidates.begin(), fits_end);

  const Candidate* pick = nullptr;
  DecisionReason reason = DecisionReason::kScored;
  const bool resident_somewhere =
      std::any_of(feasible.begin(), feasible.end(), [](const Candidate& c) { return c.resident; });
  int64_t max_overlap = 0;
  for (const Candidate& c : feasible) max_overlap = std::max(max_overlap, c.overlap);
  if (feasible.empty()) {
    pick = &*std::min_element(s.candidates.begin(), s.candidates.end(), lessLoaded);
    reason = DecisionReason::kNoneFree;
  } else if (!resident_somewhere && max_overlap <= config_.miss_max_blocks) {
    pick = &*std::min_element(feasible.begin(), feasible.end(), lessLoaded);
    reason = DecisionReason::kLeastLoaded;
  } else {
    pick = bestScored(ctx, feasible, resident_somewhere);
    reason = pick->resident ? DecisionReason::kSticky : DecisionReason::kScored;
  }
  if (migration != nullptr && reason != DecisionReason::kNoneFree) reason = DecisionReason::kMigrated;

  Decision d{.decode = pick->w->name, .decode_ref = pick->w->ref, .reason = reason};
  d.reserve_blocks = pick->reserve;
  d.decode_cached_blocks = pick->overlap;
  d.score = pick->score;
  d.num_feasible = static_cast<int>(feasible.size());
  choosePath(ctx, *pick, s.prefill, d);
  return d;
}

void TandemPolicy::onAssigned(const RouteRequest& request, const Decision& decision) {}

void TandemPolicy::onFinished(const RouteRequest& request, const Decision& decision) {
  if (request.session) migrations_.erase(request.session->value());
}

void TandemPolicy::onRejected(const RouteRequest& request, const Decision& decision, RejectReason reason) {
  if (reason != RejectReason::kCapacity || !request.session) return;
  // Sessions abandoned after a refusal never reach onFinished; bound the
  // table so a long-running router cannot grow it without limit. Starting
  // the counts over only delays a migration: worker state still leads.
  if (migrations_.size() >= kMaxTrackedMigrations && !migrations_.contains(request.session->value())) {
    migrations_.clear();
  }
  auto& m = migrations_[request.session->value()];
  if (!m) m = std::make_unique<Migration>();
  ++m->capacity_rejections;
  if (std::find(m->refused_by.begin(), m->refused_by.end(), decision.decode) == m->refused_by.end()) {
    m->refused_by.push_back(decision.decode);
  }
}

}  // namespace tandem::routing
