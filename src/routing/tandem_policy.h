#pragma once
// The "tandem" routing policy (issue 14 §3, docs/routing.md):
//  1. feasibility first: healthy, not draining, context fits, and free blocks
//     for prompt - cached + expected output, counting the router's in-flight
//     reservations;
//  2. score: prefix overlap + session stickiness + graduated load-floor bonus
//     (never for a session resident elsewhere) - queue penalty; a miss goes to
//     the least-loaded feasible worker; near-ties are broken by rendezvous
//     hashing of the session id, so replicas agree;
//  3. path: direct-to-D when the session is resident there and the uncached
//     suffix is short, else a P by token-load balance among non-overloaded P,
//     P-side overlap breaking ties;
//  4. rejections: after K capacity rejections of a session, migrate it.
// The weights and thresholds are RouterConfig (router_config.h).
// Not thread-safe (like every Policy): one owner.

#include <memory>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "src/routing/policy.h"
#include "src/routing/router_config.h"

namespace tandem::routing {

class TandemPolicy final : public Policy {
 public:
  explicit TandemPolicy(RouterConfig config = {});
  ~TandemPolicy() override;

  std::string_view name() const override { return "tandem"; }
  RouteResult route(const RouteRequest& request, const ClusterState& cluster, const InFlight& in_flight) override;
  void onAssigned(const RouteRequest& request, const Decision& decision) override;
  void onFinished(const RouteRequest& request, const Decision& decision) override;
  void onRejected(const RouteRequest& request, const Decision& decision, RejectReason reason) override;

  const RouterConfig& config() const { return config_; }
  // Validated by the caller (validateRouterConfig); sessions counted for migration keep their counts.
  bool setConfig(const RouterConfig& config) override {
    config_ = config;
    return true;
  }
  // Sessions whose capacity rejections are counted at once, at most.
  static constexpr size_t kMaxTrackedMigrations = 65536;
  // Sessions with counted capacity rejections now (a gauge for the router role).
  size_t numTrackedMigrations() const { return migrations_.size(); }

 private:
  struct Scratch;
  struct Migration;
  RouterConfig config_;
  std::unique_ptr<Scratch> scratch_;  // per-decision buffers, reused
  // Sessions refused for capacity: count and the workers that refused.
  absl::flat_hash_map<std::string, std::unique_ptr<Migration>> migrations_;
};

}  // namespace tandem::routing
