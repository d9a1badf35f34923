// A decode agent with several prefill agents, real processes on loopback:
// each request uses the P the router names (x-tandem-prefill-peer), a P
// outside the set is a typed 400, without a header D picks one itself, a
// dead P's requests move to a healthy one once its failure window marks it
// unhealthy. And the model identity: P and D of different cache salts
// refuse each other; with the same salt the P/D path works.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "src/http/client.h"
#include "tests/agent/agent_process.h"

namespace tandem::agent {
namespace {

using nlohmann::json;
using testing::AgentProcess;
using testing::metricValueWith;
using testing::scrape;
using testing::waitFor;

std::unique_ptr<AgentProcess> startPrefill(std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--role", "prefill", "--kv-listen", "127.0.0.1:0", "--kv-tls", "tcp"};
  args.insert(args.end(), extra.begin(), extra.end());
  return AgentProcess::start(args);
}

std::string kvAddress(const AgentProcess& p) { return "127.0.0.1:" + std::to_string(p.kvPort()); }

struct Reply {
  int status = -1;
  json body;
};

// A greedy completion, naming prefill agent `peer` unless it is empty, and
// the router's path `path` unless it is empty, in session `session` if set.
Reply complete(const AgentProcess& d, const std::string& prompt, const std::string& peer = "",
               const std::string& path = "", const std::string& session = "") {
  http::ClientRequest req{.method = "POST", .url = d.url("/v1/completions")};
  req.headers["Content-Type"] = "application/json";
  if (!peer.empty()) req.headers["x-tandem-prefill-peer"] = peer;
  if (!path.empty()) req.headers["x-tandem-route-path"] = path;
  if (!session.empty()) req.headers["x-session-id"] = session;
  req.body =
      json{{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true}}.dump();
  req.timeout = std::chrono::seconds(60);
  auto r = http::httpSend(req);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return {};
  return {r->status, json::parse(r->body, nullptr, false)};
}

// Prefills a prefill agent ran for decode agents.
double served(const AgentProcess& p) {
  return metricValueWith(scrape(p), "tandem_request_path_total", "path=\"disagg\"");
}

// D's per-prefill-agent series `name` for prefill agent `p`.
double peerMetric(const AgentProcess& d, const std::string& name, const AgentProcess& p) {
  return metricValueWith(scrape(d), name, "peer=\"" + kvAddress(p) + "\"");
}

class PdManyPrefillTest : public ::testing::Test {
 protected:
  void SetUp() override {
    p1_ = startPrefill();
    p2_ = startPrefill();
    ASSERT_TRUE(p1_ && p2_);
    d_ = AgentProcess::start({"--role", "decode", "--kv-listen", "127.0.0.1:0", "--kv-tls", "tcp", "--prefill-peers",
                              kvAddress(*p1_) + "," + kvAddress(*p2_)});
    ASSERT_NE(d_, nullptr);
  }
  void TearDown() override {
    for (auto* a : {&d_, &p1_, &p2_}) {
      if (*a && (*a)->pid() > 0) {
        EXPECT_EQ((*a)->stop(SIGTERM), 0) << (*a)->log();
      }
    }
  }

  // The trace line of D's last finished request.
  json lastTrace() const {
    std::istringstream in(d_->trace());
    std::string line, last;
    while (std::getline(in, line)) last = line;
    return json::parse(last, nullptr, false);
  }

  std::unique_ptr<AgentProcess> p1_, p2_, d_;
};

TEST_F(PdManyPrefillTest, EachRequestUsesTheNamedPrefillAgent) {
  const std::string prompt = "the same prompt through either prefill agent";
  Reply via2 = complete(*d_, prompt, kvAddress(*p2_));
  ASSERT_EQ(via2.status, 200) << via2.body.dump() << d_->log();
  EXPECT_EQ(served(*p2_), 1);
  EXPECT_EQ(served(*p1_), 0);
  EXPECT_EQ(lastTrace()["prefill_peer"], kvAddress(*p2_));
  EXPECT_EQ(lastTrace()["path"], "disagg");
  Reply via1 = complete(*d_, prompt, kvAddress(*p1_));
  ASSERT_EQ(via1.status, 200) << via1.body.dump();
  EXPECT_EQ(served(*p1_), 1);
  EXPECT_EQ(served(*p2_), 1);
  EXPECT_EQ(lastTrace()["prefill_peer"], kvAddress(*p1_));
  EXPECT_EQ(via1.body["choices"][0]["text"], via2.body["choices"][0]["text"]);
  for (const AgentProcess* p : {p1_.get(), p2_.get()}) {
    EXPECT_EQ(peerMetric(*d_, "tandem_kv_prefill_requests_total", *p), 1);
    EXPECT_EQ(peerMetric(*d_, "tandem_kv_prefill_peer_healthy", *p), 1);
  }
  // Without a header D picks the healthy P with the fewest transfers in
  // flight, ties by order: one at a time, that is the first.
  for (int i = 0; i < 3; ++i) ASSERT_EQ(complete(*d_, "no header " + std::to_string(i)).status, 200);
  EXPECT_EQ(served(*p1_), 4);
  EXPECT_EQ(served(*p2_), 1);
}

TEST_F(PdManyPrefillTest, APrefillAgentOutsideTheSetIsATyped400) {
  for (const std::string& bad : {std::string("127.0.0.1:1"), std::string("not-a-peer")}) {
    Reply r = complete(*d_, "hello", bad);
    EXPECT_EQ(r.status, 400) << r.body.dump();
    EXPECT_EQ(r.body["error"]["code"], "unknown_prefill_peer");
    EXPECT_NE(r.body["error"]["message"].get<std::string>().find("\"" + bad + "\""), std::string::npos)
        << r.body.dump();
  }
  EXPECT_EQ(served(*p1_) + served(*p2_), 0);
}

// The router's path decides: "direct" computes a resident session's
// suffix here whatever its length, "disagg" sends even a one-token append
// to the named P; a path D does not know is a 400 naming the header.
TEST_F(PdManyPrefillTest, DecodeFollowsTheRoutersPath) {
  auto path = [&] { return lastTrace()["path"].get<std::string>(); };
  const std::string turn0 = "a conversation that stays resident on this decode agent.";
  ASSERT_EQ(complete(*d_, turn0, kvAddress(*p1_), "disagg", "s1").status, 200);
  EXPECT_EQ(path(), "disagg");
  // A long append (more than --direct-max-suffix, 256 tokens) the router judged direct.
  const std::string turn1 = turn0 + std::string(400, 'x');
  ASSERT_EQ(complete(*d_, turn1, "", "direct", "s1").status, 200);
  EXPECT_EQ(path(), "direct");
  EXPECT_EQ(served(*p1_) + served(*p2_), 1);
  // A one-character append the router sends to P.
  ASSERT_EQ(complete(*d_, turn1 + "y", kvAddress(*p2_), "disagg", "s1").status, 200);
  EXPECT_EQ(path(), "disagg");
  EXPECT_EQ(served(*p2_), 1);
  Reply bad = complete(*d_, "hello", "", "sideways");
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body["error"]["message"].get<std::string>().find("x-tandem-route-path"), std::string::npos)
      << bad.body.dump();
}

// The named P dies: each transfer to it fails at once (the connection is
// refused) and moves to the other P, not to D's own prefill, so every
// request is served; after `failures` of them the dead P is unhealthy and
// requests naming it go to the other P directly.
TEST_F(PdManyPrefillTest, RequestsNamingADeadPrefillAgentMoveToAHealthyOne) {
  ASSERT_EQ(complete(*d_, "warm up", kvAddress(*p1_)).status, 200);
  p1_->stop(SIGKILL);
  int requests = 0;
  do {
    Reply r = complete(*d_, "after the kill " + std::to_string(requests), kvAddress(*p1_));
    ASSERT_EQ(r.status, 200) << r.body.dump() << d_->log();
    EXPECT_EQ(lastTrace()["prefill_peer"], kvAddress(*p2_)) << lastTrace().dump();
    EXPECT_EQ(lastTrace()["path"], "disagg");
  } while (peerMetric(*d_, "tandem_kv_prefill_peer_healthy", *p1_) != 0 && ++requests < 10);
  EXPECT_EQ(peerMetric(*d_, "tandem_kv_prefill_peer_healthy", *p1_), 0);
  EXPECT_EQ(peerMetric(*d_, "tandem_kv_prefill_peer_healthy", *p2_), 1);
  EXPECT_EQ(served(*p2_), requests + 1);
  // Each request that went to the dead P first moved (one may have gone
  // straight to the other P if the heartbeats made the dead one suspect first).
  const double moved =
      testing::seriesValue(scrape(*d_), "tandem_kv_prefill_failovers_total", {"reason=\"disconnected\"", "to=\"peer\""});
  EXPECT_GE(moved, 1) << scrape(*d_);
  EXPECT_LE(moved, requests + 1);
  // Unhealthy now: the next request goes to the other P without a failure.
  ASSERT_EQ(complete(*d_, "once it is known dead", kvAddress(*p1_)).status, 200);
  EXPECT_EQ(lastTrace()["prefill_peer"], kvAddress(*p2_));
  EXPECT_TRUE(lastTrace()["moved_from_peer"].is_null()) << lastTrace().dump();
}

// Same salt: one block-hash root, the P/D path works. Another salt: P and
// D refuse each other (counted, named), and the request fails typed.
TEST(PdCacheSaltTest, SameSaltServesAnotherSaltIsRefused) {
  auto p = startPrefill({"--cache-salt", "tenant-a"});
  ASSERT_NE(p, nullptr);
  auto same = AgentProcess::start({"--role", "decode", "--kv-listen", "127.0.0.1:0", "--kv-tls", "tcp",
                                   "--prefill-peer", kvAddress(*p), "--cache-salt", "tenant-a"});
  ASSERT_NE(same, nullptr);
  Reply ok = complete(*same, "a prompt of tenant a");
  EXPECT_EQ(ok.status, 200) << ok.body.dump() << same->log();
  EXPECT_EQ(served(*p), 1);

  auto other = AgentProcess::start({"--role", "decode", "--kv-listen", "127.0.0.1:0", "--kv-tls", "tcp",
                                    "--prefill-peer", kvAddress(*p), "--cache-salt", "tenant-b"});
  ASSERT_NE(other, nullptr);
  Reply refused = complete(*other, "a prompt of tenant b");
  EXPECT_EQ(refused.status, 503) << refused.body.dump();
  EXPECT_EQ(refused.body["error"]["code"], "transfer_failed");
  EXPECT_NE(refused.body["error"]["message"].get<std::string>().find("another --cache-salt"), std::string::npos)
      << refused.body.dump();
  const std::string reason = "reason=\"hash_root_mismatch\"";
  EXPECT_TRUE(waitFor([&] {
    return metricValueWith(scrape(*p), "tandem_kv_control_messages_rejected_total", reason) == 1;
  })) << scrape(*p);
  EXPECT_EQ(metricValueWith(scrape(*other), "tandem_kv_control_messages_rejected_total", reason), 1);
  EXPECT_EQ(served(*p), 1) << "a refused peer's prompt was computed";
  EXPECT_EQ(other->stop(SIGTERM), 0) << other->log();
  EXPECT_EQ(same->stop(SIGTERM), 0) << same->log();
  EXPECT_EQ(p->stop(SIGTERM), 0) << p->log();
}

}  // namespace
}  // namespace tandem::agent
