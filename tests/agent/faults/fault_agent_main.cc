// tandem-agent-faults: the agent's test build. It is tandem-agent with a
// fault-injecting KV transport (fault_transport.h) in front of UCX,
// configured by these flags of its own (every other flag is tandem-agent's):
//
//   --fault-layer-delay-ms N         P: announce each layer N ms late
//   --fault-get-delay-ms N           D: start each layer's gets N ms late
//   --fault-get-complete-delay-ms N  D: handle each finished layer pull N ms late
//   --fault-fail-first-transfers N   P: abort the first N transfers
//   --fault-stall-first-transfers N  P: accept the first N transfers, never deliver them
//
// Built only with the tests (into build/tests); never shipped.

#include <charconv>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "agent/agent_main.h"
#include "agent/pd_transport.h"
#include "src/common/log.h"
#include "tests/agent/faults/fault_transport.h"

namespace {

using tandem::agent::testing::FaultOptions;

// Takes the --fault-* flags (and their values) out of argv; false on a bad one.
bool takeFaultFlags(std::vector<char*>& args, FaultOptions& faults) {
  std::vector<char*> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string_view flag = args[i];
    if (!flag.starts_with("--fault-")) {
      rest.push_back(args[i]);
      continue;
    }
    int value = 0;
    const std::string_view text = i + 1 < args.size() ? std::string_view(args[++i]) : std::string_view();
    if (text.empty() || std::from_chars(text.data(), text.data() + text.size(), value).ec != std::errc() || value < 0) {
      std::cerr << "tandem-agent-faults: " << flag << " needs a non-negative number\n";
      return false;
    }
    if (flag == "--fault-layer-delay-ms") {
      faults.layer_delay = std::chrono::milliseconds(value);
    } else if (flag == "--fault-get-delay-ms") {
      faults.get_delay = std::chrono::milliseconds(value);
    } else if (flag == "--fault-get-complete-delay-ms") {
      faults.get_complete_delay = std::chrono::milliseconds(value);
    } else if (flag == "--fault-fail-first-transfers") {
      faults.fail_first_transfers = value;
    } else if (flag == "--fault-stall-first-transfers") {
      faults.stall_first_transfers = value;
    } else {
      std::cerr << "tandem-agent-faults: unknown flag " << flag << "\n";
      return false;
    }
  }
  args = std::move(rest);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args(argv, argv + argc);
  FaultOptions faults;
  if (!takeFaultFlags(args, faults)) return 2;
  if (faults.any()) {
    std::cerr << "tandem-agent-faults: FAULT INJECTION IS ON: this agent misbehaves on purpose (test build)\n";
  }
  // The top-level wiring: the system clock for the process's faults.
  auto factory = tandem::agent::testing::faultInjectingTransport(faults, tandem::SystemClock::instance(),
                                                                 tandem::agent::ucxTransportFactory());
  args.push_back(nullptr);
  return tandem::agent::runAgent(static_cast<int>(args.size()) - 1, args.data(), std::move(factory),
                                 "tandem-agent-faults");
}
