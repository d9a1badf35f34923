#pragma once
// A local cluster for one test: tandem-apiserver (ApiServerFixture) and
// tandem-kubelet on a bridge and pod CIDR of the test's own, removed after
// it, whatever the kubelet left (label e2e and operator tests; root, for
// the pod network). KubeletApiAccessTest runs the emulator over TLS with a
// certificate for the `kubernetes` Service, so pods get in-cluster access.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/e2e/apiserver_fixture.h"
#include "tests/testing/spawn.h"

namespace tandem::e2e {

using ::tandem::testutil::spawnLogged;

class KubeletTest : public ApiServerFixture {
 protected:
  void SetUp() override {
    ApiServerFixture::SetUp();
    const int tag = getpid() % 100000;
    bridge_ = "tndk" + std::to_string(tag);
    cidr_prefix_ = "10.245." + std::to_string(tag % 250) + ".";
    startKubelet();
  }

  void TearDown() override {
    stopKubelet(SIGTERM);
    const std::string links = shell("ip -br link show type bridge").output;
    EXPECT_THAT(links, ::testing::Not(::testing::HasSubstr(bridge_))) << "the kubelet left its bridge";
    // A kubelet that crashed left its network: remove what its state file
    // lists, so the next test starts clean (the failure is reported above).
    std::ifstream state(dir_ + "/kubelet/network.json");
    std::string kind, name;
    while (state >> kind >> name) {
      if (kind == "netns") shell("ip netns del " + name);
      if (kind == "veth" || kind == "bridge") shell("ip link del " + name);
    }
    // And its containers' process groups.
    const std::string records = readFile(dir_ + "/kubelet/processes.json");
    std::smatch m;
    for (std::string rest = records; std::regex_search(rest, m, std::regex("\"pgid\":([0-9]+)")); rest = m.suffix()) {
      kill(-std::stoi(m[1]), SIGKILL);
    }
    ApiServerFixture::TearDown();
  }

  void startKubelet() {
    const std::string exe = std::string(std::getenv("TANDEM_BIN_DIR")) + "/tandem-kubelet";
    std::vector<std::string> args = {
        exe,           "--kubeconfig", kubeconfig_,  "--state-dir",         dir_ + "/kubelet",
        "--bridge",    bridge_,        "--pod-cidr", cidr_prefix_ + "0/24", "--netns-prefix",
        netnsPrefix(), "--stop-grace", "2",          "--scrape-targets",    dir_ + "/scrape-targets.json"};
    for (const auto& n : nodes_) {
      args.push_back("--node");
      args.push_back(n);
    }
    const std::string log = dir_ + "/kubelet.log";
    kubelet_ = spawnLogged(args, log);
    ASSERT_GT(kubelet_, 0) << "cannot start " << exe;
    ASSERT_TRUE(waitFor([&] { return kubectl("get nodes").output.find("True") != std::string::npos; },
                        std::chrono::seconds(20)))
        << readFile(log);
  }

  void stopKubelet(int sig) {
    if (kubelet_ <= 0) return;
    kill(kubelet_, sig);
    int status = 0;
    if (!waitFor([&] { return waitpid(kubelet_, &status, WNOHANG) == kubelet_; }, std::chrono::seconds(30))) {
      ADD_FAILURE() << "tandem-kubelet did not exit after signal " << sig;
      kill(kubelet_, SIGKILL);
      waitpid(kubelet_, &status, 0);
    }
    kubelet_ = -1;
  }

  void apply(const std::string& name, const std::string& yaml) {
    auto r = kubectl("apply -f " + writeTemp(name, yaml));
    ASSERT_EQ(r.rc, 0) << r.output;
  }
  std::string get(const std::string& what, const std::string& jsonpath) {
    return kubectl("get " + what + " -o 'jsonpath=" + jsonpath + "'").output;
  }
  bool eventually(const std::function<bool()>& f, int seconds = 20) {
    return waitFor(f, std::chrono::seconds(seconds));
  }
  std::string kubeletLog() { return readFile(dir_ + "/kubelet.log"); }
  // The test's own, so a kubelet of another test (or `./tandem up`) running
  // beside it never holds a pod namespace of the same name.
  std::string netnsPrefix() const { return bridge_ + "-"; }

  std::string bridge_, cidr_prefix_;
  std::vector<std::string> nodes_;
  pid_t kubelet_ = -1;
};

// The emulator over TLS with a certificate for 127.0.0.1 and the
// `kubernetes` Service's address, as a cluster's API server has: pods get
// in-cluster API access.
class KubeletApiAccessTest : public KubeletTest {
 protected:
  std::vector<std::string> extraArgs() const override { return tlsArgs("IP:127.0.0.1,IP:10.96.0.1"); }
};

}  // namespace tandem::e2e
