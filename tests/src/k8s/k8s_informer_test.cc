// The informer's timing on a FakeClock, against the in-memory FakeApi: the
// retry backoff after failed lists doubles up to its cap, and resync comes
// every resyncPeriod. Every time is read from the clock, so the checks are
// exact and nothing sleeps.

#include <map>
#include <mutex>
#include <vector>

#include <gtest/gtest.h>

#include "src/k8s/client.h"
#include "src/k8s/informer.h"
#include "tests/src/k8s/fake_api.h"
#include "tests/testing/quiet_logs.h"
#include "tests/testing/wait.h"

namespace tandem::k8s {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testutil::waitFor;

const std::string kListPath = "/api/v1/namespaces/inf/configmaps";

bool isList(const HttpRequest& r) { return testing::FakeApi::stripQuery(r.path) == kListPath && r.method == "GET"; }

nlohmann::json configMap(const std::string& name) {
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", {{"name", name}, {"namespace", "inf"}, {"resourceVersion", "5"}}}};
}

class InformerClockTest : public ::testing::Test {
 protected:
  InformerClockTest() : client_(Client::createWithTransport(std::make_unique<testing::FakeTransport>(api_))) {}

  // The fake times at which the informer listed (under api_.mu).
  std::vector<MonoTime> listTimes() {
    std::lock_guard<std::mutex> lock(api_.mu);
    return listTimes_;
  }

  FakeClock clock_;
  testing::FakeApi api_;
  std::vector<MonoTime> listTimes_;  // guarded by api_.mu
  std::unique_ptr<Client> client_;
};

TEST_F(InformerClockTest, FailedListsBackOffDoublingUpToTheCap) {
  api_.beforeRequest = [&](const HttpRequest& r) {
    if (!isList(r)) return 0;
    listTimes_.push_back(clock_.now());
    return 500;
  };
  Informer informer(*client_, clock_,
                    {.resource = configMapsResource(),
                     .ns = "inf",
                     .minRetryDelay = milliseconds(100),
                     .maxRetryDelay = milliseconds(400)},
                    {});
  informer.start();
  const std::vector<Duration> delays = {milliseconds(100), milliseconds(200), milliseconds(400), milliseconds(400)};
  for (size_t k = 0; k < delays.size(); ++k) {
    // Attempt k failed and the informer is parked in its backoff: move the
    // clock to exactly when the next attempt is due.
    ASSERT_TRUE(waitFor([&] { return listTimes().size() == k + 1 && clock_.numWaiters() == 1; })) << "attempt " << k;
    clock_.advance(delays[k]);
  }
  ASSERT_TRUE(waitFor([&] { return listTimes().size() == delays.size() + 1; }));
  informer.stop();
  std::vector<MonoTime> times = listTimes();
  for (size_t k = 0; k < delays.size(); ++k) {
    EXPECT_EQ(times[k + 1] - times[k], delays[k]) << "retry " << k;
  }
  EXPECT_FALSE(informer.hasSynced());
  EXPECT_EQ(informer.stats().numLists, 0);
}

TEST_F(InformerClockTest, ResyncEveryPeriodOnTheClock) {
  api_.objects[kListPath] = {{"kind", "ConfigMapList"},
                             {"apiVersion", "v1"},
                             {"metadata", {{"resourceVersion", "5"}}},
                             {"items", {configMap("a"), configMap("b")}}};
  std::mutex mu;
  std::map<std::string, std::vector<MonoTime>> resyncs;  // name -> fake times of onUpdate(obj, obj)
  Informer informer(*client_, clock_, {.resource = configMapsResource(), .ns = "inf", .resyncPeriod = seconds(30)},
                    {.onUpdate = [&](const nlohmann::json& old, const nlohmann::json& obj) {
                      std::lock_guard<std::mutex> lock(mu);
                      if (old == obj) resyncs[obj["metadata"]["name"]].push_back(clock_.now());
                    }});
  const MonoTime start = clock_.now();
  informer.start();
  ASSERT_TRUE(informer.waitForSync(seconds(30)));
  auto numResyncs = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return resyncs["a"].size() + resyncs["b"].size();
  };
  for (int period = 1; period <= 2; ++period) {
    // Both threads parked: the resync thread on its period, the watch loop
    // in its backoff (the scripted watch ends at once, empty).
    ASSERT_TRUE(waitFor([&] { return clock_.numWaiters() == 2; }));
    EXPECT_EQ(numResyncs(), static_cast<size_t>(2 * (period - 1)));
    clock_.advance(seconds(30));
    ASSERT_TRUE(waitFor([&] { return numResyncs() == static_cast<size_t>(2 * period); }));
  }
  informer.stop();
  std::lock_guard<std::mutex> lock(mu);
  for (const char* name : {"a", "b"}) {
    ASSERT_EQ(resyncs[name].size(), 2u) << name;
    EXPECT_EQ(resyncs[name][0], start + seconds(30)) << name;
    EXPECT_EQ(resyncs[name][1], start + seconds(60)) << name;
  }
}

}  // namespace
}  // namespace tandem::k8s
