// tandem-replay: routing policies on a request trace, in simulated time
// (docs/routing.md, "Replay"). The command line is in cli.h.

#include <iostream>
#include <string>
#include <variant>
#include <vector>

#include "e2e/replay/cli.h"
#include "e2e/replay/commands.h"
#include "src/common/strings.h"

int main(int argc, char** argv) {
  using namespace tandem::replay;
  const std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<Command> command = parseCommandLine(args);
  if (!command.ok()) {
    std::cerr << "tandem-replay: " << tandem::toStd(command.status().message()) << "\n\n" << usage();
    return 2;
  }
  absl::Status status;
  if (std::holds_alternative<HelpCommand>(*command)) {
    std::cout << usage();
  } else if (const auto* replay = std::get_if<ReplayCommand>(&*command)) {
    status = runReplayCommand(*replay, std::cout);
  } else {
    status = runGenerateCommand(std::get<GenerateCommand>(*command), std::cout);
  }
  if (!status.ok()) {
    std::cerr << "tandem-replay: " << tandem::toStd(status.message()) << "\n";
    return 1;
  }
  return 0;
}
