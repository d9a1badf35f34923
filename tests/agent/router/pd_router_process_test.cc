// The router in front of prefill and decode agents (the `./tandem up`
// shape), real processes on loopback: a session's first turn is prefilled
// on the P the router names and its KV pulled by D; its next turn, a short
// append, goes direct to the D that holds it. And a router whose prefill
// worker is not among D's prefill peers gets D's typed 400
// (`unknown_prefill_peer`), relayed to the client, never retried.

#include <gtest/gtest.h>

#include <sstream>

#include <nlohmann/json.hpp>

#include "src/http/client.h"
#include "tests/agent/agent_process.h"
#include "tests/agent/router/router_test_util.h"

namespace tandem::agent::testing {
namespace {

using nlohmann::json;

std::string kvAddress(const AgentProcess& p) { return "127.0.0.1:" + std::to_string(p.kvPort()); }

std::unique_ptr<AgentProcess> startPrefill(const std::string& name) {
  return AgentProcess::start({"--role", "prefill", "--worker", name, "--kv-listen", "127.0.0.1:0", "--kv-tls", "tcp"});
}

std::unique_ptr<AgentProcess> startDecode(const std::string& name, const std::string& peers) {
  return AgentProcess::start({"--role", "decode", "--worker", name, "--kv-listen", "127.0.0.1:0", "--kv-tls", "tcp",
                              "--prefill-peers", peers});
}

http::ClientResponse chat(const AgentProcess& router, const std::string& content, const std::string& session) {
  http::ClientRequest r{.method = "POST", .url = router.url("/v1/chat/completions")};
  r.headers["Content-Type"] = "application/json";
  r.headers["x-session-id"] = session;
  r.body = json{{"model", "tiny"},
                {"messages", {{{"role", "user"}, {"content", content}}}},
                {"max_tokens", 8},
                {"temperature", 0}}
               .dump();
  r.timeout = std::chrono::seconds(60);
  auto resp = http::httpSend(r);
  EXPECT_TRUE(resp.ok()) << resp.status();
  return resp.ok() ? *resp : http::ClientResponse{};
}

// The `path` of each trace line of `a`, in order.
std::vector<std::string> paths(const AgentProcess& a) {
  std::vector<std::string> out;
  std::istringstream in(a.trace());
  std::string line;
  while (std::getline(in, line)) {
    json j = json::parse(line, nullptr, false);
    if (j.is_object()) out.push_back(j.value("path", ""));
  }
  return out;
}

TEST(PdRouterProcessTest, FirstTurnThroughPNextTurnDirectToTheDThatHoldsIt) {
  auto p = startPrefill("p0");
  ASSERT_TRUE(p);
  auto d0 = startDecode("d0", kvAddress(*p));
  auto d1 = startDecode("d1", kvAddress(*p));
  ASSERT_TRUE(d0 && d1);
  auto router = AgentProcess::start({"--role", "router", "--worker", "router", "--decode-workers",
                                     hostPort(*d0) + "," + hostPort(*d1), "--prefill-workers", hostPort(*p)});
  ASSERT_TRUE(router);
  // The router is ready once a decode worker has reported; until P's own
  // state arrives it has no prefill worker to send a prompt to (and routes
  // direct), so the first turn waits for P to appear in its view.
  ASSERT_TRUE(waitFor([&] {
    return metricValueWith(scrape(*router), "tandem_router_worker_inflight_requests", "worker=\"p0\"") >= 0;
  }));
  std::string conversation = "You are a coding agent. Read the repository and fix the failing test.";
  http::ClientResponse first = chat(*router, conversation, "agent-1");
  ASSERT_EQ(first.status, 200) << first.body;
  const std::vector<std::string> before0 = paths(*d0), before1 = paths(*d1);
  ASSERT_EQ(before0.size() + before1.size(), 1u);
  EXPECT_EQ((before0.empty() ? before1 : before0)[0], "disagg");
  // The next turn repeats the conversation and appends a little.
  conversation += " " + json::parse(first.body)["choices"][0]["message"]["content"].get<std::string>() + " Go on.";
  ASSERT_TRUE(waitFor([&] {
    return metricValueWith(scrape(*router), "tandem_router_worker_sessions", "worker=\"" +
                                                                                 std::string(before0.empty() ? "d1" : "d0") +
                                                                                 "\"") == 1;
  }));
  http::ClientResponse second = chat(*router, conversation, "agent-1");
  ASSERT_EQ(second.status, 200) << second.body;
  const AgentProcess& owner = before0.empty() ? *d1 : *d0;
  const AgentProcess& other = before0.empty() ? *d0 : *d1;
  EXPECT_EQ(paths(owner), (std::vector<std::string>{"disagg", "direct"}));
  EXPECT_TRUE(paths(other).empty());
  EXPECT_EQ(metricValueWith(scrape(*p), "tandem_request_path_total", "path=\"disagg\""), 1);
  const std::string m = scrape(*router);
  EXPECT_EQ(metricValueWith(m, "tandem_router_decisions_total", "path=\"disagg\""), 1);
  EXPECT_EQ(metricValueWith(m, "tandem_router_decisions_total", "path=\"direct\""), 1);
}

TEST(PdRouterProcessTest, APrefillAgentDDoesNotKnowIsATyped400NotRetried) {
  auto p1 = startPrefill("p1");
  auto p2 = startPrefill("p2");
  ASSERT_TRUE(p1 && p2);
  auto d = startDecode("d0", kvAddress(*p1));  // knows p1 only
  ASSERT_TRUE(d);
  auto router = AgentProcess::start({"--role", "router", "--worker", "router", "--decode-workers", hostPort(*d),
                                     "--prefill-workers", hostPort(*p2)});
  ASSERT_TRUE(router);
  http::ClientResponse r = chat(*router, "hello", "s");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(json::parse(r.body)["error"]["code"], "unknown_prefill_peer");
  EXPECT_NE(r.body.find(kvAddress(*p2)), std::string::npos) << r.body;
  EXPECT_EQ(metricValueWith(scrape(*router), "tandem_router_retries_total", "reason="), -1);
}

}  // namespace
}  // namespace tandem::agent::testing
