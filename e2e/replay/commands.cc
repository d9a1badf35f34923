#include "e2e/replay/commands.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include "e2e/replay/generator.h"
#include "e2e/replay/policy_factory.h"
#include "e2e/replay/replay_input.h"
#include "e2e/replay/report.h"
#include "src/common/status.h"
#include "src/common/strings.h"

namespace tandem::replay {

int64_t cacheBlocksPerWorker(const ReplayCommand& command, int64_t num_unique_blocks) {
  if (command.cache_blocks) return *command.cache_blocks;
  const double total = *command.cache_fraction * static_cast<double>(num_unique_blocks);
  return std::max<int64_t>(1, static_cast<int64_t>(std::floor(total / command.num_workers)));
}

absl::StatusOr<std::vector<ReplayResult>> runPolicies(const ReplayInput& input, int num_workers,
                                                      const WorkerModel& model,
                                                      const std::vector<std::string>& policies) {
  std::vector<ReplayResult> results;
  for (const std::string& name : policies) {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<routing::Policy> policy, makePolicy(name));
    TANDEM_ASSIGN_OR_RETURN(ReplayResult r, runReplay(input, num_workers, model, *policy));
    results.push_back(std::move(r));
  }
  return results;
}

absl::Status runReplayCommand(const ReplayCommand& command, std::ostream& out) {
  TANDEM_ASSIGN_OR_RETURN(Trace trace, readTrace(command.trace_path));
  const ReplayInput input = prepareReplay(trace);
  WorkerModel model = command.model;
  model.cache_blocks = cacheBlocksPerWorker(command, input.num_unique_blocks);
  TANDEM_ASSIGN_OR_RETURN(std::vector<ReplayResult> results,
                          runPolicies(input, command.num_workers, model, command.policies));
  if (command.json) {
    for (const ReplayResult& r : results) out << resultJson(r) << '\n';
  } else {
    out << resultTable(RunSummary{.trace = command.trace_path,
                                  .num_requests = static_cast<int64_t>(input.requests.size()),
                                  .num_unique_blocks = input.num_unique_blocks,
                                  .num_workers = command.num_workers,
                                  .cache_blocks_per_worker = model.cache_blocks},
                       results);
  }
  out.flush();
  if (!out) return absl::DataLossError("writing the results failed");
  return absl::OkStatus();
}

absl::Status runGenerateCommand(const GenerateCommand& command, std::ostream& out) {
  TANDEM_ASSIGN_OR_RETURN(Trace trace, generateSessions(command.options));
  if (command.out_path.empty()) {
    writeTrace(trace, out);
    out.flush();
    if (!out) return absl::DataLossError("writing the trace failed");
    return absl::OkStatus();
  }
  std::ofstream file(command.out_path);
  if (!file) return absl::NotFoundError(strCat(command.out_path, ": cannot create"));
  writeTrace(trace, file);
  file.close();
  if (!file) return absl::DataLossError(strCat(command.out_path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace tandem::replay
