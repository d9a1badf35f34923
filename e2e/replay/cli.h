#pragma once
// tandem-replay's command line (docs/routing.md, "Replay"):
//
//   tandem-replay --trace FILE --workers N (--cache-blocks B | --cache-fraction F)
//                 --policy NAME[,NAME...] [--json]
//                 [--prefill-tokens-per-s 10000] [--decode-tokens-per-s 50]
//                 [--max-waiting 256] [--direct-max-suffix-tokens 2048]
//   tandem-replay generate --sessions N --shape 32K|48K|64K [--seed 1] [--active 24]
//                 [--system-tokens 4096] [--tool-s 10] [--out FILE]
//   tandem-replay --help
//
// Flags take their value as the next argument or after '='. Parsing only:
// nothing is read or run here (commands.h runs them).

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "e2e/replay/generator.h"
#include "e2e/replay/sim_worker.h"

namespace tandem::replay {

struct ReplayCommand {
  std::string trace_path;
  int num_workers = 0;
  std::optional<int64_t> cache_blocks;   // per worker
  std::optional<double> cache_fraction;  // of the trace's unique blocks, all workers together
  std::vector<std::string> policies;
  bool json = false;
  WorkerModel model;  // cache_blocks is set from the two above when the trace is read
};

struct GenerateCommand {
  GeneratorOptions options;
  std::string out_path;  // empty: stdout
};

struct HelpCommand {};

using Command = std::variant<ReplayCommand, GenerateCommand, HelpCommand>;

// `args` without the program name. Errors say which flag and why.
[[nodiscard]] absl::StatusOr<Command> parseCommandLine(const std::vector<std::string>& args);

std::string usage();

}  // namespace tandem::replay
