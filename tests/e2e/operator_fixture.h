#pragma once
// tandem-operator on a local cluster for one test (KubeletApiAccessTest: the
// emulator over TLS and a kubelet), with the InferencePool CRD applied, the
// operator started (its log in the test's directory, /metrics on
// metrics_port_) and the tiny model made at <dir>/model.

#include <sys/wait.h>

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/e2e/kubelet_fixture.h"

namespace tandem::e2e {

class OperatorTest : public KubeletApiAccessTest {
 protected:
  void SetUp() override {
    KubeletApiAccessTest::SetUp();
    auto crd = kubectl(std::string("apply -f ") + TANDEM_SOURCE_DIR + "/crds/inferencepool.yaml");
    ASSERT_EQ(crd.rc, 0) << crd.output;
    ASSERT_TRUE(eventually([&] { return kubectl("get tpool").rc == 0; })) << "the CRD is not served";
    metrics_port_ = 20000 + getpid() % 20000;
    const std::string exe = std::string(std::getenv("TANDEM_BIN_DIR")) + "/tandem-operator";
    std::vector<std::string> args = {exe, "--kubeconfig", kubeconfig_, "--listen", "127.0.0.1:" + std::to_string(metrics_port_)};
    for (const std::string& a : operatorArgs()) args.push_back(a);
    operator_ = spawnLogged(args, dir_ + "/operator.log");
    ASSERT_GT(operator_, 0) << "cannot start " << exe;
    ASSERT_EQ(shell(std::string(std::getenv("TANDEM_BIN_DIR")) + "/tandem-make-model --out " + dir_ + "/model").rc, 0);
  }
  void TearDown() override {
    if (operator_ > 0) {
      kill(operator_, SIGTERM);
      int status = 0;
      if (!waitFor([&] { return waitpid(operator_, &status, WNOHANG) == operator_; }, std::chrono::seconds(20))) {
        ADD_FAILURE() << "tandem-operator did not exit on SIGTERM";
        kill(operator_, SIGKILL);
        waitpid(operator_, &status, 0);
      }
    }
    KubeletApiAccessTest::TearDown();
  }
  std::string operatorLog() { return readFile(dir_ + "/operator.log"); }
  // More flags for tandem-operator (before SetUp starts it).
  virtual std::vector<std::string> operatorArgs() { return {}; }
  int port_api() const { return ApiServerFixture::port_; }
  std::string pool(const std::string& name, const std::string& extra_spec) {
    return "apiVersion: serving.tandem.dev/v1alpha1\nkind: InferencePool\nmetadata: {name: " + name +
           "}\nspec:\n  model: {name: tiny, path: " + dir_ + "/model}\n  image: tandem\n" + extra_spec;
  }
  std::string condition(const std::string& pool, const std::string& type, const std::string& field) {
    return get("tpool " + pool, "{.status.conditions[?(@.type==\"" + type + "\")]." + field + "}");
  }

  pid_t operator_ = -1;
  int metrics_port_ = 0;  // the operator's /metrics
};

}  // namespace tandem::e2e
