// Discovery (agent/discovery.h): which endpoints of a Service's
// EndpointSlices count, and following them through tandem-apiserver with
// the real kubectl changing them.

#include "agent/discovery.h"

#include <cstdlib>
#include <mutex>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/e2e/apiserver_fixture.h"

namespace tandem::agent {
namespace {

using nlohmann::json;

std::vector<std::string> names(const std::vector<HostPort>& v) {
  std::vector<std::string> out;
  for (const HostPort& h : v) out.push_back(h.host + ":" + std::to_string(h.port));
  return out;
}

TEST(ReadyEndpointsTest, ReadyAndNotTerminatingWithTheNamedPort) {
  const std::vector<json> slices = {json::parse(R"({
    "ports": [{"name": "http", "port": 8100}, {"name": "kv", "port": 8200}],
    "endpoints": [
      {"addresses": ["10.244.0.3"], "conditions": {"ready": true}},
      {"addresses": ["10.244.0.2"], "conditions": {}},
      {"addresses": ["10.244.0.4"], "conditions": {"ready": false}},
      {"addresses": ["10.244.0.5"], "conditions": {"ready": true, "terminating": true}},
      {"addresses": [], "conditions": {"ready": true}}
    ]})"),
                                    json::parse(R"({
    "ports": [{"name": "kv", "port": 8200}],
    "endpoints": [{"addresses": ["10.244.0.3"], "conditions": {"ready": true}},
                  {"addresses": ["10.244.0.9"], "conditions": {"ready": true}}]})"),
                                    json::parse(R"({"ports": [{"name": "metrics", "port": 9090}],
    "endpoints": [{"addresses": ["10.244.0.7"]}]})")};
  EXPECT_THAT(names(readyEndpoints(slices, "http")), ::testing::ElementsAre("10.244.0.2:8100", "10.244.0.3:8100"))
      << "an unset ready counts as ready; not ready and terminating do not";
  EXPECT_THAT(names(readyEndpoints(slices, "kv")),
              ::testing::ElementsAre("10.244.0.2:8200", "10.244.0.3:8200", "10.244.0.9:8200"))
      << "sorted, one entry per address";
  EXPECT_TRUE(readyEndpoints(slices, "grpc").empty());
  EXPECT_TRUE(readyEndpoints({json::object(), json::parse(R"({"ports": "x", "endpoints": 3})")}, "http").empty())
      << "malformed slices contribute nothing";
}

class DiscoveryTest : public e2e::ApiServerFixture {
 protected:
  void SetUp() override {
    ApiServerFixture::SetUp();
    setenv("KUBECONFIG", kubeconfig_.c_str(), 1);
  }
  void TearDown() override {
    unsetenv("KUBECONFIG");
    ApiServerFixture::TearDown();
  }
  void applySlice(const std::string& name, const std::string& endpoints) {
    const std::string yaml = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: " + name +
                             "\n  labels: {kubernetes.io/service-name: tiny-decode}\naddressType: IPv4\n"
                             "ports: [{name: http, port: 8100}]\nendpoints: " + endpoints + "\n";
    auto r = kubectl("apply -f " + writeTemp(name + ".yaml", yaml));
    ASSERT_EQ(r.rc, 0) << r.output;
  }
  std::vector<std::string> seen() {
    std::lock_guard l(mu_);
    return last_;
  }
  std::mutex mu_;
  std::vector<std::string> last_;
  int reports_ = 0;
};

TEST_F(DiscoveryTest, FollowsTheServicesSlicesAsTheyChange) {
  applySlice("tiny-decode-a", "[{addresses: [127.0.0.3], conditions: {ready: true}}]");
  // Another Service's slice is not followed.
  auto other = kubectl("apply -f " + writeTemp("other.yaml", R"(apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: other, labels: {kubernetes.io/service-name: other}}
addressType: IPv4
ports: [{name: http, port: 8100}]
endpoints: [{addresses: [127.0.0.9]}]
)"));
  ASSERT_EQ(other.rc, 0) << other.output;

  auto discovery = ServiceDiscovery::connect("");
  ASSERT_TRUE(discovery.ok()) << discovery.status();
  EXPECT_EQ((*discovery)->ns(), "default") << "the kubeconfig's namespace";
  ASSERT_TRUE((*discovery)
                  ->follow("tiny-decode", "http",
                           [&](const std::vector<HostPort>& ready) {
                             std::lock_guard l(mu_);
                             last_ = names(ready);
                             ++reports_;
                           })
                  .ok());
  EXPECT_THAT(seen(), ::testing::ElementsAre("127.0.0.3:8100")) << "reported once listed";

  applySlice("tiny-decode-b", "[{addresses: [127.0.0.4], conditions: {ready: true}}]");
  EXPECT_TRUE(e2e::waitFor([&] { return seen() == std::vector<std::string>{"127.0.0.3:8100", "127.0.0.4:8100"}; },
                           std::chrono::seconds(10)));
  // A pod being deleted leaves the set before it stops.
  applySlice("tiny-decode-a", "[{addresses: [127.0.0.3], conditions: {ready: false, terminating: true}}]");
  EXPECT_TRUE(e2e::waitFor([&] { return seen() == std::vector<std::string>{"127.0.0.4:8100"}; },
                           std::chrono::seconds(10)));
  ASSERT_EQ(kubectl("delete endpointslice tiny-decode-b").rc, 0);
  EXPECT_TRUE(e2e::waitFor([&] { return seen().empty(); }, std::chrono::seconds(10)));
  int reports = 0;
  {
    std::lock_guard l(mu_);
    reports = reports_;
  }
  // A change that does not change the ready set is not reported.
  applySlice("tiny-decode-a", "[{addresses: [127.0.0.3], conditions: {ready: false}}]");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  std::lock_guard l(mu_);
  EXPECT_EQ(reports_, reports);
}

TEST(DiscoveryConnectTest, WithoutAnyApiServerItSaysWhy) {
  const char* home = std::getenv("HOME");
  const std::string saved_home = home != nullptr ? home : "";
  setenv("HOME", "/nonexistent-tandem-home", 1);
  unsetenv("KUBECONFIG");
  unsetenv("KUBERNETES_SERVICE_HOST");
  auto d = ServiceDiscovery::connect("");
  if (!saved_home.empty()) setenv("HOME", saved_home.c_str(), 1);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()),
              ::testing::HasSubstr("discovery needs the Kubernetes API (in a pod, or with KUBECONFIG)"));
}

}  // namespace
}  // namespace tandem::agent
