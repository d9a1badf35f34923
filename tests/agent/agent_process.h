#pragma once
// Runs the real tandem-agent binary as a child process on 127.0.0.1 (port 0,
// reported through --port-file) with the built-in tiny model, for
// integration tests. Waits for /readyz; stop() sends a signal and returns
// the exit status.

#include <signal.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/model/model_loader.h"
#include "engine/model/weights.h"
#include "src/http/client.h"
#include "tests/testing/wait.h"

extern char** environ;

namespace tandem::agent::testing {

// This test binary's scratch directory: the tiny model and each agent's log,
// trace and port file. Removed when the binary exits with every test passed;
// kept (and named on stderr) when one failed, so the agents' logs can be read.
inline const std::filesystem::path& testScratchDir() {
  // Never freed: a static finished after the exit hook was registered (as a
  // path here would be) is destroyed before the hook runs.
  static const std::filesystem::path* const dir = [] {
    auto* d = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                        ("tandem-agent-test-" + std::to_string(getpid())));
    std::filesystem::create_directories(*d);
    std::atexit([] {
      const std::filesystem::path& path = testScratchDir();
      if (::testing::UnitTest::GetInstance()->Failed()) {
        std::fprintf(stderr, "agent logs and traces kept in %s\n", path.c_str());
        return;
      }
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    });
    return d;
  }();
  return *dir;
}

// The tiny model, written once per test binary.
inline const std::string& tinyModelDir() {
  static const std::string dir = [] {
    std::string d = testScratchDir() / "tiny";
    std::filesystem::create_directories(d);
    absl::Status s = engine::writeModelDir(d, *engine::makeRandomWeights(engine::tinyModelConfig(), 1234), engine::DType::kF32);
    if (!s.ok()) ADD_FAILURE() << s;
    return d;
  }();
  return dir;
}

// A copy of the tiny model in `name` whose tokenizer_config.json has
// `chat_template`, so the agent renders chats with it.
inline std::string tinyModelWithChatTemplate(const std::string& name, const std::string& chat_template) {
  const std::filesystem::path dir = testScratchDir() / name;
  std::filesystem::create_directories(dir);
  for (const auto& f : std::filesystem::directory_iterator(tinyModelDir())) {
    std::filesystem::copy(f.path(), dir / f.path().filename(), std::filesystem::copy_options::overwrite_existing);
  }
  std::ifstream in(dir / "tokenizer_config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config["chat_template"] = chat_template;
  std::ofstream(dir / "tokenizer_config.json") << config.dump();
  return dir.string();
}

class AgentProcess {
 public:
  // `binary`: the agent's executable; empty: tandem-agent in TANDEM_BIN_DIR
  // (tests that inject faults pass the test build, tandem-agent-faults).
  static std::unique_ptr<AgentProcess> start(std::vector<std::string> extra_args, std::string binary = "") {
    auto p = std::unique_ptr<AgentProcess>(new AgentProcess());
    static int counter = 0;
    p->dir_ = testScratchDir() / ("agent-" + std::to_string(counter++));
    std::filesystem::create_directories(p->dir_);
    const char* bin_dir = std::getenv("TANDEM_BIN_DIR");
    std::string bin = !binary.empty() ? binary : std::string(bin_dir ? bin_dir : "build/bin") + "/tandem-agent";
    std::vector<std::string> args = {bin, "--model-dir", tinyModelDir(), "--listen", "127.0.0.1:0",
                                     "--port-file", p->dir_ + "/port", "--trace-file", p->dir_ + "/trace.jsonl",
                                     "--log-level", "warn"};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    std::string log = p->dir_ + "/agent.log";
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    int rc = posix_spawn(&p->pid_, bin.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
      ADD_FAILURE() << "cannot start " << bin << ": " << strerror(rc);
      return nullptr;
    }
    bool exited = false;
    const bool ready = ::tandem::testutil::waitFor(
        [&] {
          int status = 0;
          if (waitpid(p->pid_, &status, WNOHANG) == p->pid_) return exited = true;
          std::ifstream pf(p->dir_ + "/port");
          int port = 0;
          if (!(pf >> port) || port <= 0) return false;
          pf >> p->kv_port_;
          p->base_ = "http://127.0.0.1:" + std::to_string(port);
          auto r = http::httpGet(p->base_ + "/readyz", std::chrono::seconds(2));
          return r.ok() && r->status == 200;
        },
        std::chrono::seconds(60), std::chrono::milliseconds(20));
    if (exited) {
      p->pid_ = 0;
      ADD_FAILURE() << bin << " exited during start-up: " << p->log();
      return nullptr;
    }
    if (ready) return p;
    ADD_FAILURE() << "tandem-agent did not become ready: " << p->log();
    return nullptr;
  }

  ~AgentProcess() {
    if (pid_ > 0) stop(SIGKILL);
  }

  std::string url(const std::string& path) const { return base_ + path; }
  pid_t pid() const { return pid_; }
  int kvPort() const { return kv_port_; }
  std::string log() const { return slurp(dir_ + "/agent.log"); }
  std::string trace() const { return slurp(dir_ + "/trace.jsonl"); }

  // Sends `sig` and waits (up to 60 s); returns the exit code, or 128 + signal.
  int stop(int sig = SIGTERM) {
    if (pid_ <= 0) return -1;
    kill(pid_, sig);
    return waitExit();
  }

  // Waits for the process to exit on its own (up to 60 s, then SIGKILL).
  int waitExit() {
    if (pid_ <= 0) return -1;
    int status = 0;
    if (!::tandem::testutil::waitFor([&] { return waitpid(pid_, &status, WNOHANG) != 0; }, std::chrono::seconds(60),
                                     std::chrono::milliseconds(10))) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
    }
    pid_ = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  AgentProcess() = default;
  static std::string slurp(const std::string& path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  std::string dir_;
  std::string base_;
  pid_t pid_ = 0;
  int kv_port_ = 0;
};

// A /metrics scrape ("" if the agent does not answer).
inline std::string scrape(const AgentProcess& a) {
  auto r = http::httpGet(a.url("/metrics"));
  return r.ok() ? r->body : "";
}

using ::tandem::testutil::waitFor;

// The value of one sample line "name{labels} value" in a metrics scrape; -1 if absent.
inline double metricValue(const std::string& scrape, const std::string& series_prefix) {
  std::istringstream in(scrape);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(series_prefix, 0) == 0) return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

// The value of the series of `name` whose labels include `label` (e.g.
// reason="capacity"); -1 if absent. Labels are serialized sorted by name.
inline double metricValueWith(const std::string& scrape, const std::string& name, const std::string& label) {
  std::istringstream in(scrape);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + "{", 0) == 0 && line.find(label) != std::string::npos) {
      return std::stod(line.substr(line.rfind(' ') + 1));
    }
  }
  return -1;
}

// The value of the series of `name` whose labels include every one of
// `labels` (each like state="suspect"); -1 if absent.
inline double seriesValue(const std::string& scrape, const std::string& name, const std::vector<std::string>& labels) {
  std::istringstream in(scrape);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + "{", 0) != 0) continue;
    bool all = true;
    for (const std::string& l : labels) all = all && line.find(l) != std::string::npos;
    if (all) return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

// What `promtool check metrics` says of a scrape that it should not: every
// output line except the lint findings for the names the design fixes (the
// Gateway API Inference Extension's vllm:* names contain ':'), plus a line
// naming promtool's exit status when it could not parse the text (promtool
// exits 1 then, 3 on lint findings). Empty: the scrape is clean.
inline std::vector<std::string> promtoolComplaints(const std::string& scrape) {
  static std::atomic<int> counter{0};
  const std::string path =
      ::testing::TempDir() + "/scrape_" + std::to_string(getpid()) + "_" + std::to_string(counter++) + ".txt";
  { std::ofstream(path) << scrape; }
  FILE* p = popen(("promtool check metrics < " + path + " 2>&1").c_str(), "r");
  std::vector<std::string> complaints;
  if (p == nullptr) return {"cannot run promtool"};
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof(buf), p)) out += buf;
  const int rc = WEXITSTATUS(pclose(p));
  std::remove(path.c_str());
  if (rc != 0 && rc != 3) complaints.push_back("promtool exit status " + std::to_string(rc));
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    if (line.rfind("vllm:", 0) == 0 && line.find(" metric names should not contain ':'") != std::string::npos) continue;
    complaints.push_back(line);
  }
  return complaints;
}

}  // namespace tandem::agent::testing
