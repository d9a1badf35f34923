// Integration tests: the real tandem-agent process on loopback, over HTTP.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "src/http/client.h"
#include "tests/agent/agent_process.h"

namespace tandem::agent {
namespace {

using nlohmann::json;
using testing::AgentProcess;
using testing::metricValue;
using testing::scrape;
using testing::waitFor;

json post(const AgentProcess& a, const std::string& path, const json& body, int* status = nullptr) {
  auto r = http::httpPost(a.url(path), body, std::chrono::seconds(60));
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return {};
  if (status) *status = r->status;
  auto j = r->json();
  EXPECT_TRUE(j.ok()) << r->body;
  return j.ok() ? *j : json();
}

// Streams a request; returns the data payloads (including "[DONE]").
std::vector<std::string> stream(const AgentProcess& a, const std::string& path, const json& body) {
  auto s = http::SseClient::open({.method = "POST", .url = a.url(path), .body = body.dump(), .timeout = std::chrono::seconds(60)});
  EXPECT_TRUE(s.ok()) << s.status();
  std::vector<std::string> out;
  if (!s.ok()) return out;
  EXPECT_EQ((*s)->status(), 200);
  absl::Status st = (*s)->readEvents([&](const http::SseEvent& e) {
    out.push_back(e.data);
    return true;
  });
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

class AgentProcessTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { agent_ = AgentProcess::start({"--num-blocks", "256", "--max-body-bytes", "65536"}).release(); }
  static void TearDownTestSuite() {
    if (agent_) {
      EXPECT_EQ(agent_->stop(SIGTERM), 0) << agent_->log();
    }
    delete agent_;
  }
  void SetUp() override { ASSERT_NE(agent_, nullptr); }
  static AgentProcess* agent_;
};
AgentProcess* AgentProcessTest::agent_ = nullptr;

TEST_F(AgentProcessTest, HealthReadyModels) {
  auto h = http::httpGet(agent_->url("/healthz"));
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->status, 200);
  auto m = http::httpGet(agent_->url("/v1/models"));
  ASSERT_TRUE(m.ok());
  auto j = m->json();
  ASSERT_TRUE(j.ok());
  EXPECT_EQ((*j)["data"][0]["id"], "tiny");
}

TEST_F(AgentProcessTest, CompletionUsageAddsUp) {
  json r = post(*agent_, "/v1/completions",
                {{"model", "tiny"}, {"prompt", "def main():"}, {"max_tokens", 9}, {"temperature", 0}, {"ignore_eos", true}});
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["completion_tokens"], 9);
  EXPECT_EQ(r["usage"]["prompt_tokens"], 12);  // <s> + 11 characters
  EXPECT_EQ(r["usage"]["total_tokens"], 21);
  // At most one byte per token (control tokens decode to nothing).
  EXPECT_LE(r["choices"][0]["text"].get<std::string>().size(), 9u);
}

TEST_F(AgentProcessTest, ChatStreamingEqualsNonStreaming) {
  json req = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "write a loop"}}}},
              {"max_tokens", 12}, {"temperature", 0}};
  json unary = post(*agent_, "/v1/chat/completions", req);
  std::string expected = unary["choices"][0]["message"]["content"];
  req["stream"] = true;
  req["stream_options"] = {{"include_usage", true}};
  auto events = stream(*agent_, "/v1/chat/completions", req);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  std::string finish;
  json usage;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json c = json::parse(events[i]);
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    EXPECT_EQ(c["id"], json::parse(events[0])["id"]);
    if (c["choices"].empty()) {
      usage = c["usage"];
      continue;
    }
    const json& ch = c["choices"][0];
    if (ch["delta"].contains("content")) text += ch["delta"]["content"].get<std::string>();
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  EXPECT_EQ(json::parse(events[0])["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(text, expected);
  EXPECT_EQ(finish, unary["choices"][0]["finish_reason"]);
  EXPECT_EQ(usage, unary["usage"]);
}

TEST_F(AgentProcessTest, SeededSamplingIsReproducible) {
  json req = {{"model", "tiny"}, {"prompt", "seeded"}, {"max_tokens", 24}, {"temperature", 1.0}, {"seed", 7}, {"ignore_eos", true}};
  std::string a = post(*agent_, "/v1/completions", req)["choices"][0]["text"];
  std::string b = post(*agent_, "/v1/completions", req)["choices"][0]["text"];
  req["seed"] = 8;
  std::string c = post(*agent_, "/v1/completions", req)["choices"][0]["text"];
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST_F(AgentProcessTest, SessionHeaderReusesResidentKv) {
  json req = {{"model", "tiny"}, {"prompt", std::string(100, 'x')}, {"max_tokens", 4}, {"temperature", 0}, {"ignore_eos", true}};
  auto r1 = http::httpSend({.method = "POST", .url = agent_->url("/v1/completions"), .headers = {{"x-session-id", "conv-42"}}, .body = req.dump()});
  ASSERT_TRUE(r1.ok() && r1->status == 200);
  std::string out1 = json::parse(r1->body)["choices"][0]["text"];
  req["prompt"] = std::string(100, 'x') + out1 + " next turn";
  auto r2 = http::httpSend({.method = "POST", .url = agent_->url("/v1/completions"), .headers = {{"x-session-id", "conv-42"}}, .body = req.dump()});
  ASSERT_TRUE(r2.ok() && r2->status == 200);
  // The trace shows the second turn served its history from the resident session.
  ASSERT_TRUE(waitFor([&] { return agent_->trace().find("\"session\":\"conv-42\"") != std::string::npos; }));
  std::istringstream lines(agent_->trace());
  std::string line;
  int turns = 0;
  int cached_second = -1;
  while (std::getline(lines, line)) {
    json t = json::parse(line);
    if (t["session"] == "conv-42" && ++turns == 2) cached_second = t["cached_tokens"];
  }
  EXPECT_EQ(turns, 2);
  EXPECT_EQ(cached_second, 1 + 100 + 3);  // <s>, the first prompt, and all but the last output token
  // The resident session's KV is exported apart from the running sequences'
  // (the planner's working set): its 109 tokens hold at least one block.
  EXPECT_TRUE(waitFor([&] { return metricValue(scrape(*agent_), "tandem_kv_blocks_sessions{") >= 1; })) << scrape(*agent_);
}

TEST_F(AgentProcessTest, BadInputGetsDocumentedStatusAndMessage) {
  auto raw = [&](const std::string& path, const std::string& body) {
    auto r = http::httpSend({.method = "POST", .url = agent_->url(path), .body = body});
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : http::ClientResponse{};
  };
  auto expectError = [&](const http::ClientResponse& r, int status, const std::string& needle) {
    EXPECT_EQ(r.status, status) << r.body;
    auto j = r.json();
    ASSERT_TRUE(j.ok()) << r.body;
    ASSERT_TRUE((*j).contains("error")) << r.body;
    std::string msg = (*j)["error"]["message"];
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  };
  expectError(raw("/v1/completions", "{\"model\": \"tiny\", \"prompt\": "), 400, "JSON");
  expectError(raw("/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"\xff\xfe\"}"), 400, "UTF-8");
  expectError(raw("/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"x\",\"temperature\":1e400}"), 400, "1e400");
  expectError(raw("/v1/chat/completions", "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":5}]}]}"),
              400, "only text");
  expectError(raw("/v1/completions", json{{"model", "tiny"}, {"prompt", std::string(70000, 'a')}}.dump()), 413, "");
  expectError(raw("/v1/completions", json{{"model", "nope"}, {"prompt", "x"}}.dump()), 404, "does not exist");
  expectError(raw("/v1/completions", json{{"model", "tiny"}}.dump()), 400, "'prompt' is required");
  expectError(raw("/v1/completions", json{{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", -3}}.dump()), 400, "at least 1");
  expectError(raw("/v1/completions", json{{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", "ten"}}.dump()), 400, "must be an integer");
  expectError(raw("/v1/completions", json{{"model", "tiny"}, {"prompt", "x"}, {"temperature", -1}}.dump()), 400, "temperature");
  expectError(raw("/v1/completions", json{{"model", "tiny"}, {"prompt", "x"}, {"top_p", 0}}.dump()), 400, "top_p");
  expectError(raw("/v1/completions", json{{"model", "tiny"}, {"prompt", "x"}, {"n", 3}}.dump()), 400, "'n' must be 1");
  expectError(raw("/v1/completions", json{{"model", "tiny"}, {"prompt", std::string(20000, 'a')}}.dump()), 400, "maximum context length");
  expectError(raw("/v1/chat/completions", json{{"model", "tiny"}, {"messages", json::array()}}.dump()), 400, "at least one message");
  expectError(raw("/v1/chat/completions", json{{"model", "tiny"}}.dump()), 400, "'messages' is required");
  expectError(raw("/v1/chat/completions", json{{"model", "tiny"}, {"messages", {{{"role", "robot"}, {"content", "x"}}}}}.dump()), 400, "'robot'");
  auto r = http::httpGet(agent_->url("/v1/nothing-here"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 404);
  // The agent survived all of it.
  EXPECT_EQ(http::httpGet(agent_->url("/healthz"))->status, 200);
}

TEST(AgentCapacityTest, RequestThePoolCanNeverHoldIs400EvenWhenStreamed) {
  // 8 blocks of 16 tokens: a request reserving more can never be admitted.
  // A stream must not open (200) and then carry the error as an event.
  auto agent = AgentProcess::start({"--num-blocks", "8"});
  ASSERT_NE(agent, nullptr);
  for (bool streamed : {false, true}) {
    json req = {{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 200}, {"stream", streamed}};
    auto r = http::httpSend({.method = "POST", .url = agent->url("/v1/completions"), .body = req.dump()});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 400) << "stream " << streamed << ": " << r->body;
    auto j = r->json();
    ASSERT_TRUE(j.ok()) << r->body;
    EXPECT_EQ((*j)["error"]["code"], "kv_capacity_exceeded") << r->body;
    EXPECT_NE((*j)["error"]["message"].get<std::string>().find("the pool has only 8"), std::string::npos) << r->body;
  }
  json fits = post(*agent, "/v1/completions", {{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 100}, {"ignore_eos", true}});
  EXPECT_EQ(fits["choices"][0]["finish_reason"], "length") << fits.dump();
}

TEST_F(AgentProcessTest, LiveScrapePassesPromtool) {
  post(*agent_, "/v1/completions", {{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 3}});
  std::string text = scrape(*agent_);
  for (const char* name : {"tandem_request_ttft_seconds_bucket", "tandem_request_tpot_seconds_count", "tandem_request_e2e_seconds_sum",
                           "tandem_request_queue_seconds_count", "tandem_requests_total", "tandem_prompt_tokens_total",
                           "tandem_generation_tokens_total", "tandem_prefix_cache_hit_tokens_total",
                           "tandem_prefix_cache_query_tokens_total", "tandem_preemptions_total", "tandem_kv_session_evictions_total",
                           "tandem_kv_blocks_capacity",
                           "tandem_kv_blocks_free", "tandem_requests_running", "tandem_requests_waiting",
                           "tandem_prefill_queue_tokens", "tandem_sessions_resident", "tandem_kv_blocks_sessions",
                           "vllm:num_requests_waiting",
                           "vllm:num_requests_running", "vllm:kv_cache_usage_perc"}) {
    EXPECT_NE(text.find(std::string(name) + "{"), std::string::npos) << name;
  }
  EXPECT_NE(text.find("pool=\"default\",role=\"both\""), std::string::npos);
  EXPECT_THAT(testing::promtoolComplaints(text), ::testing::IsEmpty()) << text;
}

// The harness can fail: a counter without its _total suffix is a finding.
TEST(PromtoolHarnessTest, ReportsALintFinding) {
  const std::string bad = "# HELP tandem_things Things.\n# TYPE tandem_things counter\ntandem_things 1\n";
  EXPECT_THAT(testing::promtoolComplaints(bad), ::testing::Not(::testing::IsEmpty()));
}

TEST(AgentProcessIsolatedTest, DisconnectCancelsAndFreesBlocks) {
  auto agent = AgentProcess::start({"--num-blocks", "64", "--expected-output-tokens", "16"});
  ASSERT_NE(agent, nullptr);
  EXPECT_EQ(metricValue(scrape(*agent), "tandem_kv_blocks_free{"), 64);
  json req = {{"model", "tiny"}, {"prompt", "stream forever"}, {"max_tokens", 5000}, {"ignore_eos", true}, {"stream", true}};
  auto s = http::SseClient::open({.method = "POST", .url = agent->url("/v1/completions"), .body = req.dump()});
  ASSERT_TRUE(s.ok()) << s.status();
  int events = 0;
  ASSERT_TRUE((*s)->readEvents([&](const http::SseEvent&) { return ++events < 5; }).ok());  // hang up after 5 events
  (*s)->stop();
  ASSERT_TRUE(waitFor([&] { return metricValue(scrape(*agent), "tandem_requests_total{finish_reason=\"cancelled\"") == 1; }))
      << scrape(*agent);
  ASSERT_TRUE(waitFor([&] { return metricValue(scrape(*agent), "tandem_kv_blocks_free{") == 64; }));
  EXPECT_EQ(metricValue(scrape(*agent), "tandem_requests_running{"), 0);
  EXPECT_EQ(agent->stop(SIGTERM), 0);
}

TEST(AgentProcessIsolatedTest, OverloadGets429WithRetryAfter) {
  auto agent = AgentProcess::start({"--max-num-seqs", "1", "--max-waiting", "0", "--expected-output-tokens", "16"});
  ASSERT_NE(agent, nullptr);
  json long_req = {{"model", "tiny"}, {"prompt", "busy"}, {"max_tokens", 5000}, {"ignore_eos", true}, {"stream", true}};
  auto s = http::SseClient::open({.method = "POST", .url = agent->url("/v1/completions"), .body = long_req.dump()});
  ASSERT_TRUE(s.ok());
  int events = 0;
  ASSERT_TRUE((*s)->readEvents([&](const http::SseEvent&) { return ++events < 2; }).ok());
  auto r = http::httpPost(agent->url("/v1/completions"), json{{"model", "tiny"}, {"prompt", "x"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 429) << r->body;
  EXPECT_EQ(r->headers.count("Retry-After"), 1u);
  EXPECT_NE(r->body.find("rate_limit_error"), std::string::npos);
  (*s)->stop();
  EXPECT_EQ(agent->stop(SIGTERM), 0);
}

TEST(AgentProcessIsolatedTest, DrainFinishesInFlightStreamThenExitsZero) {
  auto agent = AgentProcess::start({"--drain-grace", "60s"});
  ASSERT_NE(agent, nullptr);
  json req = {{"model", "tiny"}, {"prompt", "drain me"}, {"max_tokens", 300}, {"ignore_eos", true}, {"stream", true}};
  auto s = http::SseClient::open({.method = "POST", .url = agent->url("/v1/completions"), .body = req.dump()});
  ASSERT_TRUE(s.ok());
  std::atomic<int> chunks{0};
  std::vector<std::string> events;
  std::thread reader([&] {
    absl::Status st = (*s)->readEvents([&](const http::SseEvent& e) {
      events.push_back(e.data);
      chunks.fetch_add(1);
      return true;
    });
    EXPECT_TRUE(st.ok()) << st;
  });
  ASSERT_TRUE(waitFor([&] { return chunks.load() >= 3; }));
  kill(agent->pid(), SIGTERM);
  // While draining: not ready, and new work is refused.
  ASSERT_TRUE(waitFor([&] {
    auto r = http::httpGet(agent->url("/readyz"), std::chrono::seconds(2));
    return !r.ok() || r->status == 503;
  }));
  auto refused = http::httpPost(agent->url("/v1/completions"), json{{"model", "tiny"}, {"prompt", "late"}}, std::chrono::seconds(5));
  if (refused.ok()) {
    EXPECT_EQ(refused->status, 503);
  }
  reader.join();
  // The stream ran to its natural end: the finish chunk says "length" (all
  // 300 tokens were generated), then [DONE].
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(json::parse(events[events.size() - 2])["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(agent->waitExit(), 0) << agent->log();
}

TEST(AgentProcessIsolatedTest, BadConfigurationExitsWithClearError) {
  const char* bin_dir = std::getenv("TANDEM_BIN_DIR");
  std::string cmd = std::string(bin_dir ? bin_dir : "build/bin") + "/tandem-agent --model-dir /nonexistent/model 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof(buf), p)) out += buf;
  int rc = pclose(p);
  EXPECT_EQ(WEXITSTATUS(rc), 1);
  EXPECT_NE(out.find("/nonexistent/model"), std::string::npos) << out;
  cmd = std::string(bin_dir ? bin_dir : "build/bin") + "/tandem-agent --num-blocks nope 2>&1";
  p = popen(cmd.c_str(), "r");
  out.clear();
  while (fgets(buf, sizeof(buf), p)) out += buf;
  rc = pclose(p);
  EXPECT_EQ(WEXITSTATUS(rc), 2);
  EXPECT_NE(out.find("--num-blocks"), std::string::npos) << out;
  // A SIMD level that does not exist (TANDEM_CPU_SIMD, docs/engine.md) is a
  // start-up error naming the variable and the accepted values.
  cmd = "TANDEM_CPU_SIMD=avx9 " + std::string(bin_dir ? bin_dir : "build/bin") + "/tandem-agent --model-dir " +
        testing::tinyModelDir() + " --listen 127.0.0.1:0 2>&1";
  p = popen(cmd.c_str(), "r");
  out.clear();
  while (fgets(buf, sizeof(buf), p)) out += buf;
  rc = pclose(p);
  EXPECT_EQ(WEXITSTATUS(rc), 1);
  EXPECT_NE(out.find("TANDEM_CPU_SIMD"), std::string::npos) << out;
  EXPECT_NE(out.find("avx9"), std::string::npos) << out;
  EXPECT_NE(out.find("portable, avx2 or avx512"), std::string::npos) << out;
}

}  // namespace
}  // namespace tandem::agent
