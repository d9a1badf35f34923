// The process kubelet's pod network (e2e/kubelet/pod_network.h) with the real
// iproute2 on this machine: two pods each listen on the same container port
// in their own namespace, the host and the other pod reach them by pod IP,
// removal and teardown leave nothing, and a kubelet killed before its
// teardown has its leftovers removed by the next one. Needs root (every
// machine here is); skipped, saying so, without it.

#include "e2e/kubelet/pod_network.h"

#include <arpa/inet.h>
#include <signal.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "e2e/kubelet/command.h"
#include "tests/testing/quiet_logs.h"

namespace tandem::kubelet {
namespace {

// Names no other test process uses at the same time.
std::string unique(std::string_view base) { return std::string(base) + std::to_string(getpid() % 100000); }

bool netnsExists(const std::string& ns) { return std::filesystem::exists("/var/run/netns/" + ns); }
bool linkExists(const std::string& name) {
  absl::StatusOr<CommandResult> r = runCommand({"ip", "link", "show", name});
  return r.ok() && r->exit_code == 0;
}

// A child that enters `ns`, listens on port 8100 and answers `reply` to each
// of `connections` connections, then exits 0 (non-zero at any failure).
pid_t serveInNamespace(const std::string& ns, const std::string& reply, int connections) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  alarm(60);  // never outlives a test that failed before connecting
  const int fd = open(("/var/run/netns/" + ns).c_str(), O_RDONLY);
  if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) _exit(2);
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(8100);
  if (bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(s, 4) != 0) _exit(3);
  for (int i = 0; i < connections; ++i) {
    const int c = accept(s, nullptr, nullptr);
    if (c < 0) _exit(4);
    if (write(c, reply.data(), reply.size()) != static_cast<ssize_t>(reply.size())) _exit(5);
    close(c);
  }
  _exit(0);
}

// What ip:8100 answers, connecting from `ns` (empty: the host); retried
// while the listener starts.
std::string fetch(const std::string& ip, const std::string& ns = "") {
  int pipefd[2];
  if (pipe(pipefd) != 0) return "pipe failed";
  const pid_t pid = fork();
  if (pid == 0) {
    close(pipefd[0]);
    if (!ns.empty()) {
      const int fd = open(("/var/run/netns/" + ns).c_str(), O_RDONLY);
      if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) _exit(2);
    }
    for (int attempt = 0; attempt < 1200; ++attempt) {  // 30 s
      const int s = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(8100);
      inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
      if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
        char buf[64];
        const ssize_t n = read(s, buf, sizeof buf);
        if (n > 0 && write(pipefd[1], buf, static_cast<size_t>(n)) != n) _exit(3);
        _exit(0);
      }
      close(s);
      usleep(25000);
    }
    _exit(1);
  }
  close(pipefd[1]);
  std::string out;
  char buf[64];
  ssize_t n = 0;
  while ((n = read(pipefd[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return out;
}

class PodNetworkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
    dir_ = std::filesystem::temp_directory_path() / unique("tandem-podnet-");
    std::filesystem::create_directories(dir_);
    options_ = {.bridge = unique("tndb"),
                .cidr = "10.244." + std::to_string(100 + getpid() % 100) + ".0/24",
                .state_file = (dir_ / "pod-network").string(),
                .netns_prefix = unique("tndt") + "-",
                .mode = PodNetworkOptions::Mode::kNamespaces};
  }
  void TearDown() override {
    if (net_) {
      EXPECT_TRUE(net_->teardown().ok());
    }
    // Whatever a failed test left: a new instance removes what the state
    // file lists, and its own bridge goes with its teardown.
    if (auto sweep = PodNetwork::create(options_); sweep.ok()) (void)(*sweep)->teardown();
    std::filesystem::remove_all(dir_);
  }

  std::filesystem::path dir_;
  PodNetworkOptions options_;
  std::unique_ptr<PodNetwork> net_;
};

TEST_F(PodNetworkTest, PodsKeepTheSamePortAndReachEachOtherAndTheHost) {
  auto net = PodNetwork::create(options_);
  ASSERT_TRUE(net.ok()) << net.status();
  net_ = std::move(*net);
  ASSERT_TRUE(net_->usesNamespaces());
  auto a = net_->addPod("decode-0");
  auto b = net_->addPod("prefill-0");
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  EXPECT_NE(a->ip, b->ip);
  EXPECT_EQ(a->ip.substr(0, a->ip.rfind('.')), net_->gateway().substr(0, net_->gateway().rfind('.')));
  EXPECT_EQ(net_->addPod("decode-0")->ip, a->ip);  // the same pod, the same address
  EXPECT_TRUE(netnsExists(a->netns));
  EXPECT_EQ(net_->execPrefix(*a), (std::vector<std::string>{"ip", "netns", "exec", a->netns}));

  // Both listen on 8100; the host reaches each by IP, and pod b reaches pod a.
  const pid_t sa = serveInNamespace(a->netns, "from a", 2), sb = serveInNamespace(b->netns, "from b", 1);
  EXPECT_EQ(fetch(a->ip), "from a");
  EXPECT_EQ(fetch(b->ip), "from b");
  EXPECT_EQ(fetch(a->ip, b->netns), "from a");
  for (pid_t p : {sa, sb}) {
    if (HasFailure()) kill(p, SIGKILL);
    int status = 0;
    ASSERT_EQ(waitpid(p, &status, 0), p);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }

  ASSERT_TRUE(net_->removePod("decode-0").ok());
  EXPECT_FALSE(netnsExists(a->netns));
  EXPECT_FALSE(net_->address("decode-0"));
  // Its address is free again, and reachable at the new pod.
  auto c = net_->addPod("decode-1");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ip, a->ip);
  const pid_t sc = serveInNamespace(c->netns, "from c", 1);
  EXPECT_EQ(fetch(c->ip), "from c");
  if (HasFailure()) kill(sc, SIGKILL);
  waitpid(sc, nullptr, 0);
  ASSERT_TRUE(net_->teardown().ok());
  EXPECT_FALSE(netnsExists(b->netns));
  EXPECT_FALSE(linkExists(options_.bridge));
  net_.reset();
}

// A kubelet killed before its teardown (here: destroyed without one) leaves
// its namespaces, veths and bridge; the next one removes them from the state
// file before it starts.
TEST_F(PodNetworkTest, TheNextKubeletRemovesWhatAKilledOneLeft) {
  std::string ns;
  {
    auto first = PodNetwork::create(options_);
    ASSERT_TRUE(first.ok()) << first.status();
    auto a = (*first)->addPod("left-behind");
    ASSERT_TRUE(a.ok()) << a.status();
    ns = a->netns;
  }
  ASSERT_TRUE(netnsExists(ns));
  ASSERT_TRUE(linkExists(options_.bridge));
  std::ifstream state(options_.state_file);
  std::string text((std::istreambuf_iterator<char>(state)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("netns " + ns), std::string::npos) << text;

  auto second = PodNetwork::create(options_);
  ASSERT_TRUE(second.ok()) << second.status();
  net_ = std::move(*second);
  EXPECT_FALSE(netnsExists(ns));
  EXPECT_TRUE(linkExists(options_.bridge));  // its own, new
  auto b = net_->addPod("after-restart");
  ASSERT_TRUE(b.ok()) << b.status();
}

// A namespace of the same name that is not this kubelet's is neither taken
// nor, on the failure, deleted.
TEST_F(PodNetworkTest, ANameSomeoneElseHoldsIsRefusedAndLeftAlone) {
  auto net = PodNetwork::create(options_);
  ASSERT_TRUE(net.ok()) << net.status();
  net_ = std::move(*net);
  const std::string foreign = options_.netns_prefix + "taken";
  ASSERT_TRUE(runChecked({"ip", "netns", "add", foreign}).ok());
  auto taken = net_->addPod("taken");
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kAlreadyExists) << taken.status();
  EXPECT_TRUE(netnsExists(foreign));
  EXPECT_FALSE(net_->address("taken"));
  EXPECT_TRUE(net_->addPod("other").ok());
  EXPECT_TRUE(runChecked({"ip", "netns", "del", foreign}).ok());
}

TEST(PodNetworkLoopbackTest, WithoutNamespacesEachPodGetsItsOwnLoopbackAddress) {
  const auto dir = std::filesystem::temp_directory_path() / unique("tandem-podnet-lo-");
  std::filesystem::create_directories(dir);
  auto net = PodNetwork::create({.state_file = (dir / "pod-network").string(),
                                 .mode = PodNetworkOptions::Mode::kLoopback});
  ASSERT_TRUE(net.ok()) << net.status();
  EXPECT_FALSE((*net)->usesNamespaces());
  auto a = (*net)->addPod("a"), b = (*net)->addPod("b");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->ip, "127.0.0.10");
  EXPECT_EQ(b->ip, "127.0.0.11");
  EXPECT_TRUE(a->netns.empty());
  EXPECT_TRUE((*net)->execPrefix(*a).empty());
  EXPECT_TRUE((*net)->teardown().ok());
  std::filesystem::remove_all(dir);
}

TEST(PodNetworkBadInputTest, EachBadOptionIsNamed) {
  auto msg = [](const PodNetworkOptions& o) { return std::string(PodNetwork::create(o).status().message()); };
  const std::string state = "/nonexistent-dir/state";
  EXPECT_NE(msg({.cidr = "10.0.0.0/33", .state_file = state}).find("pod CIDR \"10.0.0.0/33\": a /33 network"),
            std::string::npos);
  EXPECT_NE(msg({.cidr = "10.0.0.0/8", .state_file = state}).find("use a /16 to a /28"), std::string::npos);
  EXPECT_NE(msg({.cidr = "nonsense", .state_file = state}).find("expected A.B.C.D/N"), std::string::npos);
  EXPECT_NE(msg({.cidr = "10.0.300.0/24", .state_file = state}).find("expected A.B.C.D/N"), std::string::npos);
  EXPECT_NE(msg({.cidr = "10.0.0.5/24", .state_file = state}).find("not the network's first address (that is 10.0.0.0)"),
            std::string::npos);
  EXPECT_NE(msg({.bridge = "a-bridge-name-too-long", .state_file = state}).find("must have 1 to 15 characters"),
            std::string::npos);
  EXPECT_NE(msg({}).find("no state file"), std::string::npos);
  auto lo = PodNetwork::create({.state_file = (std::filesystem::temp_directory_path() / unique("podnet-bad")).string(),
                                .mode = PodNetworkOptions::Mode::kLoopback});
  ASSERT_TRUE(lo.ok());
  EXPECT_NE(std::string((*lo)->addPod("bad/name").status().message()).find("pod name \"bad/name\""),
            std::string::npos);
  std::filesystem::remove(std::filesystem::temp_directory_path() / unique("podnet-bad"));
}

}  // namespace
}  // namespace tandem::kubelet
