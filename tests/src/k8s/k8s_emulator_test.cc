// The client against the real API-server emulator (build/bin/tandem-apiserver):
// typed errors, server-side apply, conflicts retried, an informer through
// dropped watches and 410s, leader election, events. Each test starts its
// own emulator on port 0 (some with fault injection).

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "e2e/apiserver/api_server.h"
#include "src/common/strings.h"
#include "src/k8s/client.h"
#include "src/k8s/errors.h"
#include "src/k8s/event_recorder.h"
#include "src/k8s/informer.h"
#include "src/k8s/leader_election.h"
#include "src/k8s/retry.h"
#include "tests/src/k8s/emulator_process.h"

namespace tandem::k8s {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

using testing::waitFor;

// The emulator plus a client from the kubeconfig it wrote.
class Emulator {
 public:
  explicit Emulator(std::vector<std::string> flags) : process_(std::move(flags)) {}
  bool available() const { return process_.available(); }

  std::unique_ptr<Client> client() {
    EXPECT_TRUE(process_.waitReady()) << "emulator did not start";
    auto config = loadKubeconfig(process_.kubeconfig());
    EXPECT_TRUE(config.ok()) << config.status();
    if (!config.ok()) return nullptr;
    auto c = Client::create(*config);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

 private:
  testing::EmulatorProcess process_;
};

#define START_EMULATOR(name, ...)                                                                             \
  Emulator name({__VA_ARGS__});                                                                               \
  ASSERT_TRUE(name.available()) << "tandem-apiserver is missing (build it: it is a dependency of this test)"; \
  auto client = name.client();                                                                                \
  ASSERT_NE(client, nullptr)

std::string dataV(const nlohmann::json& o) {
  nlohmann::json data = o.value("data", nlohmann::json::object());
  return data.is_object() ? data.value("v", "") : "";
}

nlohmann::json configMap(const std::string& ns, const std::string& name, nlohmann::json data) {
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", {{"name", name}, {"namespace", ns}, {"labels", {{"app", "t"}}}}},
          {"data", std::move(data)}};
}

absl::Status ensureNamespace(Client& client, const std::string& ns) {
  auto created = client.create(namespacesResource(), "",
                               {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}});
  if (created.ok() || isAlreadyExists(created.status())) return absl::OkStatus();
  return created.status();
}

TEST(EmulatorTest, VerbsAndTypedErrors) {
  START_EMULATOR(emulator);
  ASSERT_TRUE(ensureNamespace(*client, "t1").ok());
  const ResourceRef cms = configMapsResource();
  EXPECT_TRUE(isNotFound(client->get(cms, "t1", "c").status()));
  auto created = client->create(cms, "t1", configMap("t1", "c", {{"k", "v1"}}));
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_FALSE(objectResourceVersion(*created).empty());
  EXPECT_TRUE(isAlreadyExists(client->create(cms, "t1", configMap("t1", "c", {})).status()));

  nlohmann::json stale = *created;
  (*created)["data"]["k"] = "v2";
  auto updated = client->update(cms, "t1", *created);
  ASSERT_TRUE(updated.ok()) << updated.status();
  stale["data"]["k"] = "lost";
  auto conflict = client->update(cms, "t1", stale);
  EXPECT_TRUE(isConflict(conflict.status())) << conflict.status();

  auto patched = client->mergePatch(cms, "t1", "c", {{"data", {{"extra", "x"}}}});
  ASSERT_TRUE(patched.ok()) << patched.status();
  EXPECT_EQ((*patched)["data"]["k"], "v2");
  EXPECT_EQ((*patched)["data"]["extra"], "x");

  auto applied =
      client->apply(cms, "t1", configMap("t1", "ssa", {{"a", "1"}}), {.fieldManager = "tandem-test", .force = true});
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_EQ((*applied)["data"]["a"], "1");

  auto list = client->list(cms, "t1", {.labelSelector = "app=t"});
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->items.size(), 2u);
  EXPECT_FALSE(list->resourceVersion.empty());
  auto byName = client->list(cms, "t1", {.fieldSelector = "metadata.name=ssa"});
  ASSERT_TRUE(byName.ok());
  EXPECT_EQ(byName->items.size(), 1u);

  auto removed = client->remove(cms, "t1", "c", {.propagationPolicy = PropagationPolicy::kBackground});
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_TRUE(isNotFound(client->get(cms, "t1", "c").status()));
  EXPECT_TRUE(isNotFound(client->remove(cms, "t1", "c").status()));

  // A bad object: the server's Status reaches the caller typed, message intact.
  auto bad =
      client->create(cms, "t1", {{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"metadata", nlohmann::json::object()}});
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(k8sReason(bad.status()), K8sErrorReason::kUnknown) << bad.status();
}

// Four writers increment one counter through read-modify-write while the
// server also answers a third of the writes with 409: no increment is lost.
TEST(EmulatorTest, RetryOnConflictLosesNoUpdate) {
  START_EMULATOR(emulator, "--fault-conflict-rate", "0.3");
  ASSERT_TRUE(ensureNamespace(*client, "t2").ok());
  const ResourceRef cms = configMapsResource();
  ASSERT_TRUE(client->create(cms, "t2", configMap("t2", "counter", {{"n", "0"}})).ok());
  constexpr int kWriters = 4;
  constexpr int kIncrements = 10;
  std::atomic<int> conflicts{0};
  std::vector<std::thread> writers;
  std::atomic<int> failures{0};
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&] {
      for (int i = 0; i < kIncrements; ++i) {
        absl::Status s = retryOnConflict(
            [&]() -> absl::Status {
              auto cm = client->get(cms, "t2", "counter");
              if (!cm.ok()) return cm.status();
              int n = std::stoi((*cm)["data"]["n"].get<std::string>());
              (*cm)["data"]["n"] = std::to_string(n + 1);
              absl::Status u = client->update(cms, "t2", *cm).status();
              if (isConflict(u)) ++conflicts;
              return u;
            },
            {.steps = 100, .delay = milliseconds(1)});
        if (!s.ok()) ++failures;
      }
    });
  }
  for (auto& t : writers) t.join();
  EXPECT_EQ(failures.load(), 0);
  auto cm = client->get(cms, "t2", "counter");
  ASSERT_TRUE(cm.ok());
  EXPECT_EQ((*cm)["data"]["n"], std::to_string(kWriters * kIncrements));
  EXPECT_GT(conflicts.load(), 0);
}

// The informer's view, rebuilt from handler calls only: an add for a key it
// has, or an update/delete for one it lacks, is a duplicated or missed event.
struct HandlerView {
  std::mutex mu;
  std::map<std::string, std::string> data;  // key → data.v
  int anomalies = 0;

  InformerHandlers handlers() {
    return {.onAdd =
                [this](const nlohmann::json& o) {
                  std::lock_guard<std::mutex> lock(mu);
                  if (data.count(objectKey(o))) ++anomalies;
                  data[objectKey(o)] = dataV(o);
                },
            .onUpdate =
                [this](const nlohmann::json& old, const nlohmann::json& o) {
                  std::lock_guard<std::mutex> lock(mu);
                  if (!data.count(objectKey(o))) ++anomalies;
                  data[objectKey(o)] = dataV(o);
                },
            .onDelete =
                [this](const nlohmann::json& o) {
                  std::lock_guard<std::mutex> lock(mu);
                  if (!data.erase(objectKey(o))) ++anomalies;
                }};
  }
};

TEST(EmulatorTest, InformerSurvivesWatchDropsAnd410s) {
  // The emulator runs in this process on a FakeClock: every watch is cut
  // once it is 200 ms old, and this test decides when that is by advancing
  // the clock. Only 8 events of history, so a re-watch after other
  // namespaces' writes hits 410 and must relist. The informer's own
  // backoff runs on real time (short delays; what is under test is its
  // protocol against a server that drops watches).
  FakeClock clock;
  auto server = apiserver::ApiServer::start(
      {.port = 0, .watchHistory = 8, .bookmarkInterval = seconds(60), .faults = {.watchDropAfter = milliseconds(200)}},
      clock);
  ASSERT_TRUE(server.ok()) << server.status();
  auto created = Client::create({.server = (*server)->baseUrl()});
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<Client> client = std::move(*created);
  ASSERT_TRUE(ensureNamespace(*client, "inf").ok());
  ASSERT_TRUE(ensureNamespace(*client, "noise").ok());
  const ResourceRef cms = configMapsResource();
  HandlerView view;
  Informer informer(*client, SystemClock::instance(),
                    {.resource = cms,
                     .ns = "inf",
                     .watchTimeoutSeconds = 30,
                     .minRetryDelay = milliseconds(10),
                     .maxRetryDelay = milliseconds(200)},
                    view.handlers());
  informer.start();
  ASSERT_TRUE(informer.waitForSync(seconds(10)));

  std::map<std::string, std::string> expected;  // key → data.v
  std::mt19937 rng(7);
  int noise = 0;
  auto writeNoise = [&](int n) {
    for (int i = 0; i < n; ++i) {
      std::string name = "n" + std::to_string(noise++);
      ASSERT_TRUE(client->create(cms, "noise", configMap("noise", name, {})).ok());
    }
  };
  for (int step = 0; step < 150; ++step) {
    std::string name = "c" + std::to_string(rng() % 12);
    std::string key = "inf/" + name;
    std::string value = std::to_string(step);
    if (!expected.count(key)) {
      ASSERT_TRUE(client->create(cms, "inf", configMap("inf", name, {{"v", value}})).ok());
      expected[key] = value;
    } else if (rng() % 3 == 0) {
      ASSERT_TRUE(client->remove(cms, "inf", name).ok());
      expected.erase(key);
    } else {
      ASSERT_TRUE(client->mergePatch(cms, "inf", name, {{"data", {{"v", value}}}}).ok());
      expected[key] = value;
    }
    if (step % 25 == 0) writeNoise(10);                    // pushes the informer's resourceVersion out of history
    if (step % 10 == 0) clock.advance(milliseconds(200));  // cuts every watch open now
  }
  // Make sure at least one 410 happened: quiet "inf", flood history, cut
  // the watch (again, should the informer be between watches) until it re-watches.
  writeNoise(20);
  EXPECT_TRUE(waitFor([&] {
    clock.advance(milliseconds(200));
    return informer.stats().numExpired > 0;
  })) << "no 410 observed; lists="
      << informer.stats().numLists;
  // Changes after the relist still arrive.
  ASSERT_TRUE(client->create(cms, "inf", configMap("inf", "last", {{"v", "end"}})).ok());
  expected["inf/last"] = "end";

  auto cacheMatches = [&] {
    std::map<std::string, std::string> cached;
    for (const auto& o : informer.cache().list()) cached[objectKey(o)] = dataV(o);
    return cached == expected;
  };
  EXPECT_TRUE(waitFor(cacheMatches));
  informer.stop();
  std::lock_guard<std::mutex> lock(view.mu);
  EXPECT_EQ(view.data, expected);
  EXPECT_EQ(view.anomalies, 0);
  InformerStats stats = informer.stats();
  EXPECT_GT(stats.numWatches, 2);
  EXPECT_GE(stats.numLists, 2);
  EXPECT_EQ(informer.cache().listByLabel("app", "t").size(), expected.size());
}

// Two candidates against the real emulator, on a FakeClock driven by this
// thread: random tick order, random gaps, a candidate that stalls for a
// while. Checked after every tick.
TEST(EmulatorTest, LeaderElectionTwoCandidates) {
  START_EMULATOR(emulator);
  ASSERT_TRUE(ensureNamespace(*client, "le").ok());
  FakeClock clock;
  auto make = [&](const std::string& id) {
    auto e =
        LeaderElector::create(*client, {.leaseNamespace = "le", .leaseName = "op", .identity = id, .clock = &clock});
    EXPECT_TRUE(e.ok());
    return std::move(*e);
  };
  auto a = make("a");
  auto b = make("b");
  LeaderElector* cands[2] = {a.get(), b.get()};

  // Exactly one leader once both tried.
  ASSERT_TRUE(a->tick().ok());
  ASSERT_TRUE(b->tick().ok());
  EXPECT_NE(a->isLeader(), b->isLeader());

  std::mt19937 rng(11);
  MonoTime stalledUntil[2] = {clock.now(), clock.now()};
  int transitions = 0;
  std::string lastLeader = a->isLeader() ? "a" : "b";
  for (int step = 0; step < 300; ++step) {
    clock.advance(milliseconds(200 + rng() % 1800));
    int i = static_cast<int>(rng() % 2);
    if (rng() % 40 == 0) stalledUntil[i] = clock.now() + seconds(5 + rng() % 20);
    if (clock.now() >= stalledUntil[i]) {
      ASSERT_TRUE(cands[i]->tick().ok());
    }
    ASSERT_FALSE(a->isLeader() && b->isLeader()) << "two leaders at step " << step;
    for (LeaderElector* c : cands) {
      if (c->isLeader() && c->identity() != lastLeader) {
        ++transitions;
        lastLeader = c->identity();
      }
    }
  }
  EXPECT_GE(transitions, 1);

  // Takeover: the leader stops renewing; the other takes over within the
  // lease duration (plus one retry period of polling) of the last renewal.
  LeaderElector* leader = a->isLeader() ? a.get() : b.get();
  LeaderElector* other = leader == a.get() ? b.get() : a.get();
  if (!leader->isLeader()) {
    for (int i = 0; i < 20 && !a->isLeader() && !b->isLeader(); ++i) {
      clock.advance(seconds(2));
      ASSERT_TRUE(a->tick().ok());
    }
    leader = a->isLeader() ? a.get() : b.get();
    other = leader == a.get() ? b.get() : a.get();
  }
  ASSERT_TRUE(leader->isLeader());
  clock.advance(seconds(1));
  ASSERT_TRUE(leader->tick().ok());
  MonoTime lastRenew = clock.now();
  MonoTime tookOver{};
  for (int i = 0; i < 40 && tookOver == MonoTime{}; ++i) {
    clock.advance(milliseconds(500));
    ASSERT_TRUE(other->tick().ok());
    ASSERT_FALSE(leader->isLeader() && other->isLeader());
    if (other->isLeader()) tookOver = clock.now();
  }
  ASSERT_NE(tookOver, MonoTime{});
  EXPECT_LE(tookOver - lastRenew, seconds(15) + seconds(2));
  EXPECT_GE(tookOver - lastRenew, seconds(15));

  // Release hands over at once.
  ASSERT_TRUE(other->release().ok());
  ASSERT_TRUE(leader->tick().ok());
  EXPECT_TRUE(leader->isLeader());
  auto lease = client->get(leasesResource(), "le", "op");
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ((*lease)["spec"]["holderIdentity"], leader->identity());
  EXPECT_GE((*lease)["spec"]["leaseTransitions"].get<int>(), 2);
}

TEST(EmulatorTest, EventRecorderAggregatesIntoSeries) {
  START_EMULATOR(emulator);
  ASSERT_TRUE(ensureNamespace(*client, "ev").ok());
  auto cm = client->create(configMapsResource(), "ev", configMap("ev", "target", {}));
  ASSERT_TRUE(cm.ok());
  FakeClock clock;
  EventRecorder recorder(
      *client, {.reportingController = "serving.tandem.dev/operator", .reportingInstance = "op-0", .clock = &clock});
  ObjectReference ref = ObjectReference::of(*cm);
  ASSERT_TRUE(recorder.record(ref, EventType::kWarning, "ScaleFailed", "Scale", "no capacity").ok());
  clock.advance(seconds(1));
  ASSERT_TRUE(recorder.record(ref, EventType::kWarning, "ScaleFailed", "Scale", "no capacity").ok());
  ASSERT_TRUE(recorder.record(ref, EventType::kNormal, "Scaled", "Scale", "ok").ok());
  auto events = client->list(eventsResource(), "ev");
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->items.size(), 2u);
  int withSeries = 0;
  for (const auto& e : events->items) {
    EXPECT_EQ(e["reportingController"], "serving.tandem.dev/operator");
    EXPECT_EQ(e["regarding"]["name"], "target");
    if (e.contains("series")) {
      ++withSeries;
      EXPECT_EQ(e["series"]["count"], 2);
      EXPECT_EQ(e["type"], "Warning");
    }
  }
  EXPECT_EQ(withSeries, 1);
}

}  // namespace
}  // namespace tandem::k8s
