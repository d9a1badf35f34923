#include "e2e/replay/cli.h"

#include <string_view>

#include "absl/container/flat_hash_set.h"
#include "e2e/replay/flags.h"
#include "e2e/replay/policy_factory.h"
#include "src/common/status.h"
#include "src/common/strings.h"

namespace tandem::replay {
namespace {

absl::StatusOr<std::vector<std::string>> parsePolicies(const std::optional<std::string>& value) {
  return parseNameList("--policy", value, [](const std::string& name) { return makePolicy(name).status(); });
}

bool replaySwitch(std::string_view name) { return name == "--json" || name == "--help"; }
bool generateSwitch(std::string_view name) { return name == "--help"; }

absl::Status setReplayFlag(ReplayCommand& c, const std::string& name, const std::optional<std::string>& v) {
  if (name == "--trace") {
    if (!v || v->empty()) return absl::InvalidArgumentError("--trace needs a file");
    c.trace_path = *v;
  } else if (name == "--workers") {
    TANDEM_ASSIGN_OR_RETURN(c.num_workers, parseNumber<int>(name, v, 1));
  } else if (name == "--cache-blocks") {
    TANDEM_ASSIGN_OR_RETURN(c.cache_blocks, parseNumber<int64_t>(name, v, 1));
  } else if (name == "--cache-fraction") {
    TANDEM_ASSIGN_OR_RETURN(c.cache_fraction, parseNumber<double>(name, v, 0.0));
    if (*c.cache_fraction <= 0) return absl::InvalidArgumentError("--cache-fraction must be > 0");
  } else if (name == "--policy") {
    TANDEM_ASSIGN_OR_RETURN(c.policies, parsePolicies(v));
  } else if (name == "--json") {
    if (v) return absl::InvalidArgumentError("--json takes no value");
    c.json = true;
  } else if (name == "--prefill-tokens-per-s") {
    TANDEM_ASSIGN_OR_RETURN(c.model.prefill_tokens_per_s, parseNumber<double>(name, v, 1.0));
  } else if (name == "--decode-tokens-per-s") {
    TANDEM_ASSIGN_OR_RETURN(c.model.decode_tokens_per_s, parseNumber<double>(name, v, 0.001));
  } else if (name == "--max-waiting") {
    TANDEM_ASSIGN_OR_RETURN(c.model.max_waiting, parseNumber<int>(name, v, 1));
  } else if (name == "--direct-max-suffix-tokens") {
    TANDEM_ASSIGN_OR_RETURN(c.model.direct_max_suffix_tokens, parseNumber<int64_t>(name, v, 0));
  } else {
    return absl::InvalidArgumentError(strCat("unknown flag ", name));
  }
  return absl::OkStatus();
}

absl::StatusOr<Command> parseReplay(const std::vector<std::string>& args) {
  ReplayCommand c;
  TANDEM_ASSIGN_OR_RETURN(bool help, readFlags(args, 0, replaySwitch, [&](const std::string& name, const auto& value) {
                            return setReplayFlag(c, name, value);
                          }));
  if (help) return HelpCommand{};
  if (c.trace_path.empty()) return absl::InvalidArgumentError("--trace FILE is required");
  if (c.num_workers == 0) return absl::InvalidArgumentError("--workers N is required");
  if (c.cache_blocks.has_value() == c.cache_fraction.has_value()) {
    return absl::InvalidArgumentError("give exactly one of --cache-blocks B and --cache-fraction F");
  }
  if (c.policies.empty()) return absl::InvalidArgumentError("--policy NAME[,NAME...] is required");
  return c;
}

absl::Status setGenerateFlag(GenerateCommand& c, const std::string& name, const std::optional<std::string>& v) {
  GeneratorOptions& o = c.options;
  if (name == "--sessions") {
    TANDEM_ASSIGN_OR_RETURN(o.num_sessions, parseNumber<int>(name, v, 1));
  } else if (name == "--shape") {
    std::optional<SessionShape> shape = v ? findSessionShape(*v) : std::nullopt;
    if (!shape)
      return absl::InvalidArgumentError(strCat("--shape must be 32K, 48K or 64K, got '", v.value_or(""), "'"));
    o.shape = *shape;
  } else if (name == "--seed") {
    TANDEM_ASSIGN_OR_RETURN(o.seed, parseNumber<uint64_t>(name, v, 0));
  } else if (name == "--active") {
    TANDEM_ASSIGN_OR_RETURN(o.active_sessions, parseNumber<double>(name, v, 0.001));
  } else if (name == "--system-tokens") {
    TANDEM_ASSIGN_OR_RETURN(o.system_prompt_tokens, parseNumber<int64_t>(name, v, 0));
  } else if (name == "--tool-s") {
    TANDEM_ASSIGN_OR_RETURN(o.tool_time_s, parseNumber<double>(name, v, 0.0));
  } else if (name == "--out") {
    if (!v || v->empty()) return absl::InvalidArgumentError("--out needs a file");
    c.out_path = *v;
  } else {
    return absl::InvalidArgumentError(strCat("unknown flag for generate: ", name));
  }
  return absl::OkStatus();
}

absl::StatusOr<Command> parseGenerate(const std::vector<std::string>& args) {
  GenerateCommand c;
  TANDEM_ASSIGN_OR_RETURN(bool help,
                          readFlags(args, 1, generateSwitch, [&](const std::string& name, const auto& value) {
                            return setGenerateFlag(c, name, value);
                          }));
  if (help) return HelpCommand{};
  return c;
}

}  // namespace

absl::StatusOr<Command> parseCommandLine(const std::vector<std::string>& args) {
  if (!args.empty() && args[0] == "generate") return parseGenerate(args);
  return parseReplay(args);
}

std::string usage() {
  const WorkerModel m;
  const GeneratorOptions g;
  return strCat(R"(usage:
  tandem-replay --trace FILE --workers N (--cache-blocks B | --cache-fraction F)
                --policy NAME[,NAME...] [--json]
      Replays a Mooncake-format trace (JSONL: timestamp ms, input_length,
      output_length, hash_ids of 512-token blocks, optional session_id) through
      each routing policy on the same simulated workers.
      policies: round_robin, least_load, cache_aware, tandem
      --cache-blocks B            KV blocks per worker
      --cache-fraction F          all workers together hold F x the trace's unique blocks
      --json                      one JSON object per policy and line
      --prefill-tokens-per-s X    a worker's prefill speed (default )",
                m.prefill_tokens_per_s, R"()
      --decode-tokens-per-s X     one decoding request's speed (default )",
                m.decode_tokens_per_s, R"()
      --max-waiting N             queued requests a worker accepts (default )",
                m.max_waiting, R"()
      --direct-max-suffix-tokens N  uncached suffix a worker computes direct-to-D
                                  for a resident session (default )",
                m.direct_max_suffix_tokens, R"()
  tandem-replay generate --sessions N --shape 32K|48K|64K [--seed S] [--active A]
                [--system-tokens T] [--tool-s S] [--out FILE]
      Writes agentic session traces (DualPath shapes) in the same format.
      --sessions N       sessions (default )",
                g.num_sessions, R"()
      --shape S          DualPath shape (default )",
                g.shape.name, R"()
      --seed S           the same seed gives the same trace (default )",
                g.seed, R"()
      --active A         about A sessions at once (default )",
                g.active_sessions, R"()
      --system-tokens T  shared system prompt (default )",
                g.system_prompt_tokens, R"()
      --tool-s S         mean time between an answer and the next turn (default )",
                g.tool_time_s, R"()
)");
}

}  // namespace tandem::replay
