// The router role in front of real agents on loopback (DESIGN.md §2,
// docs/routing.md): every request goes client -> router -> decode agent as
// real processes and real HTTP. What the issue asks of it through real
// processes: a session's turns stick to one D; a killed D's sessions move
// and finish; two router replicas send a session to the same D; a worker
// whose event stream is cut keeps serving and is re-synced from one
// snapshot; a client that hangs up mid-stream at the router frees D's
// blocks. (A request naming an unknown P is in pd_router_process_test.)

#include <gtest/gtest.h>

#include <signal.h>

#include <future>
#include <map>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "src/http/client.h"
#include "tests/agent/agent_process.h"
#include "tests/agent/router/router_test_util.h"
#include "tests/testing/quiet_logs.h"
#include "tests/testing/tcp_proxy.h"

namespace tandem::agent::testing {
namespace {

using nlohmann::json;

// A decode agent (role both: it computes everything itself) with a name.
std::unique_ptr<AgentProcess> startWorker(const std::string& name, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--worker", name, "--num-blocks", "256"};
  args.insert(args.end(), extra.begin(), extra.end());
  return AgentProcess::start(args);
}

std::unique_ptr<AgentProcess> startRouter(const std::vector<std::string>& decode_workers,
                                          std::vector<std::string> extra = {}) {
  std::string list;
  for (const auto& w : decode_workers) list += (list.empty() ? "" : ",") + w;
  std::vector<std::string> args = {"--role", "router", "--worker", "router", "--decode-workers", list};
  args.insert(args.end(), extra.begin(), extra.end());
  return AgentProcess::start(args);
}

json completion(const std::string& prompt, int max_tokens = 4) {
  return {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
}

http::ClientResponse post(const AgentProcess& router, const json& body, const std::string& session = "") {
  http::ClientRequest r{.method = "POST", .url = router.url("/v1/completions"), .body = body.dump()};
  r.headers["Content-Type"] = "application/json";
  if (!session.empty()) r.headers["x-session-id"] = session;
  auto resp = http::httpSend(r);
  EXPECT_TRUE(resp.ok()) << resp.status();
  return resp.ok() ? *resp : http::ClientResponse{};
}

// A growing conversation: each turn repeats the previous prompt and appends.
std::string turnPrompt(const std::string& session, int turn) {
  std::string p = "session " + session + " system prompt that every turn repeats.";
  for (int t = 0; t <= turn; ++t) p += " turn " + std::to_string(t) + " says something new.";
  return p;
}

class RouterProcessTest : public ::testing::Test {};

TEST_F(RouterProcessTest, ASessionsTurnsStickToOneDecodeWorker) {
  auto d0 = startWorker("d0");
  auto d1 = startWorker("d1");
  ASSERT_TRUE(d0 && d1);
  auto router = startRouter({hostPort(*d0), hostPort(*d1)});
  ASSERT_TRUE(router);
  const std::vector<std::string> sessions = {"s-a", "s-b", "s-c", "s-d", "s-e", "s-f"};
  for (int turn = 0; turn < 3; ++turn) {
    for (const auto& s : sessions) {
      http::ClientResponse r = post(*router, completion(turnPrompt(s, turn)), s);
      ASSERT_EQ(r.status, 200) << r.body;
      EXPECT_EQ(json::parse(r.body)["choices"][0]["text"].get<std::string>().empty(), false);
    }
  }
  const std::set<std::string> on0 = sessionsServedBy(*d0), on1 = sessionsServedBy(*d1);
  for (const auto& s : sessions) EXPECT_NE(on0.contains(s), on1.contains(s)) << s << " served by both or neither";
  // And both workers got sessions: the load floor keeps neither cold.
  EXPECT_FALSE(on0.empty());
  EXPECT_FALSE(on1.empty());
  const std::string m = scrape(*router);
  EXPECT_GE(metricValueWith(m, "tandem_router_sticky_hits_total", "pool="), 1);
  EXPECT_GE(metricValueWith(m, "tandem_router_decisions_total", "path=\"direct\""), 1);
  EXPECT_TRUE(promtoolComplaints(m).empty());
}

TEST_F(RouterProcessTest, AKilledDecodeWorkersSessionsMoveAndFinish) {
  auto d0 = startWorker("d0");
  auto d1 = startWorker("d1");
  ASSERT_TRUE(d0 && d1);
  auto router = startRouter({hostPort(*d0), hostPort(*d1)});
  ASSERT_TRUE(router);
  const std::vector<std::string> sessions = {"k-a", "k-b", "k-c", "k-d"};
  for (const auto& s : sessions) ASSERT_EQ(post(*router, completion(turnPrompt(s, 0)), s).status, 200);
  const std::set<std::string> on0 = sessionsServedBy(*d0);
  ASSERT_FALSE(on0.empty());
  d0->stop(SIGKILL);
  for (const auto& s : sessions) {
    http::ClientResponse r = post(*router, completion(turnPrompt(s, 1)), s);
    EXPECT_EQ(r.status, 200) << s << ": " << r.body;
  }
  // d0's sessions finished on d1.
  const std::set<std::string> on1 = sessionsServedBy(*d1);
  for (const auto& s : on0) EXPECT_TRUE(on1.contains(s)) << s;
}

TEST_F(RouterProcessTest, TwoRouterReplicasSendASessionToTheSameWorker) {
  auto d0 = startWorker("d0");
  auto d1 = startWorker("d1");
  auto d2 = startWorker("d2");
  ASSERT_TRUE(d0 && d1 && d2);
  const std::vector<std::string> workers = {hostPort(*d0), hostPort(*d1), hostPort(*d2)};
  auto ra = startRouter(workers);
  auto rb = startRouter(workers);
  ASSERT_TRUE(ra && rb);
  // Turn 0 through replica A, turn 1 through B, turn 2 through A again.
  const std::vector<std::string> sessions = {"r-a", "r-b", "r-c", "r-d", "r-e"};
  for (int turn = 0; turn < 3; ++turn) {
    for (const auto& s : sessions) {
      AgentProcess& via = turn % 2 == 0 ? *ra : *rb;
      ASSERT_EQ(post(via, completion(turnPrompt(s, turn)), s).status, 200);
    }
  }
  std::map<std::string, int> owners;
  for (const AgentProcess* d : {d0.get(), d1.get(), d2.get()}) {
    for (const auto& s : sessionsServedBy(*d)) ++owners[s];
  }
  for (const auto& s : sessions) EXPECT_EQ(owners[s], 1) << s << " was served by " << owners[s] << " workers";
}

TEST_F(RouterProcessTest, ACutEventStreamIsResyncedFromOneSnapshotAndTheWorkerKeepsServing) {
  auto d0 = startWorker("d0");
  ASSERT_TRUE(d0);
  testutil::TcpProxy proxy(std::stoi(hostPort(*d0).substr(hostPort(*d0).rfind(':') + 1)));
  auto router = startRouter({"127.0.0.1:" + std::to_string(proxy.port())});
  ASSERT_TRUE(router);
  ASSERT_EQ(post(*router, completion(turnPrompt("c-a", 0)), "c-a").status, 200);
  const double before = metricValue(scrape(*d0), "tandem_events_snapshots_sent_total");
  ASSERT_GE(before, 1);
  proxy.cutAll();
  // The router re-subscribes with exactly one new snapshot.
  ASSERT_TRUE(waitFor([&] { return metricValue(scrape(*d0), "tandem_events_snapshots_sent_total") >= before + 1; },
                      std::chrono::seconds(30)));
  ASSERT_EQ(post(*router, completion(turnPrompt("c-a", 1)), "c-a").status, 200);
  EXPECT_EQ(metricValue(scrape(*d0), "tandem_events_snapshots_sent_total"), before + 1);
  EXPECT_EQ(metricValue(scrape(*router), "tandem_router_stale_workers"), 0);
}

// A non-streamed answer's headers come only with the finished completion: a
// D slower than --upstream-open-timeout is waited for (up to the request
// timeout), not taken for unreachable and the request sent elsewhere.
TEST_F(RouterProcessTest, ASlowNonStreamedAnswerIsWaitedForNotRetried) {
  auto d0 = startWorker("d0");
  ASSERT_TRUE(d0);
  // Liveness (a silent state stream) is not what this is about: D is stopped
  // for less than --worker-stale-after.
  auto router = startRouter({hostPort(*d0)}, {"--upstream-open-timeout", "300ms", "--worker-stale-after", "30s"});
  ASSERT_TRUE(router);
  ASSERT_EQ(post(*router, completion("a first request opens the connection")).status, 200);
  ASSERT_EQ(kill(d0->pid(), SIGSTOP), 0);
  auto reply = std::async(std::launch::async, [&] { return post(*router, completion("a slow answer")); });
  // Stopped for over three open timeouts. Real time on purpose: the
  // router's socket deadline runs on it.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  ASSERT_EQ(kill(d0->pid(), SIGCONT), 0);
  http::ClientResponse r = reply.get();
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_LE(metricValue(scrape(*router), "tandem_router_retries_total{"), 0) << scrape(*router);
}

TEST_F(RouterProcessTest, AClientThatHangsUpMidStreamFreesTheDecodeWorkersBlocks) {
  auto d0 = startWorker("d0", {"--sse-keepalive", "100ms"});
  ASSERT_TRUE(d0);
  auto router = startRouter({hostPort(*d0)}, {"--sse-keepalive", "100ms"});
  ASSERT_TRUE(router);
  const double free_before = metricValue(scrape(*d0), "tandem_kv_blocks_free");
  json body = completion("a long answer please", 2000);
  body["stream"] = true;
  body["ignore_eos"] = true;
  auto stream = http::SseClient::open({.method = "POST",
                                       .url = router->url("/v1/completions"),
                                       .headers = {{"Content-Type", "application/json"}},
                                       .body = body.dump()});
  ASSERT_TRUE(stream.ok()) << stream.status();
  ASSERT_EQ((*stream)->status(), 200);
  int events = 0;
  ASSERT_TRUE((*stream)->readEvents([&](const http::SseEvent&) { return ++events < 3; }).ok());
  (*stream)->stop();  // hang up after three tokens
  ASSERT_TRUE(waitFor(
      [&] {
        const std::string m = scrape(*d0);
        return metricValue(m, "tandem_requests_running") == 0 &&
               metricValueWith(m, "tandem_requests_total", "cancelled") >= 1;
      },
      std::chrono::seconds(30)));
  // The blocks are back (the prompt's full blocks may stay cached: available too).
  EXPECT_EQ(metricValue(scrape(*d0), "tandem_kv_blocks_free"), free_before);
}

TEST_F(RouterProcessTest, StreamsAreRelayedChunkByChunk) {
  auto d0 = startWorker("d0");
  ASSERT_TRUE(d0);
  auto router = startRouter({hostPort(*d0)});
  ASSERT_TRUE(router);
  json body = completion("count with me", 8);
  body["stream"] = true;
  body["ignore_eos"] = true;
  auto via_router = http::SseClient::open({.method = "POST", .url = router->url("/v1/completions"),
                                           .headers = {{"Content-Type", "application/json"}}, .body = body.dump()});
  auto direct = http::SseClient::open({.method = "POST", .url = d0->url("/v1/completions"),
                                       .headers = {{"Content-Type", "application/json"}}, .body = body.dump()});
  ASSERT_TRUE(via_router.ok() && direct.ok());
  auto texts = [](http::SseClient& s) {
    std::vector<std::string> out;
    EXPECT_TRUE(s.readEvents([&](const http::SseEvent& e) {
                   if (e.data == "[DONE]") {
                     out.push_back("[DONE]");
                     return false;
                   }
                   json j = json::parse(e.data);
                   out.push_back(j["choices"][0]["text"].get<std::string>());
                   return true;
                 }).ok());
    return out;
  };
  const std::vector<std::string> a = texts(**via_router), b = texts(**direct);
  EXPECT_EQ(a, b);  // same chunks, same order (greedy)
  ASSERT_GE(a.size(), 9u);  // a chunk per token, then the finish chunk and [DONE]
  EXPECT_EQ(a.back(), "[DONE]");
  const std::string m = scrape(*router);
  EXPECT_GE(metricValue(m, "tandem_router_ttft_seconds_count"), 1);
  EXPECT_GE(metricValue(m, "tandem_router_tpot_seconds_count"), 1);
}

TEST_F(RouterProcessTest, RouterRefusesBadInputWithTheAgentsErrors) {
  auto d0 = startWorker("d0");
  ASSERT_TRUE(d0);
  auto router = startRouter({hostPort(*d0)});
  ASSERT_TRUE(router);
  http::ClientResponse r = post(*router, json{{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", -1}});
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("max_tokens"), std::string::npos) << r.body;
  http::ClientRequest bad{.method = "POST", .url = router->url("/v1/completions"), .body = "{not json"};
  auto b = http::httpSend(bad);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->status, 400);
}

}  // namespace
}  // namespace tandem::agent::testing
