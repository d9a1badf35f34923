#include "e2e/sim/sim_cli.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <iostream>
#include <ostream>

#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_set.h"
#include "e2e/replay/flags.h"
#include "e2e/replay/replay_input.h"
#include "e2e/sim/scaling_policies.h"
#include "e2e/sim/sim_trace.h"
#include "src/common/status.h"
#include "src/common/strings.h"

namespace tandem::sim {
namespace {

using replay::parseNumber;

bool simSwitch(std::string_view name) { return name == "--json" || name == "--help" || name == "--log"; }

// "static:P:D" → its size.
std::optional<PoolSize> staticSize(std::string_view name) {
  if (!name.starts_with("static:")) return std::nullopt;
  const std::string_view rest = name.substr(7);
  const size_t colon = rest.find(':');
  if (colon == std::string_view::npos) return std::nullopt;
  PoolSize s;
  auto p = std::from_chars(rest.data(), rest.data() + colon, s.prefill);
  auto d = std::from_chars(rest.data() + colon + 1, rest.data() + rest.size(), s.decode);
  if (p.ec != std::errc() || p.ptr != rest.data() + colon || d.ec != std::errc() ||
      d.ptr != rest.data() + rest.size() || s.prefill < 1 || s.decode < 1) {
    return std::nullopt;
  }
  return s;
}

absl::Status checkPolicy(std::string_view name) {
  if (name == "static-best" || name == "interval" || name == "tandem" || staticSize(name)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      strCat("--policy: unknown policy '", name, "' (static:P:D with P, D >= 1, static-best, interval, tandem)"));
}

absl::Status setFlag(SimCommand& c, const std::string& name, const std::optional<std::string>& v) {
  EngineModel& e = c.options.engine;
  if (name == "--trace") {
    if (!v || v->empty()) return absl::InvalidArgumentError("--trace needs a file");
    c.trace_path = *v;
  } else if (name == "--format") {
    if (!v || (*v != "mooncake" && *v != "azure")) {
      return absl::InvalidArgumentError(strCat("--format must be mooncake or azure, got '", v.value_or(""), "'"));
    }
    c.format = *v;
  } else if (name == "--gpus") {
    TANDEM_ASSIGN_OR_RETURN(c.gpus, parseNumber<int>(name, v, 2));
  } else if (name == "--load-scale") {
    TANDEM_ASSIGN_OR_RETURN(c.load_scale, parseNumber<int>(name, v, 1));
  } else if (name == "--policy") {
    TANDEM_ASSIGN_OR_RETURN(c.policies, replay::parseNameList(name, v, checkPolicy));
  } else if (name == "--json") {
    if (v) return absl::InvalidArgumentError("--json takes no value");
    c.json = true;
  } else if (name == "--log") {
    if (v) return absl::InvalidArgumentError("--log takes no value");
    c.log = true;
  } else if (name == "--startup-s") {
    TANDEM_ASSIGN_OR_RETURN(e.startup_s, parseNumber<double>(name, v, 0.0));
  } else if (name == "--warmup-s") {
    TANDEM_ASSIGN_OR_RETURN(e.warmup_s, parseNumber<double>(name, v, 0.0));
  } else if (name == "--interval-s") {
    TANDEM_ASSIGN_OR_RETURN(c.options.interval_s, parseNumber<double>(name, v, 1.0));
  } else if (name == "--ttft-slo-s") {
    TANDEM_ASSIGN_OR_RETURN(c.options.slo.ttft_s, parseNumber<double>(name, v, 0.001));
  } else if (name == "--tpot-slo-s") {
    TANDEM_ASSIGN_OR_RETURN(c.options.slo.tpot_s, parseNumber<double>(name, v, 0.0001));
  } else if (name == "--prefill-tokens-per-s") {
    TANDEM_ASSIGN_OR_RETURN(e.prefill_tokens_per_s, parseNumber<double>(name, v, 1.0));
  } else if (name == "--tpot-base-s") {
    TANDEM_ASSIGN_OR_RETURN(e.tpot_base_s, parseNumber<double>(name, v, 0.0001));
  } else if (name == "--tpot-per-seq-s") {
    TANDEM_ASSIGN_OR_RETURN(e.tpot_per_seq_s, parseNumber<double>(name, v, 0.0));
  } else if (name == "--initial") {
    std::optional<PoolSize> size = v ? staticSize(strCat("static:", *v)) : std::nullopt;
    if (!size) return absl::InvalidArgumentError(strCat("--initial must be P:D with P, D >= 1, got '", v.value_or(""), "'"));
    c.initial = size;
  } else if (name == "--scale-up-cooldown-s") {
    TANDEM_ASSIGN_OR_RETURN(c.scale_up_cooldown_s, parseNumber<double>(name, v, 0.0));
  } else if (name == "--scale-up-check-s") {
    TANDEM_ASSIGN_OR_RETURN(double every, parseNumber<double>(name, v, 0.0));
    c.scale_up_check_s = every;
  } else if (name == "--scale-down-cooldown-s") {
    TANDEM_ASSIGN_OR_RETURN(c.scale_down_cooldown_s, parseNumber<double>(name, v, 0.0));
  } else if (name == "--min-replicas") {
    TANDEM_ASSIGN_OR_RETURN(c.min_replicas, parseNumber<int>(name, v, 1));
  } else if (name == "--kv-blocks") {
    TANDEM_ASSIGN_OR_RETURN(e.kv_blocks, parseNumber<int64_t>(name, v, 1));
  } else {
    return absl::InvalidArgumentError(strCat("unknown flag ", name));
  }
  return absl::OkStatus();
}

// Where the dynamic policies start unless --initial says.
PoolSize initialSize(const SimCommand& c) { return c.initial ? *c.initial : defaultInitialSize(c.gpus); }

std::string fmt(double v, const char* f = "%.3f") {
  char buf[32];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

bool better(const SimResult& a, const SimResult& b) {
  if (a.slo_attainment != b.slo_attainment) return a.slo_attainment > b.slo_attainment;
  return a.goodput > b.goodput;
}

}  // namespace

planner::PlannerConfig simPlannerConfig(const SimOptions& o, int gpus, int min_replicas) {
  planner::PlannerConfig c;
  c.ttft_target_s = o.slo.ttft_s;
  c.tpot_target_s = o.slo.tpot_s;
  c.prefill = {min_replicas, gpus};
  c.decode = {min_replicas, gpus};
  c.gpus_per_prefill = o.engine.gpus_per_prefill;
  c.gpus_per_decode = o.engine.gpus_per_decode;
  c.gpu_budget = gpus;
  c.startup_s = o.engine.startup_s;
  c.warmup_s = o.engine.warmup_s;
  c.interval_s = o.interval_s;
  c.scale_up_check_s = o.interval_s / 3;
  return c;
}

PoolSize defaultInitialSize(int gpus) { return PoolSize{std::max(1, gpus / 2), std::max(1, gpus - gpus / 2)}; }

absl::StatusOr<SimCommand> parseSimCommand(const std::vector<std::string>& args) {
  SimCommand c;
  TANDEM_ASSIGN_OR_RETURN(c.help, replay::readFlags(args, 0, simSwitch, [&](const std::string& name, const auto& v) {
                            return setFlag(c, name, v);
                          }));
  if (c.help) return c;
  if (c.trace_path.empty()) return absl::InvalidArgumentError("--trace FILE is required");
  if (c.gpus == 0) return absl::InvalidArgumentError("--gpus N is required");
  if (c.policies.empty()) return absl::InvalidArgumentError("--policy NAME[,NAME...] is required");
  for (const std::string& p : c.policies) {
    if (auto s = staticSize(p); s && s->prefill + s->decode > c.gpus) {
      return absl::InvalidArgumentError(strCat("--policy ", p, " needs ", s->prefill + s->decode, " GPUs; --gpus is ",
                                               c.gpus));
    }
  }
  return c;
}

std::string simUsage() {
  const EngineModel e;
  const SimOptions o;
  return strCat(R"(usage:
  tandem-sim --trace FILE [--format mooncake|azure] --gpus N [--load-scale K]
             --policy NAME[,NAME...] [--startup-s S] [--json]
      Simulates a prefill/decode pool on a request trace under each scaling
      policy: the router's own policy routes, the engines are the model below.
      policies: static:P:D, static-best (the best static split of N GPUs, by
      sweep), interval (throughput-interval baseline), tandem (the planner)
      --format F              mooncake (JSONL, also `tandem-replay generate`) or
                              azure (TIMESTAMP,ContextTokens,GeneratedTokens CSV)
      --gpus N                the GPU budget (one GPU per replica)
      --load-scale K          each request K times, staggered by 3 ms
      --json                  one JSON object per policy and line
      --log                   each interval's signals and decision on stderr, then each
                              interval's SLO attainment
      --startup-s S           a new replica until Ready (default )", e.startup_s, R"()
      --warmup-s S            then at half prefill speed for (default )", e.warmup_s, R"()
      --interval-s S          scaling interval (default )", o.interval_s, R"()
      --ttft-slo-s S          TTFT SLO (default )", o.slo.ttft_s, R"()
      --tpot-slo-s S          TPOT SLO (default )", o.slo.tpot_s, R"()
      --prefill-tokens-per-s X  uncached tokens/s of a prefill replica (default )", e.prefill_tokens_per_s, R"()
      --tpot-base-s X         decode step with one sequence (default )", e.tpot_base_s, R"()
      --tpot-per-seq-s X      added per sequence in the batch (default )", e.tpot_per_seq_s, R"()
      --kv-blocks N           512-token KV blocks per decode replica (default )", e.kv_blocks, R"()
      --initial P:D           where interval and tandem start (default: all the GPUs, 1:1)
      --min-replicas N        the planner's minimum per role (default 2: one can fail)
      --scale-up-cooldown-s S, --scale-down-cooldown-s S
                              the planner's cooldowns (default 0, 450)
      --scale-up-check-s S    the planner checks for growth between intervals this
                              often (default a third of the interval; 0: only at
                              intervals)
  The engine numbers are a model, not a measurement: give your own.
)");
}

absl::StatusOr<std::pair<SimResult, PoolSize>> bestStatic(const replay::ReplayInput& input, const SimOptions& options,
                                                          int gpus) {
  std::map<int, SimResult> runs;  // by prefill replicas
  auto eval = [&](int p) -> absl::Status {
    p = std::clamp(p, 1, gpus - 1);
    if (runs.contains(p)) return absl::OkStatus();
    std::unique_ptr<ScalingPolicy> policy = staticPolicy(PoolSize{p, gpus - p});
    TANDEM_ASSIGN_OR_RETURN(SimResult r, runSim(input, options, *policy));
    runs.emplace(p, std::move(r));
    return absl::OkStatus();
  };
  for (double share : {0.03, 0.06, 0.12, 0.2, 0.3, 0.4, 0.5, 0.65, 0.8}) {
    TANDEM_RETURN_IF_ERROR(eval(static_cast<int>(std::lround(share * gpus))));
  }
  // Refine between the best and its neighbours until they are adjacent.
  for (int round = 0; round < 8; ++round) {
    auto best = runs.begin();
    for (auto it = runs.begin(); it != runs.end(); ++it) {
      if (better(it->second, best->second)) best = it;
    }
    bool added = false;
    if (best != runs.begin()) {
      const int lo = std::prev(best)->first;
      if (best->first - lo > 1) {
        TANDEM_RETURN_IF_ERROR(eval((lo + best->first) / 2));
        added = true;
      }
    }
    if (std::next(best) != runs.end()) {
      const int hi = std::next(best)->first;
      if (hi - best->first > 1) {
        TANDEM_RETURN_IF_ERROR(eval((hi + best->first) / 2));
        added = true;
      }
    }
    if (!added) break;
  }
  auto best = runs.begin();
  for (auto it = runs.begin(); it != runs.end(); ++it) {
    if (better(it->second, best->second)) best = it;
  }
  SimResult r = best->second;
  r.policy = "static-best";
  return std::make_pair(r, PoolSize{best->first, gpus - best->first});
}

std::string simResultJson(const SimResult& r, const std::string& size) {
  nlohmann::json j = {{"policy", r.policy},
                      {"slo_attainment", r.slo_attainment},
                      {"goodput", r.goodput},
                      {"gpu_hours", r.gpu_hours},
                      {"actions", r.actions},
                      {"reversals", r.reversals},
                      {"p95_ttft_s", r.p95_ttft_s},
                      {"p95_tpot_s", r.p95_tpot_s},
                      {"requests", r.requests},
                      {"dropped", r.dropped},
                      {"intervals", r.intervals},
                      {"peak_prefill", r.peak_prefill},
                      {"peak_decode", r.peak_decode},
                      {"duration_s", r.duration_s}};
  if (!size.empty()) j["size"] = size;
  return j.dump();
}

absl::Status runSimCommand(const SimCommand& command, std::ostream& out) {
  SimCommand c = command;
  if (c.log) c.options.log = &std::cerr;
  absl::StatusOr<replay::Trace> trace =
      c.format == "azure" ? readAzureTrace(c.trace_path) : replay::readTrace(c.trace_path);
  if (!trace.ok()) return trace.status();
  const replay::ReplayInput input = replay::prepareReplay(scaleLoad(*trace, c.load_scale));
  std::vector<std::pair<SimResult, std::string>> results;
  for (const std::string& name : c.policies) {
    if (name == "static-best") {
      TANDEM_ASSIGN_OR_RETURN(auto best, bestStatic(input, c.options, c.gpus));
      results.emplace_back(best.first, strCat(best.second.prefill, ":", best.second.decode));
      continue;
    }
    std::unique_ptr<ScalingPolicy> policy;
    if (auto s = staticSize(name)) {
      policy = staticPolicy(*s);
    } else if (name == "interval") {
      policy = intervalPolicy(IntervalOptions{.profile = c.options.engine,
                                              .slo = c.options.slo,
                                              .gpu_budget = c.gpus,
                                              .initial = initialSize(c)});
    } else {
      planner::PlannerConfig config = simPlannerConfig(c.options, c.gpus, c.min_replicas);
      config.scale_up_cooldown_s = c.scale_up_cooldown_s;
      if (c.scale_up_check_s) config.scale_up_check_s = *c.scale_up_check_s;
      config.scale_down_cooldown_s = c.scale_down_cooldown_s;
      TANDEM_RETURN_IF_ERROR(planner::validatePlannerConfig(config));
      policy = tandemPolicy(TandemOptions{.config = config, .initial = initialSize(c)});
    }
    TANDEM_ASSIGN_OR_RETURN(SimResult r, runSim(input, c.options, *policy));
    if (c.log) {
      std::cerr << r.policy << " attainment by interval (of the requests that arrived in it):";
      for (double a : r.attainment_by_interval) std::cerr << ' ' << (a < 0 ? std::string("-") : fmt(a, "%.2f"));
      std::cerr << '\n';
    }
    results.emplace_back(std::move(r), "");
  }
  if (c.json) {
    for (const auto& [r, size] : results) out << simResultJson(r, size) << '\n';
  } else {
    out << "trace " << c.trace_path << " (" << input.requests.size() << " requests, load x" << c.load_scale << "), "
        << c.gpus << " GPUs, SLO TTFT <= " << c.options.slo.ttft_s << " s and TPOT <= " << c.options.slo.tpot_s
        << " s\n";
    out << "policy           size    attainment  goodput/s  GPU-hours  actions  reversals  p95 TTFT s  p95 TPOT s\n";
    for (const auto& [r, size] : results) {
      std::string name = r.policy;
      name.resize(std::max<size_t>(name.size(), 16), ' ');
      std::string sz = size.empty() ? "-" : size;
      sz.resize(std::max<size_t>(sz.size(), 7), ' ');
      out << name << " " << sz << " " << fmt(r.slo_attainment, "%10.3f") << "  " << fmt(r.goodput, "%9.2f") << "  "
          << fmt(r.gpu_hours, "%9.2f") << "  " << fmt(static_cast<double>(r.actions), "%7.0f") << "  "
          << fmt(static_cast<double>(r.reversals), "%9.0f") << "  " << fmt(r.p95_ttft_s, "%10.3f") << "  "
          << fmt(r.p95_tpot_s, "%10.4f") << "\n";
    }
  }
  out.flush();
  if (!out) return absl::DataLossError("writing the results failed");
  return absl::OkStatus();
}

}  // namespace tandem::sim
