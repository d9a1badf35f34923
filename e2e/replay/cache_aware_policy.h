#pragma once
// The SGLang router's `cache_aware` policy (sgl-router, policies/cache_aware.rs),
// with its documented defaults, for comparison:
//
//  1. Load is the router's own count of outstanding requests per worker.
//     The system is imbalanced when (max - min) > balance_abs_threshold AND
//     max > min * balance_rel_threshold: then the least-loaded worker gets
//     the request (the tree still records it there).
//  2. Otherwise the approximate tree (approx_tree.h) finds the longest prefix
//     of the prompt that any worker was sent; if that covers more than
//     cache_threshold of the prompt, the worker that holds it gets the
//     request, else the worker with the smallest tree ("most free cache",
//     which ignores load: issue 14's failure mode 4).
//  3. The tree records the prompt under the chosen worker; a worker's tree
//     is cut back, least recently used first, to max_tree_blocks.
//
// Deviations, each because of what the replay is: prompts are block-hash
// chains, so match rate and tree size count 512-token blocks, not
// characters (2^26 characters at about 4 characters per token and 512
// tokens per block is 32,768 blocks); the tree is cut back on every insert
// rather than every 120 s (a policy has no clock); among several holders of
// the matched prefix the most recently used one wins (SGLang takes an
// arbitrary one). Not thread-safe; one owner.

#include <cstdint>
#include <string_view>

#include "e2e/replay/approx_tree.h"
#include "e2e/replay/baseline_policies.h"

namespace tandem::replay {

struct CacheAwareConfig {
  double cache_threshold = 0.3;
  int64_t balance_abs_threshold = 64;
  double balance_rel_threshold = 1.5;
  int64_t max_tree_blocks = 32768;
};

class CacheAwarePolicy final : public BaselinePolicy {
 public:
  explicit CacheAwarePolicy(CacheAwareConfig config = {}) : config_(config) {}

  std::string_view name() const override { return "cache_aware"; }
  routing::RouteResult route(const routing::RouteRequest& request, const routing::ClusterState& cluster,
                             const routing::InFlight& in_flight) override;

 private:
  bool imbalanced(const std::vector<const routing::WorkerView*>& workers) const;
  // The worker whose tree is smallest; lowest slot on a tie.
  const routing::WorkerView* smallestTree(const std::vector<const routing::WorkerView*>& workers) const;

  CacheAwareConfig config_;
  ApproxTree tree_;
  uint64_t tick_ = 0;
};

}  // namespace tandem::replay
