// tandem-sim: a prefill/decode pool in simulated time under scaling
// policies (docs/planner.md, "Simulator"). The command line is in sim_cli.h.

#include <iostream>
#include <string>
#include <vector>

#include "e2e/sim/sim_cli.h"
#include "src/common/strings.h"

int main(int argc, char** argv) {
  using namespace tandem::sim;
  const std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<SimCommand> command = parseSimCommand(args);
  if (!command.ok()) {
    std::cerr << "tandem-sim: " << tandem::toStd(command.status().message()) << "\n\n" << simUsage();
    return 2;
  }
  if (command->help) {
    std::cout << simUsage();
    return 0;
  }
  if (absl::Status s = runSimCommand(*command, std::cout); !s.ok()) {
    std::cerr << "tandem-sim: " << tandem::toStd(s.message()) << "\n";
    return 1;
  }
  return 0;
}
