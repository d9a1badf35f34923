#include "src/routing/router_config.h"

#include <string_view>

#include "src/common/strings.h"

namespace tandem::routing {

absl::Status validateRouterConfig(const RouterConfig& c) {
  auto nonNegative = [](std::string_view name, double v) {
    return v >= 0 ? absl::OkStatus() : absl::InvalidArgumentError(strCat("router config: ", name, " must be >= 0"));
  };
  for (const auto& [name, v] : {std::pair<std::string_view, double>{"overlap_weight", c.overlap_weight},
                                {"sticky_weight", c.sticky_weight},
                                {"load_floor_weight", c.load_floor_weight},
                                {"queue_penalty", c.queue_penalty},
                                {"tie_epsilon", c.tie_epsilon},
                                {"miss_max_blocks", static_cast<double>(c.miss_max_blocks)},
                                {"direct_max_suffix_tokens", static_cast<double>(c.direct_max_suffix_tokens)},
                                {"prefill_overload_tokens", static_cast<double>(c.prefill_overload_tokens)},
                                {"prefill_balance_tokens", static_cast<double>(c.prefill_balance_tokens)}}) {
    if (absl::Status s = nonNegative(name, v); !s.ok()) return s;
  }
  if (c.capacity_rejections_to_migrate < 1) {
    return absl::InvalidArgumentError("router config: capacity_rejections_to_migrate must be >= 1");
  }
  return absl::OkStatus();
}

}  // namespace tandem::routing
