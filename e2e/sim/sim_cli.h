#pragma once
// tandem-sim's command line (docs/planner.md, "Simulator"):
//
//   tandem-sim --trace FILE [--format mooncake|azure] --gpus N [--load-scale K]
//              --policy NAME[,NAME...] [--startup-s S] [--json]
//              [--interval-s 30] [--ttft-slo-s 4] [--tpot-slo-s 0.05]
//              [--prefill-tokens-per-s X] [--tpot-base-s X] [--tpot-per-seq-s X]
//              [--kv-blocks N] [--warmup-s S] [--initial P:D]
//              [--scale-up-cooldown-s S] [--scale-down-cooldown-s S] [--scale-up-check-s S]
//              [--min-replicas N] [--log]
//   policies: static:P:D, static-best (the hindsight sweep), interval, tandem
//
// parseSimCommand only parses; runSimCommand reads the trace, runs each
// policy and prints one JSON object per policy (--json) or a table.

#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "e2e/sim/cluster_sim.h"

namespace tandem::sim {

struct SimCommand {
  std::string trace_path;
  std::string format = "mooncake";
  int gpus = 0;
  int load_scale = 1;
  std::vector<std::string> policies;
  bool json = false;
  bool log = false;  // --log: each interval's decision on stderr
  bool help = false;
  SimOptions options;
  std::optional<PoolSize> initial;      // --initial P:D (dynamic policies' starting size)
  // The planner's, for policy tandem.
  double scale_up_cooldown_s = planner::PlannerConfig{}.scale_up_cooldown_s;
  double scale_down_cooldown_s = planner::PlannerConfig{}.scale_down_cooldown_s;
  std::optional<double> scale_up_check_s;  // nullopt: a third of the interval
  int min_replicas = 2;  // the planner's minimum per role
};

[[nodiscard]] absl::StatusOr<SimCommand> parseSimCommand(const std::vector<std::string>& args);
std::string simUsage();
absl::Status runSimCommand(const SimCommand& command, std::ostream& out);

// The planner's configuration for a run (policy tandem): the run's SLOs as
// its p95 targets, `gpus` as its budget and maximum per role,
// `min_replicas` per role, the engine model's start-up and warm-up, the
// planner's default cooldowns, and growth checked every third of the interval.
planner::PlannerConfig simPlannerConfig(const SimOptions& options, int gpus, int min_replicas);
// Where the dynamic policies start by default: all the GPUs, split evenly
// (a pool with no history is deployed generously; the planner shrinks it
// once it has seen one stabilization window).
PoolSize defaultInitialSize(int gpus);

// One policy's result as a JSON line's object.
std::string simResultJson(const SimResult& r, const std::string& size);

// The best static split of `gpus` for `input` found by sweep (highest SLO
// attainment, then goodput): a coarse grid of prefill shares refined around
// the best. Errors only when a run is broken.
[[nodiscard]] absl::StatusOr<std::pair<SimResult, PoolSize>> bestStatic(const replay::ReplayInput& input,
                                                                        const SimOptions& options, int gpus);

}  // namespace tandem::sim
