// The router role in front of real agents on loopback (DESIGN.md §2,
// docs/routing.md): every request goes client -> router -> decode agent as
// real processes and real HTTP. What the issue asks of it through real
// processes: a session's turns stick to one D; a killed D's sessions move
// and finish; two router replicas send a session to the same D; a worker
// whose event stream is cut keeps serving and is re-synced from one
// snapshot; a client that hangs up mid-stream at the router frees D's
// blocks; API keys and their limits are enforced at the router and the
// client's key never reaches D. (A request naming an unknown P is in
// pd_router_process_test.)

#include <gtest/gtest.h>

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "agent/api_keys.h"
#include "src/auth/pool_key.h"
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

// The router checks and tokenizes chats with the workers' chat template, so
// a chat with tools passes it (and a bad tool is refused there), and the
// worker's tool call comes back through it.
TEST_F(RouterProcessTest, ToolCallsPassThroughTheRouter) {
  const std::string model = tinyModelWithChatTemplate(
      "tools-router/tiny",
      "{# replies: <tool_call> blocks #}{% if tools %}<tools>{{ tools | length }}</tools>{% endif %}"
      "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}");
  const std::string script = (testScratchDir() / "tools-router" / "reply.txt").string();
  std::ofstream(script) << "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}\n</tool_call>";
  auto d0 = startWorker("d0", {"--model-dir", model, "--allow-test-hooks", "true", "--scripted-output", script});
  ASSERT_TRUE(d0);
  auto router = startRouter({hostPort(*d0)}, {"--model-dir", model});
  ASSERT_TRUE(router);
  json body = {{"model", "tiny"},
               {"messages", {{{"role", "user"}, {"content", "time?"}}}},
               {"tools", {{{"type", "function"}, {"function", {{"name", "get_time"}}}}}}};
  auto r = http::httpPost(router->url("/v1/chat/completions"), body);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->status, 200) << r->body;
  const json choice = (*r->json())["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls") << r->body;
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "get_time") << r->body;
  body["tools"][0]["function"].erase("name");
  auto bad = http::httpPost(router->url("/v1/chat/completions"), body);
  ASSERT_TRUE(bad.ok()) << bad.status();
  EXPECT_EQ(bad->status, 400) << bad->body;
  EXPECT_EQ((*bad->json())["error"]["param"], "tools[0].function.name") << bad->body;
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

// A request with `key` as its bearer token (none: no Authorization header).
http::ClientResponse postWithKey(const AgentProcess& router, const json& body, const std::string& key) {
  http::ClientRequest r{.method = "POST", .url = router.url("/v1/completions"), .body = body.dump()};
  r.headers["Content-Type"] = "application/json";
  if (!key.empty()) r.headers["Authorization"] = "Bearer " + key;
  auto resp = http::httpSend(r);
  EXPECT_TRUE(resp.ok()) << resp.status();
  return resp.ok() ? *resp : http::ClientResponse{};
}

std::string errorCode(const http::ClientResponse& r) {
  json j = json::parse(r.body, nullptr, false);
  return j.is_object() && j["error"].is_object() && j["error"]["code"].is_string()
             ? j["error"]["code"].get<std::string>()
             : "";
}

TEST_F(RouterProcessTest, ApiKeysAreCheckedAtTheRouterAndNeverForwarded) {
  const std::string open_key = "sk-router-open-0123456789abcdef";
  const std::string slow_key = "sk-router-slow-0123456789abcdef";
  const std::string single_key = "sk-router-single-0123456789abcdef";
  const std::string keys_file = testScratchDir() / "router-api-keys.yaml";
  std::ofstream(keys_file) << "keys:\n"
                           << apiKeyFileEntry("open", hashApiKey(open_key))
                           << apiKeyFileEntry("slow", hashApiKey(slow_key))
                           << "  requests_per_second: 0.1\n  burst: 1\n"
                           << apiKeyFileEntry("single", hashApiKey(single_key)) << "  max_concurrent: 1\n";
  auto d0 = startWorker("d0");  // no keys of its own: it serves what the router sends
  ASSERT_TRUE(d0);
  // Everything the router sends D passes through the proxy, which keeps it.
  testutil::TcpProxy proxy(std::stoi(hostPort(*d0).substr(hostPort(*d0).rfind(':') + 1)));
  auto router = startRouter({"127.0.0.1:" + std::to_string(proxy.port())}, {"--api-keys-file", keys_file});
  ASSERT_TRUE(router);

  http::ClientResponse none = postWithKey(*router, completion("no key"), "");
  EXPECT_EQ(none.status, 401) << none.body;
  EXPECT_EQ(errorCode(none), "invalid_api_key");
  http::ClientResponse wrong = postWithKey(*router, completion("a wrong key"), "sk-router-wrong-0123456789abcdef");
  EXPECT_EQ(wrong.status, 401) << wrong.body;
  EXPECT_EQ(errorCode(wrong), "invalid_api_key");
  auto models = http::httpSend({.method = "GET", .url = router->url("/v1/models")});
  ASSERT_TRUE(models.ok());
  EXPECT_EQ(models->status, 401);

  ASSERT_EQ(postWithKey(*router, completion("the first of two"), slow_key).status, 200);
  http::ClientResponse limited = postWithKey(*router, completion("the second of two"), slow_key);
  EXPECT_EQ(limited.status, 429) << limited.body;
  EXPECT_EQ(errorCode(limited), "rate_limit_exceeded");
  // 0.1 per second: the next token 10 s after the first request's, in whole seconds.
  const int retry_after = std::atoi(limited.headers["Retry-After"].c_str());
  EXPECT_TRUE(retry_after >= 1 && retry_after <= 10) << limited.headers["Retry-After"];

  // One request in flight: each ends (unary or streamed) before the client
  // sees its end, so back-to-back requests all pass.
  for (int i = 0; i < 6; ++i) {
    json body = completion("one at a time " + std::to_string(i), 4);
    if (i % 2 == 1) {
      body["stream"] = true;
      auto s = http::SseClient::open(
          {.method = "POST",
           .url = router->url("/v1/completions"),
           .headers = {{"Content-Type", "application/json"}, {"Authorization", "Bearer " + single_key}},
           .body = body.dump()});
      ASSERT_TRUE(s.ok()) << s.status();
      ASSERT_EQ((*s)->status(), 200) << i;
      bool done = false;
      ASSERT_TRUE((*s)->readEvents([&](const http::SseEvent& e) { return !(done = e.data == "[DONE]"); }).ok());
      ASSERT_TRUE(done) << i;
    } else {
      http::ClientResponse r = postWithKey(*router, body, single_key);
      ASSERT_EQ(r.status, 200) << i << ": " << r.body;
    }
  }
  // A stream open: the key's one slot is taken.
  json long_body = completion("a long answer", 3500);  // seconds of tokens; d0 holds 256 blocks of 16
  long_body["stream"] = true;
  long_body["ignore_eos"] = true;
  auto open_stream = http::SseClient::open(
      {.method = "POST",
       .url = router->url("/v1/completions"),
       .headers = {{"Content-Type", "application/json"}, {"Authorization", "Bearer " + single_key}},
       .body = long_body.dump()});
  ASSERT_TRUE(open_stream.ok());
  ASSERT_EQ((*open_stream)->status(), 200);
  // Its reader parks in the callback after two events, keeping the
  // connection open (returning false would close it), until told to hang up.
  std::promise<void> reading, hang_up;
  std::shared_future<void> hang_up_now = hang_up.get_future().share();
  auto reader = std::async(std::launch::async, [&] {
    int events = 0;
    return (*open_stream)->readEvents([&](const http::SseEvent&) {
      if (++events < 2) return true;
      reading.set_value();
      hang_up_now.wait();
      return false;  // closes the connection: the client hangs up
    });
  });
  ASSERT_EQ(reading.get_future().wait_for(std::chrono::seconds(30)), std::future_status::ready);
  http::ClientResponse busy = postWithKey(*router, completion("while the stream is open"), single_key);
  EXPECT_EQ(busy.status, 429) << busy.body;
  EXPECT_EQ(errorCode(busy), "concurrency_limit_exceeded");
  EXPECT_EQ(busy.headers["Retry-After"], "1");
  hang_up.set_value();  // the slot comes back once the router notices
  EXPECT_TRUE(reader.get().ok());
  EXPECT_TRUE(waitFor([&] { return postWithKey(*router, completion("after the hang-up"), single_key).status == 200; },
                      std::chrono::seconds(30), std::chrono::milliseconds(50)));

  ASSERT_EQ(postWithKey(*router, completion("served"), open_key).status, 200);
  const std::string sent_to_d = proxy.bytesToTarget();
  EXPECT_NE(sent_to_d.find("POST /v1/completions"), std::string::npos) << "the requests went through the proxy";
  for (const std::string& key : {open_key, slow_key, single_key}) {
    EXPECT_EQ(sent_to_d.find(key), std::string::npos) << "the client's key reached D";
  }
  const std::string m = scrape(*router);
  EXPECT_GE(metricValueWith(m, "tandem_api_requests_rejected_total", "reason=\"invalid_api_key\""), 3) << m;
  EXPECT_GE(metricValueWith(m, "tandem_api_requests_rejected_total", "reason=\"rate_limited\""), 1) << m;
  EXPECT_GE(metricValueWith(m, "tandem_api_requests_rejected_total", "reason=\"concurrency_limited\""), 1) << m;
  EXPECT_TRUE(promtoolComplaints(m).empty());
}


// A pool key directory holding `key` (the pool's Secret, mounted).
std::string poolKeyDir(const std::string& name, const std::string& key) {
  const std::filesystem::path dir = testScratchDir() / name;
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "key") << key << "\n";
  return dir.string();
}

int statusOf(const http::ClientRequest& r) {
  auto resp = http::httpSend(r);
  EXPECT_TRUE(resp.ok()) << resp.status();
  return resp.ok() ? resp->status : -1;
}

// /internal/v1/ answers only the pool's token; a decode agent honours the
// routing headers only from a caller bearing it (a router of the pool).
TEST_F(RouterProcessTest, ThePoolKeyGuardsTheInternalApiAndTheRoutingHeaders) {
  const std::string key(64, 'k');
  const std::string dir = poolKeyDir("internal-api-key", key);
  const std::string token = (*auth::PoolKeys::of({key}, {"k"}))->internalToken();
  auto d = AgentProcess::start({"--role", "decode", "--kv-listen", "127.0.0.1:0", "--kv-tls", "tcp",
                                "--prefill-peer", "127.0.0.1:1", "--pool-key-dir", dir});
  ASSERT_TRUE(d);

  http::ClientRequest events{.method = "GET", .url = d->url("/internal/v1/events")};
  auto none = http::httpSend(events);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->status, 401);
  EXPECT_EQ(errorCode(*none), "invalid_internal_token") << none->body;
  events.headers["Authorization"] = "Bearer tandem-pool.k-0000000000000000.0123";
  EXPECT_EQ(statusOf(events), 401);
  events.headers["Authorization"] = "Bearer " + (*auth::PoolKeys::of({std::string(64, 'x')}, {"x"}))->internalToken();
  EXPECT_EQ(statusOf(events), 401);  // another pool's token
  events.headers["Authorization"] = "Bearer " + token;
  auto stream = http::SseClient::open(events);
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ((*stream)->status(), 200);
  (*stream)->stop();

  http::ClientRequest routed{.method = "POST", .url = d->url("/v1/completions"), .body = completion("routed").dump()};
  routed.headers["Content-Type"] = "application/json";
  routed.headers["x-tandem-route-path"] = "direct";
  auto refused = http::httpSend(routed);
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->status, 403);
  EXPECT_EQ(errorCode(*refused), "routing_headers_not_allowed") << refused->body;
  routed.headers["Authorization"] = "Bearer " + token;
  auto honoured = http::httpSend(routed);
  ASSERT_TRUE(honoured.ok());
  EXPECT_EQ(honoured->status, 200) << honoured->body;
  // Without routing headers anyone may still ask (the public API).
  EXPECT_EQ(post(*d, completion("public")).status, 200);
}

// A router of the pool subscribes to and forwards to agents of the pool,
// which then skip their own API-key check (the router made it). (A router
// with another pool's key gets 401 on its subscriptions, as the test above
// shows for the token, and never becomes ready.)
TEST_F(RouterProcessTest, ARouterServesOnlyThroughAgentsOfItsPool) {
  const std::string key(64, 'p');
  const std::string dir = poolKeyDir("router-pool-key", key);
  const std::string client_key = "sk-pool-client-0123456789abcdef";
  const std::string keys_file = testScratchDir() / "pool-api-keys.yaml";
  std::ofstream(keys_file) << "keys:\n" << apiKeyFileEntry("client", hashApiKey(client_key));
  auto d0 = startWorker("d0", {"--pool-key-dir", dir, "--api-keys-file", keys_file});
  ASSERT_TRUE(d0);
  auto router = startRouter({hostPort(*d0)}, {"--pool-key-dir", dir, "--api-keys-file", keys_file});
  ASSERT_TRUE(router);
  http::ClientResponse ok = postWithKey(*router, completion("through the pool's router"), client_key);
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(postWithKey(*d0, completion("straight to the agent"), "").status, 401);  // the agent still wants a key
}

}  // namespace
}  // namespace tandem::agent::testing
