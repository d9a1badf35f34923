// The router's view of its decode workers' liveness (docs/routing.md
// "Liveness"), real processes on loopback: a D stopped with SIGSTOP (a
// stalled process: its connections stay open, nothing answers) is noticed
// by its silent state stream within --worker-stale-after; a request it had
// not started is called off and served by the other D, new requests and
// its sessions go to the other D, and with every D stopped a request gets
// a typed 503 within --unserved-timeout instead of waiting. After SIGCONT
// it gets work again. With a single decode worker a short stall is waited
// out rather than turned into errors. Bounds are loose so a loaded machine cannot flake
// them; the detection itself is worker_stream_client_test's (fake clock).

#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <future>
#include <set>

#include <nlohmann/json.hpp>

#include "src/http/client.h"
#include "tests/agent/agent_process.h"
#include "tests/agent/router/router_test_util.h"

namespace tandem::agent::testing {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// Far below a request timeout, far above the ~2 s detection.
constexpr auto kBound = std::chrono::seconds(15);

struct Reply {
  int status = -1;
  json body;
  Clock::duration took{};
};

Reply post(const AgentProcess& router, const std::string& prompt, const std::string& session) {
  http::ClientRequest r{.method = "POST", .url = router.url("/v1/completions")};
  r.body = json{{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}}.dump();
  r.headers["Content-Type"] = "application/json";
  r.headers["x-session-id"] = session;
  r.timeout = std::chrono::seconds(90);
  const auto start = Clock::now();
  auto resp = http::httpSend(r);
  Reply out;
  out.took = Clock::now() - start;
  if (!resp.ok()) {
    ADD_FAILURE() << resp.status();
    return out;
  }
  out.status = resp->status;
  out.body = json::parse(resp->body, nullptr, false);
  return out;
}

class RouterLivenessTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (auto* w : {&d0_, &d1_}) {
      if (*w && (*w)->pid() > 0) kill((*w)->pid(), SIGCONT);
    }
  }
  std::unique_ptr<AgentProcess> d0_, d1_;
};

TEST_F(RouterLivenessTest, AStoppedDecodeWorkersRequestsMoveAndWithNoneLeftTheAnswerIsATyped503) {
  d0_ = AgentProcess::start({"--worker", "d0", "--num-blocks", "256"});
  d1_ = AgentProcess::start({"--worker", "d1", "--num-blocks", "256"});
  ASSERT_TRUE(d0_ && d1_);
  auto router = AgentProcess::start({"--role", "router", "--worker", "router", "--decode-workers",
                                     hostPort(*d0_) + "," + hostPort(*d1_), "--worker-stale-after", "3s",
                                     "--unserved-timeout", "4s"});
  ASSERT_TRUE(router);
  const std::vector<std::string> sessions = {"l-a", "l-b", "l-c", "l-d"};
  for (const auto& s : sessions) ASSERT_EQ(post(*router, "first turn of " + s, s).status, 200);
  const std::set<std::string> on0 = sessionsServedBy(*d0_);
  ASSERT_FALSE(on0.empty()) << "the load floor puts sessions on both workers";
  const std::string moved = *on0.begin();

  // Stopped: the next turn of its session goes to d0 (not yet noticed),
  // is called off once its stream is silent, and d1 serves it.
  ASSERT_EQ(kill(d0_->pid(), SIGSTOP), 0);
  Reply r = post(*router, "first turn of " + moved + " and a second", moved);
  EXPECT_EQ(r.status, 200) << r.body.dump();
  // Moved once the 3 s of silence are over, not left waiting on d0 (the
  // bound is loose so a loaded machine cannot flake it; the detection times
  // themselves are router_core_test's, on a fake clock).
  EXPECT_GE(r.took, std::chrono::seconds(2));
  EXPECT_LT(r.took, kBound);
  EXPECT_TRUE(sessionsServedBy(*d1_).contains(moved));
  std::string m = scrape(*router);
  EXPECT_EQ(metricValue(m, "tandem_router_unresponsive_workers{"), 1) << m;
  // Routed at once, long before d0's silence could be noticed: called off.
  EXPECT_EQ(metricValue(m, "tandem_router_called_off_total{"), 1) << m;
  EXPECT_EQ(metricValueWith(m, "tandem_router_retries_total", "reason=\"unresponsive\""), 1);
  // New sessions and d0's other sessions go straight to d1: none is sent to
  // d0 and called off again.
  for (const auto& s : {std::string("l-new"), *on0.rbegin()}) {
    Reply n = post(*router, "another turn of " + s, s);
    EXPECT_EQ(n.status, 200) << n.body.dump();
    EXPECT_LT(n.took, kBound);
  }
  m = scrape(*router);
  EXPECT_EQ(metricValue(m, "tandem_router_called_off_total{"), 1) << m;
  EXPECT_EQ(metricValueWith(m, "tandem_router_retries_total", "reason=\"unresponsive\""), 1) << m;

  // Both stopped: a typed 503 once the unserved timeout (4 s) has passed.
  ASSERT_EQ(kill(d1_->pid(), SIGSTOP), 0);
  EXPECT_TRUE(waitFor([&] { return metricValue(scrape(*router), "tandem_router_unresponsive_workers{") == 2; }));
  Reply none = post(*router, "nobody answers this", "l-none");
  EXPECT_EQ(none.status, 503) << none.body.dump();
  EXPECT_EQ(none.body["error"]["code"], "decode_workers_unresponsive") << none.body.dump();
  EXPECT_GE(none.took, std::chrono::seconds(3));
  EXPECT_LT(none.took, kBound);
  EXPECT_EQ(metricValue(scrape(*router), "tandem_router_unserved_total{"), 1);

  // Back: both answer again, and d0 (now the less loaded) gets new sessions.
  ASSERT_EQ(kill(d0_->pid(), SIGCONT), 0);
  ASSERT_EQ(kill(d1_->pid(), SIGCONT), 0);
  EXPECT_TRUE(waitFor([&] { return metricValue(scrape(*router), "tandem_router_unresponsive_workers{") == 0; }));
  bool d0_serves = false;
  for (int i = 0; i < 8 && !d0_serves; ++i) {
    const std::string s = "back-" + std::to_string(i);
    Reply back = post(*router, s + " is a session started after SIGCONT", s);
    EXPECT_EQ(back.status, 200) << back.body.dump();
    d0_serves = sessionsServedBy(*d0_).contains(s);
  }
  EXPECT_TRUE(d0_serves);
  for (auto* w : {&d0_, &d1_}) EXPECT_EQ((*w)->stop(SIGTERM), 0) << (*w)->log();
  EXPECT_EQ(router->stop(SIGTERM), 0) << router->log();
}

// With one decode worker a short stall is waited out: its state stream goes
// silent and it is unresponsive for a while, but with nowhere to move the
// request in flight there is no point calling it off before
// --unserved-timeout: D answers it once resumed.
TEST_F(RouterLivenessTest, WithOneDecodeWorkerAShortStallIsWaitedOut) {
  d0_ = AgentProcess::start({"--worker", "d0", "--num-blocks", "256"});
  ASSERT_TRUE(d0_);
  auto router = AgentProcess::start({"--role", "router", "--worker", "router", "--decode-workers", hostPort(*d0_),
                                     "--worker-stale-after", "500ms", "--unserved-timeout", "30s"});
  ASSERT_TRUE(router);
  ASSERT_EQ(post(*router, "a first request opens the connection", "one").status, 200);
  ASSERT_EQ(kill(d0_->pid(), SIGSTOP), 0);
  auto reply = std::async(std::launch::async, [&] { return post(*router, "sent while d0 is stopped", "one"); });
  EXPECT_TRUE(waitFor([&] { return metricValue(scrape(*router), "tandem_router_unresponsive_workers{") == 1; }));
  ASSERT_EQ(kill(d0_->pid(), SIGCONT), 0);
  Reply r = reply.get();
  EXPECT_EQ(r.status, 200) << r.body.dump();
  const std::string m = scrape(*router);
  EXPECT_EQ(metricValue(m, "tandem_router_called_off_total{"), 0) << m;
  EXPECT_EQ(metricValue(m, "tandem_router_unserved_total{"), 0);
  EXPECT_EQ(d0_->stop(SIGTERM), 0) << d0_->log();
  EXPECT_EQ(router->stop(SIGTERM), 0) << router->log();
}

}  // namespace
}  // namespace tandem::agent::testing
