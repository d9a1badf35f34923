#pragma once
// Routing policies by the names tandem-replay's --policy takes.

#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "src/routing/policy.h"

namespace tandem::replay {

// "round_robin", "least_load", "cache_aware", "tandem".
const std::vector<std::string_view>& policyNames();

// A fresh policy with its documented defaults; kInvalidArgument for an unknown name.
[[nodiscard]] absl::StatusOr<std::unique_ptr<routing::Policy>> makePolicy(std::string_view name);

}  // namespace tandem::replay
