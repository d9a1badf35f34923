#pragma once
// Runs a short-lived command to its end (the kubelet's plumbing: iproute2's
// `ip`), capturing what it printed. Not for pods: they are long-lived
// processes with their own logs.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::kubelet {

struct CommandResult {
  int exit_code = 0;   // 128 + N when killed by signal N
  std::string output;  // stdout and stderr, interleaved as written
};

// Looks argv[0] up in PATH. Unavailable when it cannot be started.
absl::StatusOr<CommandResult> runCommand(const std::vector<std::string>& argv);

// OK when the command exits 0; otherwise an error naming the command line,
// its exit status and what it printed.
absl::Status runChecked(const std::vector<std::string>& argv);

}  // namespace tandem::kubelet
