#include "e2e/replay/policy_factory.h"

#include "e2e/replay/baseline_policies.h"
#include "e2e/replay/cache_aware_policy.h"
#include "src/common/strings.h"
#include "src/routing/tandem_policy.h"

namespace tandem::replay {

const std::vector<std::string_view>& policyNames() {
  static const std::vector<std::string_view> kNames = {"round_robin", "least_load", "cache_aware", "tandem"};
  return kNames;
}

absl::StatusOr<std::unique_ptr<routing::Policy>> makePolicy(std::string_view name) {
  if (name == "round_robin") return std::make_unique<RoundRobinPolicy>();
  if (name == "least_load") return std::make_unique<LeastLoadPolicy>();
  if (name == "cache_aware") return std::make_unique<CacheAwarePolicy>();
  if (name == "tandem") return std::make_unique<routing::TandemPolicy>();
  return absl::InvalidArgumentError(
      strCat("unknown policy '", name, "' (known: round_robin, least_load, cache_aware, tandem)"));
}

}  // namespace tandem::replay
