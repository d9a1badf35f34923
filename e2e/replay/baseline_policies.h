#pragma once
// The baseline routing policies tandem-replay compares the tandem policy
// with. They choose a decode worker only (no scoring of P): the simulated
// workers compute the prompt tokens they do not hold themselves.
//
// Load, for every baseline, is what the router itself counts: requests it
// sent to a worker that have not finished or been refused (SGLang's router
// and Envoy's least-request count the same), so a burst spreads at once.
//
//   round_robin  the next healthy, non-draining decode worker in slot order
//   least_load   the one with the fewest outstanding requests (lowest slot on a tie)
//   cache_aware  cache_aware_policy.h
//
// Not thread-safe; one owner (the replay loop).

#include <cstdint>
#include <string_view>
#include <vector>

#include "src/routing/policy.h"

namespace tandem::replay {

// Counts outstanding requests per worker slot in the policy callbacks.
class BaselinePolicy : public routing::Policy {
 public:
  void onAssigned(const routing::RouteRequest& request, const routing::Decision& decision) override;
  void onFinished(const routing::RouteRequest& request, const routing::Decision& decision) override;
  void onRejected(const routing::RouteRequest& request, const routing::Decision& decision,
                  routing::RejectReason reason) override;

 protected:
  // Healthy, non-draining decode workers, in slot order.
  static std::vector<const routing::WorkerView*> decodeWorkers(const routing::ClusterState& cluster);
  int64_t outstanding(const routing::WorkerView& w) const;
  // A decision naming `w` as the decode worker, which computes the prompt:
  // no cache knowledge, so the whole prompt and output are reserved.
  static routing::Decision decide(const routing::WorkerView& w, const routing::RouteRequest& request);
  // The worker with the fewest outstanding requests; lowest slot on a tie.
  const routing::WorkerView* leastLoaded(const std::vector<const routing::WorkerView*>& workers) const;

 private:
  std::vector<int64_t> outstanding_;  // by slot
};

class RoundRobinPolicy final : public BaselinePolicy {
 public:
  std::string_view name() const override { return "round_robin"; }
  routing::RouteResult route(const routing::RouteRequest& request, const routing::ClusterState& cluster,
                             const routing::InFlight& in_flight) override;

 private:
  uint64_t next_ = 0;
};

class LeastLoadPolicy final : public BaselinePolicy {
 public:
  std::string_view name() const override { return "least_load"; }
  routing::RouteResult route(const routing::RouteRequest& request, const routing::ClusterState& cluster,
                             const routing::InFlight& in_flight) override;
};

}  // namespace tandem::replay
