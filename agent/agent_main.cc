#include "agent/agent_main.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <thread>

#include "agent/agent_config.h"
#include "agent/agent_server.h"
#include "agent/api_keys.h"
#include "agent/tensor_parallel_ranks.h"
#include "agent/router/router_server.h"
#include "src/common/log.h"
#include "src/common/strings.h"

namespace {

// Signals arrive on whichever thread the kernel picks (OpenBLAS starts its
// threads before main, so masking cannot cover them all). The handler only
// writes the signal number into a pipe; the main thread reads it.
int g_signal_pipe[2] = {-1, -1};

extern "C" void onSignal(int sig) {
  const int saved = errno;
  const char c = static_cast<char>(sig);
  [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &c, 1);
  errno = saved;
}

int waitForSignal() {
  char c = 0;
  while (read(g_signal_pipe[0], &c, 1) < 0 && errno == EINTR) {
  }
  return c;
}

}  // namespace

namespace tandem::agent {
namespace {

// `tandem-agent hash-api-key --name NAME`: reads an API key on stdin (one
// line; surrounding whitespace ignored) and prints its entry for the API
// keys file (docs/api-keys.md), so the key itself is never written down.
// Exits 0, or 2 with the reason on stderr.
int hashApiKeyCommand(int argc, char** argv, const char* program) {
  const std::string usage = strCat("usage: ", program, " hash-api-key --name NAME < KEY");
  std::string name;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << usage << "\nPrints the API keys file's entry (name and SHA-256) for the key read on stdin.\n";
      return 0;
    }
    if (a.starts_with("--name=")) {
      name = std::string(a.substr(7));
    } else if (a == "--name" && i + 1 < argc) {
      name = argv[++i];
    } else {
      std::cerr << program << " hash-api-key: unexpected argument \"" << a << "\"\n" << usage << "\n";
      return 2;
    }
  }
  if (absl::Status s = checkApiKeyName(name); !s.ok()) {
    std::cerr << program << " hash-api-key: --name: " << toStd(s.message()) << "\n" << usage << "\n";
    return 2;
  }
  std::string key((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  while (!key.empty() && std::isspace(static_cast<unsigned char>(key.back()))) key.pop_back();
  size_t start = 0;
  while (start < key.size() && std::isspace(static_cast<unsigned char>(key[start]))) ++start;
  key.erase(0, start);
  if (absl::Status s = checkApiKey(key); !s.ok()) {
    std::cerr << program << " hash-api-key: the key on stdin: " << toStd(s.message()) << "\n";
    return 2;
  }
  std::cout << apiKeyFileEntry(name, hashApiKey(key));
  return 0;
}

}  // namespace

int runAgent(int argc, char** argv, transport::KvTransportFactory kv_transport_factory, const char* program) {
  if (argc >= 2 && std::string_view(argv[1]) == "hash-api-key") return hashApiKeyCommand(argc - 1, argv + 1, program);
  if (argc >= 2 && std::string_view(argv[1]) == "tensor-parallel-rank") {
    return runTensorParallelRank(argc - 1, argv + 1, program);
  }
  bool help = false;
  auto config = parseAgentConfig(argc, argv, &help);
  if (help) {
    std::cout << agentHelp();
    return 0;
  }
  if (!config.ok()) {
    std::cerr << program << ": " << toStd(config.status().message()) << "\n";
    return 2;
  }
  auto format = parseLogFormat(config->log_format);
  absl::Status logging =
      configureLogging({.spec = config->log_level, .format = format.ok() ? *format : LogFormat::kText});
  if (!logging.ok()) {
    std::cerr << program << ": --log-level: " << toStd(logging.message()) << "\n";
    return 2;
  }
  Logger log("agent");

  if (pipe2(g_signal_pipe, O_CLOEXEC) != 0) {  // not inherited by the tensor-parallel ranks
    log.error("cannot create the signal pipe");
    return 1;
  }
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // Role router holds no engine: its own server (router/router_server.h).
  std::unique_ptr<AgentServer> agent;
  std::unique_ptr<RouterServer> router;
  absl::Status started = absl::OkStatus();
  if (config->role == AgentRole::kRouter) {
    auto r = RouterServer::start(*config, SystemClock::instance());
    if (r.ok()) router = std::move(*r);
    started = r.status();
  } else {
    auto a = AgentServer::start(*config, SystemClock::instance(), std::move(kv_transport_factory));
    if (a.ok()) agent = std::move(*a);
    started = a.status();
  }
  if (!started.ok()) {
    log.error("start-up failed", {{"error", toStd(started.message())}});
    return 1;
  }
  if (!config->port_file.empty()) {
    std::string tmp = config->port_file + ".tmp";
    std::ofstream(tmp) << (router ? router->port() : agent->port()) << "\n" << (agent ? agent->kvPort() : 0) << "\n";
    std::rename(tmp.c_str(), config->port_file.c_str());
  }
  int sig = waitForSignal();
  log.info("signal received", {{"signal", sig == SIGTERM ? "SIGTERM" : "SIGINT"}});
  // Further signals while draining are noted and ignored: the drain is
  // bounded by drain_grace, and Kubernetes follows up with SIGKILL anyway.
  std::thread([&log] {
    for (;;) {
      waitForSignal();
      log.warn("already draining; signal ignored");
    }
  }).detach();
  if (router) {
    router->drain();
    router.reset();
  } else {
    agent->drain();
    agent.reset();
  }
  log.info("exiting");
  return 0;
}

}  // namespace tandem::agent
