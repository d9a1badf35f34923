#pragma once
// Starts tandem-apiserver (from $TANDEM_BIN_DIR) on a free loopback port for
// one test, and runs the real kubectl against it with a private discovery
// cache. Used by the k8s-labelled tests.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/spawn.h"
#include "tests/testing/wait.h"

extern char** environ;

namespace tandem::e2e {

struct CommandResult {
  int rc = -1;
  std::string output;  // stdout and stderr together
};

inline std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

using ::tandem::testutil::waitFor;

class ApiServerFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tandem-k8s-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    kubeconfig_ = dir_ + "/kubeconfig";
    const char* bin = std::getenv("TANDEM_BIN_DIR");
    ASSERT_NE(bin, nullptr) << "TANDEM_BIN_DIR is not set";
    std::string exe = std::string(bin) + "/tandem-apiserver";
    std::string portFile = dir_ + "/port";
    std::vector<std::string> args = {exe,         "--listen",    "127.0.0.1:0", "--kubeconfig-out",
                                     kubeconfig_, "--port-file", portFile,      "--bookmark-interval",
                                     "200ms",     "--log-level", "warn"};
    for (const auto& a : extraArgs()) args.push_back(a);
    // Its log goes to a file of the test's (not the test's own output, which a
    // pipeline reading the test would then wait on after a crash).
    pid_ = testutil::spawnLogged(args, dir_ + "/apiserver.log");
    ASSERT_GT(pid_, 0) << "cannot start " << exe;
    ASSERT_TRUE(waitFor([&] { return std::filesystem::exists(portFile); }, std::chrono::seconds(10)))
        << "tandem-apiserver did not start: " << readFile(dir_ + "/apiserver.log");
    port_ = std::stoi(readFile(portFile));
  }

  void TearDown() override {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      // Shutdown takes at most a few seconds; a server that outlives this
      // ignored SIGTERM: fail loudly instead of hanging until CTest's timeout.
      int status = 0;
      bool exited = waitFor([&] { return waitpid(pid_, &status, WNOHANG) == pid_; }, std::chrono::seconds(15));
      if (!exited) {
        ADD_FAILURE() << "tandem-apiserver (pid " << pid_ << ") did not exit within 15s of SIGTERM; killing it";
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
      }
    }
    std::filesystem::remove_all(dir_);
  }

  virtual std::vector<std::string> extraArgs() const { return {}; }
  // The flags that serve TLS with a fresh self-signed certificate for `altNames`
  // ("IP:127.0.0.1,..."), made with the openssl command line.
  std::vector<std::string> tlsArgs(const std::string& altNames) const {
    const std::string cert = dir_ + "/apiserver.pem", key = dir_ + "/apiserver.key";
    const auto made = shell("openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=tandem-apiserver -keyout " +
                            key + " -out " + cert + " -addext subjectAltName=" + altNames + " 2>&1");
    EXPECT_EQ(made.rc, 0) << "could not make a certificate with the openssl command line: " << made.output;
    return {"--tls-cert", cert, "--tls-key", key};
  }

  std::string baseUrl() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::string kubectlPrefix() const {
    return "kubectl --request-timeout=10s --kubeconfig " + kubeconfig_ + " --cache-dir " + dir_ + "/cache ";
  }

  // Runs `kubectl <args>` through the shell; waits for it.
  CommandResult kubectl(const std::string& args) const { return shell(kubectlPrefix() + args); }

  static CommandResult shell(const std::string& command) {
    CommandResult r;
    FILE* p = popen((command + " 2>&1").c_str(), "r");
    if (p == nullptr) return r;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
    int status = pclose(p);
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
  }

  // Writes `content` to a file in the test's directory; returns its path.
  std::string writeTemp(const std::string& name, const std::string& content) const {
    std::string path = dir_ + "/" + name;
    std::ofstream(path) << content;
    return path;
  }

  static std::string testdata(const std::string& name) { return std::string(TANDEM_TESTDATA_DIR) + "/" + name; }

  std::string dir_;
  std::string kubeconfig_;
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace tandem::e2e
