// A prefill agent that stalls (SIGSTOP: a hung transfer engine looks the
// same from outside), or that accepts a request and never delivers it while
// it still answers heartbeats (a fault hook behind the transport seam:
// tandem-agent-faults), real processes on loopback (docs/pd.md "Liveness"):
// D's heartbeats go unanswered, the peer becomes suspect within seconds,
// and the requests it has not accepted move to the other P or, with none,
// are computed by D itself. Nobody waits out the 60 s prefill deadline.
// After SIGCONT the P answers and gets work again, and neither side keeps
// blocks or leases. The exact detection times are peer_health_test's job
// (fake clock); here the bounds are loose so a loaded machine cannot
// flake them.

#include <signal.h>

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/http/client.h"
#include "tests/agent/agent_process.h"

namespace tandem::agent {
namespace {

using nlohmann::json;
using testing::AgentProcess;
using testing::metricValue;
using testing::metricValueWith;
using testing::scrape;
using testing::seriesValue;
using testing::waitFor;

// Well below the 60 s prefill deadline, far above the ~2 s detection.
constexpr auto kBound = std::chrono::seconds(15);
// The work-proportional prefill deadline's floor for the tests of a stopped
// P: its 2 s default races the ~2 s heartbeat detection on a loaded machine
// (requests then move for reason "deadline", not "suspect"); the deadline
// has its own test below.
constexpr const char* kSuspectWins = "12s";

// `faults`: the agent's fault-injecting test build with these --fault-* flags.
std::unique_ptr<AgentProcess> startPrefill(std::vector<std::string> faults = {}) {
  std::vector<std::string> args{"--role", "prefill", "--kv-listen", "127.0.0.1:0", "--kv-tls", "tcp", "--lease-ttl", "3s"};
  if (faults.empty()) return AgentProcess::start(args);
  args.insert(args.end(), faults.begin(), faults.end());
  return AgentProcess::start(args, TANDEM_FAULT_AGENT);
}

std::string kvAddress(const AgentProcess& p) { return "127.0.0.1:" + std::to_string(p.kvPort()); }

struct Reply {
  int status = -1;
  json body;
  std::chrono::steady_clock::duration took{};
};

Reply complete(const AgentProcess& d, const std::string& prompt, const std::string& peer = "") {
  http::ClientRequest req{.method = "POST", .url = d.url("/v1/completions")};
  req.headers["Content-Type"] = "application/json";
  if (!peer.empty()) req.headers["x-tandem-prefill-peer"] = peer;
  req.body =
      json{{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}, {"ignore_eos", true}}.dump();
  req.timeout = std::chrono::seconds(90);
  const auto start = std::chrono::steady_clock::now();
  auto r = http::httpSend(req);
  Reply out;
  out.took = std::chrono::steady_clock::now() - start;
  if (!r.ok()) {
    ADD_FAILURE() << r.status();
    return out;
  }
  out.status = r->status;
  out.body = json::parse(r->body, nullptr, false);
  return out;
}

std::vector<json> traces(const AgentProcess& d) {
  std::vector<json> out;
  std::istringstream in(d.trace());
  std::string line;
  while (std::getline(in, line)) out.push_back(json::parse(line, nullptr, false));
  return out;
}

// The trace line of the request `r` answered. The agent writes it after the
// reply has gone out, so it may lag the reply on a loaded machine: wait for it.
json traceOf(const AgentProcess& d, const Reply& r) {
  const json id = r.body.is_object() ? r.body.value("id", json()) : json();
  json found;
  const bool seen = waitFor([&] {
    for (const json& t : traces(d)) {
      if (t.is_object() && !id.is_null() && t.value("request_id", json()) == id) {
        found = t;
        return true;
      }
    }
    return false;
  });
  if (!seen) ADD_FAILURE() << "no trace line for request " << id.dump() << " in " << d.trace();
  return found;
}

// Every trace line once there are at least `n`.
std::vector<json> tracesOnce(const AgentProcess& d, size_t n) {
  EXPECT_TRUE(waitFor([&] { return traces(d).size() >= n; })) << d.trace();
  return traces(d);
}

double peerState(const AgentProcess& d, const AgentProcess& p, const std::string& state) {
  return seriesValue(scrape(d), "tandem_kv_prefill_peer_state",
                     {"peer=\"" + kvAddress(p) + "\"", "state=\"" + state + "\""});
}

double prefillsServed(const AgentProcess& p) {
  return metricValueWith(scrape(p), "tandem_request_path_total", "path=\"disagg\"");
}

// Nothing pinned or held once the requests are over: every KV block free.
void expectNoBlocksHeld(const AgentProcess& a) {
  EXPECT_TRUE(waitFor([&] {
    const std::string m = scrape(a);
    return metricValue(m, "tandem_kv_blocks_free{") == metricValue(m, "tandem_kv_blocks_capacity{");
  })) << scrape(a);
}

class PdLivenessTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (auto* a : {&d_, &p1_, &p2_}) {
      if (*a && (*a)->pid() > 0) {
        kill((*a)->pid(), SIGCONT);
        EXPECT_EQ((*a)->stop(SIGTERM), 0) << (*a)->log();
      }
    }
  }
  std::unique_ptr<AgentProcess> p1_, p2_, d_;
};

// Two P; the one the requests name is stopped: they are served through the
// other, each well within the bound; D's trace says where they moved from.
TEST_F(PdLivenessTest, RequestsForAStoppedPrefillAgentMoveToTheOther) {
  p1_ = startPrefill();
  p2_ = startPrefill();
  ASSERT_TRUE(p1_ && p2_);
  d_ = AgentProcess::start({"--role", "decode", "--kv-listen", "127.0.0.1:0", "--kv-tls", "tcp", "--prefill-peers",
                            kvAddress(*p1_) + "," + kvAddress(*p2_), "--prefill-deadline-floor", kSuspectWins});
  ASSERT_NE(d_, nullptr);
  ASSERT_EQ(complete(*d_, "warm up", kvAddress(*p1_)).status, 200);
  ASSERT_EQ(prefillsServed(*p1_), 1);

  ASSERT_EQ(kill(p1_->pid(), SIGSTOP), 0);
  std::vector<std::future<Reply>> concurrent;
  for (int i = 0; i < 3; ++i) {
    concurrent.push_back(std::async(std::launch::async, [&, i] {
      return complete(*d_, "concurrent request " + std::to_string(i), kvAddress(*p1_));
    }));
  }
  for (auto& f : concurrent) {
    Reply r = f.get();
    EXPECT_EQ(r.status, 200) << r.body.dump() << d_->log();
    EXPECT_LT(r.took, kBound);
  }
  Reply after = complete(*d_, "a request after the peer became suspect", kvAddress(*p1_));
  EXPECT_EQ(after.status, 200) << after.body.dump();
  EXPECT_LT(after.took, kBound);
  EXPECT_EQ(peerState(*d_, *p1_, "suspect"), 1) << scrape(*d_);
  EXPECT_EQ(peerState(*d_, *p2_, "healthy"), 1);
  EXPECT_EQ(prefillsServed(*p2_), 4);
  int moved = 0;
  for (const json& t : tracesOnce(*d_, 5)) {  // warm up, 3 concurrent, after
    if (t["moved_from_peer"] == kvAddress(*p1_)) {
      ++moved;
      EXPECT_EQ(t["prefill_peer"], kvAddress(*p2_)) << t.dump();
    }
  }
  EXPECT_GE(moved, 1) << d_->trace();
  EXPECT_EQ(seriesValue(scrape(*d_), "tandem_kv_prefill_failovers_total", {"reason=\"suspect\"", "to=\"peer\""}),
            moved);

  // Back: it answers, is healthy again and gets the requests that name it.
  ASSERT_EQ(kill(p1_->pid(), SIGCONT), 0);
  EXPECT_TRUE(waitFor([&] { return peerState(*d_, *p1_, "healthy") == 1; })) << scrape(*d_);
  const double before = prefillsServed(*p1_);
  ASSERT_EQ(complete(*d_, "after SIGCONT", kvAddress(*p1_)).status, 200);
  EXPECT_GE(prefillsServed(*p1_), before + 1);
  EXPECT_GT(metricValue(scrape(*d_), "tandem_kv_heartbeat_rtt_seconds_count{"), 0);
  for (const AgentProcess* a : {d_.get(), p1_.get(), p2_.get()}) expectNoBlocksHeld(*a);
  EXPECT_TRUE(waitFor([&] { return metricValue(scrape(*p1_), "tandem_kv_leases_active{") == 0; }));
}

// One P, stopped: D computes the prompts itself (path "fallback") rather
// than wait for it.
TEST_F(PdLivenessTest, WithTheOnlyPrefillAgentStoppedDecodeComputesThePromptItself) {
  p1_ = startPrefill();
  ASSERT_TRUE(p1_);
  d_ = AgentProcess::start({"--role", "decode", "--kv-listen", "127.0.0.1:0", "--kv-tls", "tcp", "--prefill-peer",
                            kvAddress(*p1_), "--prefill-deadline-floor", kSuspectWins});
  ASSERT_NE(d_, nullptr);
  const Reply reference = complete(*d_, "the same prompt both ways");
  ASSERT_EQ(reference.status, 200);
  ASSERT_EQ(kill(p1_->pid(), SIGSTOP), 0);
  for (int i = 0; i < 3; ++i) {
    Reply r = complete(*d_, i == 0 ? "the same prompt both ways" : "stalled peer " + std::to_string(i));
    EXPECT_EQ(r.status, 200) << r.body.dump() << d_->log();
    EXPECT_LT(r.took, kBound);
    if (i == 0) {
      EXPECT_EQ(r.body["choices"][0]["text"], reference.body["choices"][0]["text"]);
    }
    const json t = traceOf(*d_, r);
    EXPECT_EQ(t["path"], "fallback") << t.dump();
  }
  EXPECT_GE(seriesValue(scrape(*d_), "tandem_kv_prefill_failovers_total", {"reason=\"suspect\"", "to=\"local\""}), 1);
  ASSERT_EQ(kill(p1_->pid(), SIGCONT), 0);
  EXPECT_TRUE(waitFor([&] { return peerState(*d_, *p1_, "healthy") == 1; })) << scrape(*d_);
  const Reply back = complete(*d_, "after SIGCONT");
  ASSERT_EQ(back.status, 200);
  EXPECT_EQ(traceOf(*d_, back)["path"], "disagg");
  expectNoBlocksHeld(*d_);
  expectNoBlocksHeld(*p1_);
}

// P accepts the first request and never delivers it, yet answers every
// heartbeat: D gives up at the work-proportional deadline (the floor, for
// this short prompt), not the 60 s ceiling, and moves the request to the
// other P. One missed deadline does not make the P unhealthy: it serves the
// next request. Nothing stays pinned on either P.
TEST_F(PdLivenessTest, AnAcceptedPrefillThatNeverFinishesMovesAtItsDeadline) {
  p1_ = startPrefill({"--fault-stall-first-transfers", "1"});
  p2_ = startPrefill();
  ASSERT_TRUE(p1_ && p2_);
  d_ = AgentProcess::start({"--role", "decode", "--kv-listen", "127.0.0.1:0", "--kv-tls", "tcp", "--prefill-peers",
                            kvAddress(*p1_) + "," + kvAddress(*p2_), "--prefill-deadline-floor", "1500ms"});
  ASSERT_NE(d_, nullptr);
  const Reply r = complete(*d_, "a prompt the first prefill agent sits on", kvAddress(*p1_));
  EXPECT_EQ(r.status, 200) << r.body.dump() << d_->log();
  EXPECT_GE(r.took, std::chrono::milliseconds(1500));
  EXPECT_LT(r.took, kBound);
  const json t = traceOf(*d_, r);
  EXPECT_EQ(t["moved_from_peer"], kvAddress(*p1_)) << t.dump();
  EXPECT_EQ(t["prefill_peer"], kvAddress(*p2_)) << t.dump();
  EXPECT_EQ(t["path"], "disagg");
  const std::string m = scrape(*d_);
  EXPECT_EQ(seriesValue(m, "tandem_kv_prefill_failovers_total", {"reason=\"deadline\"", "to=\"peer\""}), 1) << m;
  EXPECT_EQ(metricValueWith(m, "tandem_kv_transfer_failures_total", "reason=\"prefill_timeout\""), 1);
  EXPECT_EQ(peerState(*d_, *p1_, "healthy"), 1);

  const double before = prefillsServed(*p1_);
  const Reply next = complete(*d_, "the next request", kvAddress(*p1_));
  EXPECT_EQ(next.status, 200) << next.body.dump();
  EXPECT_EQ(traceOf(*d_, next)["prefill_peer"], kvAddress(*p1_));
  EXPECT_GE(prefillsServed(*p1_), before + 1);
  for (const AgentProcess* a : {d_.get(), p1_.get(), p2_.get()}) expectNoBlocksHeld(*a);
  EXPECT_TRUE(waitFor([&] { return metricValue(scrape(*p1_), "tandem_kv_leases_active{") == 0; }));
}

}  // namespace
}  // namespace tandem::agent
