// tandem-agent: see agent_server.h for what it serves and agent_config.h for
// how it is configured. Exits 0 after a graceful drain on SIGTERM or SIGINT,
// 2 on bad configuration, 1 when start-up fails.

#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <iostream>

#include "agent/agent_config.h"
#include "agent/agent_server.h"
#include "src/common/log.h"
#include "src/common/strings.h"

int main(int argc, char** argv) {
  using namespace tandem;
  bool help = false;
  auto config = agent::parseAgentConfig(argc, argv, &help);
  if (help) {
    std::cout << agent::agentHelp();
    return 0;
  }
  if (!config.ok()) {
    std::cerr << "tandem-agent: " << toStd(config.status().message()) << "\n";
    return 2;
  }
  auto format = parseLogFormat(config->log_format);
  absl::Status logging = configureLogging({.spec = config->log_level, .format = format.ok() ? *format : LogFormat::kText});
  if (!logging.ok()) {
    std::cerr << "tandem-agent: --log-level: " << toStd(logging.message()) << "\n";
    return 2;
  }
  Logger log("agent");

  // Signals are taken synchronously by this thread; every thread started
  // from here on inherits the block.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto server = agent::AgentServer::start(*config);
  if (!server.ok()) {
    log.error("start-up failed", {{"error", toStd(server.status().message())}});
    return 1;
  }
  if (!config->port_file.empty()) {
    std::string tmp = config->port_file + ".tmp";
    std::ofstream(tmp) << (*server)->port() << "\n";
    std::rename(tmp.c_str(), config->port_file.c_str());
  }
  int sig = 0;
  sigwait(&signals, &sig);
  log.info("signal received", {{"signal", sig == SIGTERM ? "SIGTERM" : "SIGINT"}});
  (*server)->drain();
  server->reset();
  log.info("exiting");
  return 0;
}
