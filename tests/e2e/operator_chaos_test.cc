// tandem-operator under trouble on the local cluster (label operator; root):
// killed and restarted, a standby taking over, and the API server answering
// conflicts, errors and slow replies and dropping watches. These exercise
// leases and retries over tens of seconds; ./tandem check asan leaves them
// out (docs/development.md), operator_test.cc covers the same code there.

#include <signal.h>
#include <sys/wait.h>

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/e2e/operator_fixture.h"

namespace tandem::e2e {
namespace {

using ::testing::HasSubstr;

// The operator killed and restarted: no duplicate children, and a change
// made while it was away lands once it is back. Two replicas: one leads;
// when it dies the other takes over and reconciles.
TEST_F(OperatorTest, RestartAndTakeoverConvergeWithoutDuplicates) {
  apply("pool.yaml", pool("tiny", "  decode: {replicas: 1}\n"));
  ASSERT_TRUE(eventually([&] { return condition("tiny", "Ready", "status") == "True"; }, 120)) << operatorLog();
  const std::string uid = get("deploy tiny-decode", "{.metadata.uid}");

  kill(operator_, SIGKILL);
  waitpid(operator_, nullptr, 0);
  ASSERT_EQ(kubectl("patch tpool tiny --type merge -p '{\"spec\":{\"prefill\":{\"replicas\":2}}}'").rc, 0);
  // The first replica died holding the Lease: a successor waits it out (15 s).
  operator_ = spawnLogged({std::string(std::getenv("TANDEM_BIN_DIR")) + "/tandem-operator", "--kubeconfig", kubeconfig_,
                           "--listen", "127.0.0.1:" + std::to_string(metrics_port_), "--identity", "second"},
                          dir_ + "/operator.log");
  ASSERT_GT(operator_, 0);
  ASSERT_TRUE(eventually([&] { return get("tpool tiny", "{.status.prefill.summary}") == "2/2"; }, 90)) << operatorLog();
  EXPECT_EQ(get("deploy -l app.kubernetes.io/instance=tiny", "{.items[*].metadata.name}"),
            "tiny-decode tiny-prefill tiny-router")
      << "one Deployment per role, as before";
  EXPECT_EQ(get("deploy tiny-decode", "{.metadata.uid}"), uid) << "the child was kept, not made again";

  // A standby: it does not reconcile while the leader lives.
  const int standby_port = metrics_port_ + 1;
  pid_t standby = spawnLogged({std::string(std::getenv("TANDEM_BIN_DIR")) + "/tandem-operator", "--kubeconfig",
                               kubeconfig_, "--listen", "127.0.0.1:" + std::to_string(standby_port), "--identity",
                               "standby"},
                              dir_ + "/standby.log");
  ASSERT_GT(standby, 0);
  auto leader = [&](int port) {
    const std::string m = shell("curl -s -m 5 http://127.0.0.1:" + std::to_string(port) + "/metrics").output;
    return m.find("\ntandem_operator_leader 1\n") != std::string::npos;
  };
  ASSERT_TRUE(eventually([&] { return shell("curl -s -m 5 http://127.0.0.1:" + std::to_string(standby_port) + "/metrics")
                                          .output.find("\ntandem_operator_leader 0\n") != std::string::npos; }));
  EXPECT_TRUE(leader(metrics_port_)) << operatorLog();
  EXPECT_FALSE(leader(standby_port)) << readFile(dir_ + "/standby.log") << operatorLog();
  EXPECT_EQ(get("lease tandem-operator", "{.spec.holderIdentity}"), "second");

  // The leader stops (SIGTERM releases the Lease): the standby takes over at once and reconciles.
  kill(operator_, SIGTERM);
  waitpid(operator_, nullptr, 0);
  operator_ = standby;
  metrics_port_ = standby_port;
  ASSERT_TRUE(eventually([&] { return leader(standby_port); }, 30)) << readFile(dir_ + "/standby.log");
  ASSERT_EQ(kubectl("patch tpool tiny --type merge -p '{\"spec\":{\"prefill\":{\"replicas\":1}}}'").rc, 0);
  EXPECT_TRUE(eventually([&] { return get("deploy tiny-prefill", "{.spec.replicas}") == "1"; }, 30))
      << readFile(dir_ + "/standby.log");
}

// With the API server answering conflicts, errors and slow replies and
// dropping watches, a pool still becomes Ready and follows an edit.
TEST_F(OperatorTest, APoolConvergesWhileTheApiServerMisbehaves) {
  auto faults = shell("curl -s -k -m 5 -X PUT https://127.0.0.1:" + std::to_string(port_api()) +
                      "/tandem/faults -H 'Authorization: Bearer tandem-local-admin' -d "
                      "'{\"conflictRate\":0.2,\"errorRate\":0.1,\"slowRate\":0.1,\"slowDelayMs\":200,\"watchDropAfterMs\":3000}'");
  ASSERT_EQ(faults.rc, 0) << faults.output;
  // kubectl's own requests meet the faults too: applied until one gets through.
  const std::string manifest = writeTemp("pool.yaml", pool("tiny", "  decode: {replicas: 1}\n"));
  ASSERT_TRUE(eventually([&] { return kubectl("apply -f " + manifest).rc == 0; }));
  ASSERT_TRUE(eventually([&] { return condition("tiny", "Ready", "status") == "True"; }, 180))
      << kubectl("get tpool tiny -o yaml").output << operatorLog();
  ASSERT_TRUE(eventually([&] {
    return kubectl("patch tpool tiny --type merge -p '{\"spec\":{\"decode\":{\"replicas\":2}}}'").rc == 0;
  }));
  EXPECT_TRUE(eventually([&] { return get("tpool tiny", "{.status.decode.summary}") == "2/2"; }, 180))
      << kubectl("get tpool tiny -o yaml").output;
  EXPECT_THAT(shell("curl -s -m 5 http://127.0.0.1:" + std::to_string(metrics_port_) + "/metrics").output,
              ::testing::ContainsRegex("tandem_operator_reconcile_total\\{result=\"error\"\\} [1-9]"))
      << "the faults reached the operator";
  // Calm again, so the pool's deletion is not what the faults test.
  shell("curl -s -k -m 5 -X PUT https://127.0.0.1:" + std::to_string(port_api()) +
        "/tandem/faults -d '{\"conflictRate\":0,\"errorRate\":0,\"slowRate\":0,\"slowDelayMs\":0,\"watchDropAfterMs\":0}'");
}

}  // namespace
}  // namespace tandem::e2e
