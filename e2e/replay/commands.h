#pragma once
// Running tandem-replay's commands (cli.h parses them).

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "e2e/replay/cli.h"
#include "e2e/replay/replay.h"

namespace tandem::replay {

// KV blocks per worker: --cache-blocks, or --cache-fraction x the trace's
// unique blocks split evenly (rounded down, at least 1).
int64_t cacheBlocksPerWorker(const ReplayCommand& command, int64_t num_unique_blocks);

// Each policy from a fresh start on the same input and worker model, in order.
[[nodiscard]] absl::StatusOr<std::vector<ReplayResult>> runPolicies(const ReplayInput& input, int num_workers,
                                                                    const WorkerModel& model,
                                                                    const std::vector<std::string>& policies);

// Reads the trace, runs the policies, prints JSON lines or the table to `out`.
[[nodiscard]] absl::Status runReplayCommand(const ReplayCommand& command, std::ostream& out);
// Writes the generated trace to command.out_path, or to `out` when it is empty.
[[nodiscard]] absl::Status runGenerateCommand(const GenerateCommand& command, std::ostream& out);

}  // namespace tandem::replay
