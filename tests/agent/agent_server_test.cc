// The agent in-process (AgentServer, role both) on loopback, driven by a
// FakeClock: what it reads from the clock it is given, and passes down.

#include "agent/agent_server.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "src/common/clock.h"
#include "src/http/client.h"
#include "tests/agent/agent_process.h"
#include "tests/testing/quiet_logs.h"

namespace tandem::agent {
namespace {

using nlohmann::json;

class AgentServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    AgentConfig config;
    config.model_dir = testing::tinyModelDir();
    config.model_name = "tiny";
    config.port = 0;
    config.request_timeout = std::chrono::seconds(5);
    config.engine.seed = 1;
    auto server = AgentServer::start(config, clock_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    url_ = "http://127.0.0.1:" + std::to_string(server_->port()) + "/v1/completions";
  }

  FakeClock clock_;
  std::unique_ptr<AgentServer> server_;
  std::string url_;
};

TEST_F(AgentServerTest, CreatedIsTheInjectedClocksWallTime) {
  auto r = http::httpPost(url_, {{"model", "tiny"}, {"prompt", "hi"}, {"max_tokens", 2}});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->status, 200) << r->body;
  auto body = r->json();
  ASSERT_TRUE(body.ok());
  const int64_t want = std::chrono::duration_cast<std::chrono::seconds>(clock_.wallNow().time_since_epoch()).count();
  EXPECT_EQ((*body)["created"], want);  // FakeClock's 2026-01-01, not the machine's date
}

// The request's deadline is set on the injected clock and the engine, which
// got the same clock, ends the request when that clock passes it: no real
// time goes by. The stream is open, so the timeout arrives as an error event.
TEST_F(AgentServerTest, RequestDeadlineRunsOnTheInjectedClock) {
  const json body = {{"model", "tiny"},    {"prompt", "x"},  {"max_tokens", 4000},
                     {"ignore_eos", true}, {"stream", true}, {"temperature", 0}};
  auto s = http::SseClient::open({.method = "POST", .url = url_, .body = body.dump()});
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ((*s)->status(), 200);
  std::vector<std::string> events;
  absl::Status read = (*s)->readEvents([&](const http::SseEvent& e) {
    // The request runs (a text chunk arrived): move time past its deadline.
    if (events.empty()) clock_.advance(std::chrono::seconds(6));
    events.push_back(e.data);
    return true;
  });
  ASSERT_TRUE(read.ok()) << read;
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  json error = json::parse(events[events.size() - 2]);
  EXPECT_EQ(error["error"]["code"], "timeout") << error.dump();
  EXPECT_LT(events.size(), 4000u);  // ended by the deadline, not by max_tokens
}

// The worker-state stream's heartbeat runs on the injected clock: an idle
// stream gets one when the clock passes events.heartbeat, carrying the seq
// the stream is at.
TEST_F(AgentServerTest, EventsStreamHeartbeatRunsOnTheInjectedClock) {
  auto s =
      http::SseClient::open({.url = "http://127.0.0.1:" + std::to_string(server_->port()) + "/internal/v1/events"});
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ((*s)->status(), 200);
  std::vector<json> events;
  absl::Status read = (*s)->readEvents([&](const http::SseEvent& e) {
    events.push_back(json::parse(e.data));
    if (events.size() == 1) clock_.advance(std::chrono::seconds(5));  // the default events.heartbeat
    return events.size() < 2;
  });
  ASSERT_TRUE(read.ok()) << read;
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0]["type"], "snapshot");
  EXPECT_EQ(events[1]["type"], "heartbeat");
  EXPECT_EQ(events[1]["epoch"], events[0]["epoch"]);
  EXPECT_EQ(events[1]["seq"], events[0]["seq"]);
}

}  // namespace
}  // namespace tandem::agent
