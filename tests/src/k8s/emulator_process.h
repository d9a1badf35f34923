#pragma once
// Runs tandem-apiserver (the API-server emulator) as a child process on
// 127.0.0.1 for the client's tests: port 0, a kubeconfig and port file in a
// temp dir, extra flags as given. Stopping is bounded: an emulator that
// outlives SIGTERM by 15 s is reported and killed, never waited on forever.

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "src/common/clock.h"
#include "src/common/strings.h"
#include "tests/testing/wait.h"

extern char** environ;

namespace tandem::k8s::testing {

using ::tandem::testutil::waitFor;

class EmulatorProcess {
 public:
  explicit EmulatorProcess(std::vector<std::string> flags) {
    const char* bin_dir = std::getenv("TANDEM_BIN_DIR");
    binary_ = strCat(bin_dir ? bin_dir : "build/bin", "/tandem-apiserver");
    if (!std::filesystem::exists(binary_)) return;
    char tmpl[] = "/tmp/k8s_emulator.XXXXXX";
    dir_ = mkdtemp(tmpl);
    std::vector<std::string> args = {binary_,     "--listen",    "127.0.0.1:0", "--kubeconfig-out", kubeconfig(),
                                     "--port-file", dir_ + "/port", "--log-level", "warn"};
    args.insert(args.end(), flags.begin(), flags.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, binary_.c_str(), nullptr, nullptr, argv.data(), environ) != 0) pid_ = -1;
  }
  ~EmulatorProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      if (!waitFor([&] { return waitpid(pid_, &status, WNOHANG) == pid_; }, std::chrono::seconds(15))) {
        ADD_FAILURE() << "tandem-apiserver (pid " << pid_ << ") did not exit within 15 s of SIGTERM; killing it";
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
      }
    }
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  EmulatorProcess(const EmulatorProcess&) = delete;
  EmulatorProcess& operator=(const EmulatorProcess&) = delete;

  bool available() const { return std::filesystem::exists(binary_); }
  // True once the emulator serves (it writes the port file after it accepts connections).
  bool waitReady(Duration timeout = std::chrono::seconds(30)) const {
    return pid_ > 0 && waitFor([&] { return std::filesystem::exists(dir_ + "/port"); }, timeout);
  }
  std::string kubeconfig() const { return dir_ + "/kubeconfig"; }

 private:
  std::string binary_;
  std::string dir_;
  pid_t pid_ = -1;
};

}  // namespace tandem::k8s::testing
