#include "e2e/replay/cache_aware_policy.h"

#include <algorithm>

namespace tandem::replay {

using routing::WorkerView;

bool CacheAwarePolicy::imbalanced(const std::vector<const WorkerView*>& workers) const {
  int64_t max_load = 0;
  int64_t min_load = 0;
  for (size_t i = 0; i < workers.size(); ++i) {
    const int64_t load = outstanding(*workers[i]);
    max_load = i == 0 ? load : std::max(max_load, load);
    min_load = i == 0 ? load : std::min(min_load, load);
  }
  return max_load - min_load > config_.balance_abs_threshold &&
         static_cast<double>(max_load) > static_cast<double>(min_load) * config_.balance_rel_threshold;
}

const WorkerView* CacheAwarePolicy::smallestTree(const std::vector<const WorkerView*>& workers) const {
  const WorkerView* best = nullptr;
  for (const WorkerView* w : workers) {
    if (best == nullptr || tree_.size(w->ref.slot.value()) < tree_.size(best->ref.slot.value())) best = w;
  }
  return best;
}

routing::RouteResult CacheAwarePolicy::route(const routing::RouteRequest& request, const routing::ClusterState& cluster,
                                             const routing::InFlight&) {
  const std::vector<const WorkerView*> workers = decodeWorkers(cluster);
  if (workers.empty()) return routing::NoWorker{routing::NoWorkerReason::kNoDecodeWorker};
  const uint64_t tick = ++tick_;
  const WorkerView* chosen = nullptr;
  if (imbalanced(workers)) {
    chosen = leastLoaded(workers);
  } else {
    const ApproxTree::Match match = tree_.prefixMatch(request.prompt_hashes);
    const double rate = request.prompt_hashes.empty()
                            ? 0.0
                            : static_cast<double>(match.blocks) / static_cast<double>(request.prompt_hashes.size());
    if (rate > config_.cache_threshold) {
      auto holder = std::find_if(workers.begin(), workers.end(),
                                 [&](const WorkerView* w) { return w->ref.slot.value() == *match.tenant; });
      // A holder that is gone or unhealthy: SGLang falls back to the first
      // healthy worker without recording the request.
      if (holder == workers.end()) return decide(*workers.front(), request);
      chosen = *holder;
    } else {
      chosen = smallestTree(workers);
    }
  }
  tree_.insert(request.prompt_hashes, chosen->ref.slot.value(), tick, config_.max_tree_blocks);
  return decide(*chosen, request);
}

}  // namespace tandem::replay
