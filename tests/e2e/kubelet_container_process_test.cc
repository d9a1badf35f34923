// A pod's container as a process (e2e/kubelet/container_process.h): its
// output in its log, its environment, its exit status, a stop that is
// SIGTERM then SIGKILL after the grace period for the whole process group,
// and a start inside a pod's network namespace (root; skipped without).

#include "e2e/kubelet/container_process.h"

#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "e2e/kubelet/pod_network.h"
#include "tests/testing/quiet_logs.h"
#include "tests/testing/wait.h"

namespace tandem::kubelet {
namespace {

using testutil::waitFor;
using Steady = std::chrono::steady_clock;

// Whether `pid` is dead: gone, or a zombie its new parent has not reaped yet
// (a killed container's orphans are reparented to whoever reaps here).
bool dead(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return true;
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] == 'Z' || stat[paren + 2] == 'X';
}

class ContainerProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("tandem-container-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  ContainerSpec spec(std::string script) {
    return {.argv = {"sh", "-c", std::move(script)}, .log_file = (dir_ / "container.log").string()};
  }
  std::string log() const {
    std::ifstream in(dir_ / "container.log");
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  // Waits (real time) until it ends; its status, or -1.
  static int waitEnd(ContainerProcess& c) {
    std::optional<int> status;
    waitFor([&] { return (status = c.poll()).has_value(); });
    return status.value_or(-1);
  }

  std::filesystem::path dir_;
};

TEST_F(ContainerProcessTest, OutputGoesToItsLogAndItsExitStatusIsKept) {
  ContainerSpec s = spec("echo out; echo err >&2; echo \"$POD_NAME in $POD_NAMESPACE\"; exit 3");
  s.env = {{"POD_NAME", "decode-0"}, {"POD_NAMESPACE", "serving"}};
  auto c = ContainerProcess::start(s);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(waitEnd(**c), 3);
  EXPECT_EQ((*c)->poll(), 3);  // kept
  EXPECT_EQ(log(), "out\nerr\ndecode-0 in serving\n");
  // A second run appends, as a restarted container's log does.
  auto again = ContainerProcess::start(spec("echo again"));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(waitEnd(**again), 0);
  EXPECT_EQ(log(), "out\nerr\ndecode-0 in serving\nagain\n");
}

TEST_F(ContainerProcessTest, StopIsSigtermThenSigkillAfterTheGracePeriod) {
  // Ends on SIGTERM by itself, well within the grace period.
  auto polite = ContainerProcess::start(spec("trap 'echo terminated; exit 0' TERM; echo up; while :; do sleep 0.05; done"));
  ASSERT_TRUE(polite.ok());
  ASSERT_TRUE(waitFor([&] { return log().find("up") != std::string::npos; }));
  const auto t0 = Steady::now();
  EXPECT_EQ((*polite)->stop(std::chrono::seconds(20)), 0);
  EXPECT_LT(Steady::now() - t0, std::chrono::seconds(10));
  EXPECT_NE(log().find("terminated"), std::string::npos);

  // Ignores SIGTERM, and leaves a child behind: both are killed once the
  // grace period is over.
  const std::string child_pid = (dir_ / "child.pid").string();
  auto stubborn = ContainerProcess::start(spec("trap '' TERM; sleep 60 & echo $! > " + child_pid + "; echo ready; wait"));
  ASSERT_TRUE(stubborn.ok());
  ASSERT_TRUE(waitFor([&] { return log().find("ready") != std::string::npos; }));
  pid_t child = 0;
  std::ifstream(child_pid) >> child;
  ASSERT_GT(child, 0);
  const auto t1 = Steady::now();
  EXPECT_EQ((*stubborn)->stop(std::chrono::milliseconds(300)), 128 + SIGKILL);
  EXPECT_GE(Steady::now() - t1, std::chrono::milliseconds(300));
  EXPECT_TRUE(waitFor([&] { return dead(child); })) << "the container's child outlived it";
  EXPECT_EQ((*stubborn)->stop(std::chrono::seconds(1)), 128 + SIGKILL);  // idempotent
}

TEST_F(ContainerProcessTest, AContainerThatEndsTakesWhatItStartedWithIt) {
  const std::string child_pid = (dir_ / "child.pid").string();
  auto c = ContainerProcess::start(spec("sleep 60 & echo $! > " + child_pid + "; exit 0"));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(waitEnd(**c), 0);
  pid_t child = 0;
  std::ifstream(child_pid) >> child;
  ASSERT_GT(child, 0);
  EXPECT_TRUE(waitFor([&] { return dead(child); }));
}

TEST_F(ContainerProcessTest, RunsInsideThePodsNetworkNamespace) {
  if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  const std::string tag = std::to_string(getpid() % 100000);
  auto net = PodNetwork::create({.bridge = "tndc" + tag,
                                 .cidr = "10.244." + std::to_string(200 + getpid() % 50) + ".0/24",
                                 .state_file = (dir_ / "pod-network").string(),
                                 .netns_prefix = "tndc" + tag + "-",
                                 .mode = PodNetworkOptions::Mode::kNamespaces});
  ASSERT_TRUE(net.ok()) << net.status();
  // Torn down however the test ends.
  struct Teardown {
    PodNetwork& net;
    ~Teardown() { (void)net.teardown(); }
  } teardown{**net};
  auto pod = (*net)->addPod("p");
  ASSERT_TRUE(pod.ok()) << pod.status();
  ContainerSpec s = spec("ip -4 -o addr show dev eth0");
  s.exec_prefix = (*net)->execPrefix(*pod);
  auto c = ContainerProcess::start(s);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(waitEnd(**c), 0) << log();
  EXPECT_NE(log().find(pod->ip + "/24"), std::string::npos) << log();
}

TEST_F(ContainerProcessTest, BadSpecsAreNamed) {
  auto msg = [](const ContainerSpec& s) { return std::string(ContainerProcess::start(s).status().message()); };
  EXPECT_NE(msg({.log_file = (dir_ / "l").string()}).find("no command"), std::string::npos);
  EXPECT_NE(msg({.argv = {"true"}, .env = {{"A=B", "c"}}, .log_file = (dir_ / "l").string()})
                .find("environment variable name \"A=B\""),
            std::string::npos);
  EXPECT_NE(msg({.argv = {"true"}, .log_file = "/nonexistent-dir/x.log"}).find("cannot open its log /nonexistent-dir/x.log"),
            std::string::npos);
  EXPECT_NE(msg({.argv = {"no-such-program-anywhere"}, .log_file = (dir_ / "l").string()})
                .find("cannot start no-such-program-anywhere"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem::kubelet
