// GET /internal/v1/events on real tandem-agent processes, read by
// WorkerStreamClient: the snapshot and deltas follow the engine's prefix
// cache and session residency, hashed exactly as a router hashes a prompt;
// a cut stream is resynced from one snapshot while the agent keeps serving;
// prefill and decode agents serve it too.

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>

#include "agent/worker_stream_client.h"
#include "src/common/block_hash.h"
#include "tests/agent/agent_process.h"
#include "tests/agent/worker_stream_recorder.h"
#include "tests/testing/quiet_logs.h"
#include "tests/testing/tcp_proxy.h"

namespace tandem::agent {
namespace {

using nlohmann::json;
using routing::WorkerDelta;
using testing::AgentProcess;
using testing::StreamRecorder;
using testutil::waitFor;

std::vector<TokenId> prompt(unsigned seed, int n) {
  std::mt19937 rng(seed);
  std::vector<TokenId> p(static_cast<size_t>(n));
  for (auto& t : p) t = static_cast<TokenId>(5 + rng() % 95);  // printable ASCII of the byte tokenizer
  return p;
}

// A completion of `tokens` (max_tokens output), optionally in a session; returns its output token count.
void complete(const AgentProcess& a, const std::vector<TokenId>& tokens, int max_tokens,
              const std::string& session = "") {
  http::ClientRequest r{.method = "POST", .url = a.url("/v1/completions")};
  r.headers["Content-Type"] = "application/json";
  if (!session.empty()) r.headers["x-session-id"] = session;
  r.body =
      json{{"model", "tiny"}, {"prompt", tokens}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}}
          .dump();
  auto resp = http::httpSend(r);
  ASSERT_TRUE(resp.ok()) << resp.status();
  ASSERT_EQ(resp->status, 200) << resp->body;
}

bool contains(const std::vector<BlockHash>& all, const std::vector<BlockHash>& some) {
  return std::all_of(some.begin(), some.end(),
                     [&](BlockHash h) { return std::find(all.begin(), all.end(), h) != all.end(); });
}

std::unique_ptr<WorkerStreamClient> subscribe(const std::string& url, StreamRecorder& recorder) {
  return WorkerStreamClient::start({.url = url}, recorder.callbacks());
}

// All the hashes stored so far, by the snapshot and the deltas after it.
std::vector<BlockHash> storedSoFar(const StreamRecorder& r) {
  std::vector<BlockHash> got = r.snapshots().empty() ? std::vector<BlockHash>{} : r.snapshots().back().cached;
  for (const WorkerDelta& d : r.deltas()) {
    if (auto* s = std::get_if<routing::BlocksStored>(&d.body))
      got.insert(got.end(), s->hashes.begin(), s->hashes.end());
  }
  return got;
}

// The snapshot holds the first prompt's blocks, a second prompt's arrive as
// deltas; both are the chain a router computes from the tokens at the root
// the snapshot names.
TEST(WorkerEventsProcessTest, SnapshotAndDeltasFollowThePrefixCache) {
  auto agent = AgentProcess::start({"--model-name", "tiny", "--worker", "w-both", "--num-blocks", "64"});
  ASSERT_NE(agent, nullptr);
  // The response may overtake the engine's report after the step; a first
  // subscriber waits until it has seen the blocks, so a snapshot taken
  // after that must hold them.
  StreamRecorder early;
  auto early_client = subscribe(agent->url(""), early);
  ASSERT_TRUE(early.waitForSnapshots(1));
  const std::vector<TokenId> first = prompt(1, 64);  // 4 full blocks of 16
  const std::vector<BlockHash> want_first = computeBlockHashes(first, 16, early.snapshots()[0].hash_root);
  ASSERT_EQ(want_first.size(), 4u);
  complete(*agent, first, 1);
  ASSERT_TRUE(waitFor([&] { return contains(storedSoFar(early), want_first); }));

  StreamRecorder recorder;
  auto client = subscribe(agent->url(""), recorder);
  ASSERT_TRUE(recorder.waitForSnapshots(1));
  const routing::WorkerSnapshot snap = recorder.snapshots()[0];
  EXPECT_EQ(snap.worker, "w-both");
  EXPECT_EQ(snap.role, routing::WorkerRole::kBoth);
  EXPECT_EQ(snap.block_size, 16);
  EXPECT_EQ(snap.load.total_blocks, 64);
  EXPECT_FALSE(snap.load.draining);
  EXPECT_TRUE(contains(snap.cached, computeBlockHashes(first, 16, snap.hash_root)));

  const std::vector<TokenId> second = prompt(2, 48);
  complete(*agent, second, 1);
  const std::vector<BlockHash> want_second = computeBlockHashes(second, 16, snap.hash_root);
  ASSERT_TRUE(waitFor([&] { return contains(storedSoFar(recorder), want_second); }));
  // Deltas follow the snapshot without a gap.
  const auto deltas = recorder.deltas();
  for (size_t i = 0; i < deltas.size(); ++i) EXPECT_EQ(deltas[i].seq, snap.seq + 1 + i);
  EXPECT_EQ(recorder.numSnapshots(), 1u);
}

// A finished turn's session appears resident with its full blocks' hashes,
// and goes away when a request that needs the whole pool evicts it.
TEST(WorkerEventsProcessTest, SessionResidencyAppearsAndGoesAwayWhenEvicted) {
  auto agent = AgentProcess::start({"--model-name", "tiny", "--num-blocks", "12"});  // 192 tokens
  ASSERT_NE(agent, nullptr);
  StreamRecorder recorder;
  auto client = subscribe(agent->url(""), recorder);
  ASSERT_TRUE(recorder.waitForSnapshots(1));
  EXPECT_TRUE(recorder.snapshots()[0].sessions.empty());

  const std::vector<TokenId> turn = prompt(3, 40);
  complete(*agent, turn, 4, "s1");  // 43 tokens resident: 2 full blocks
  ASSERT_TRUE(recorder.waitForDelta(
      [](const WorkerDelta& d) { return std::holds_alternative<routing::SessionStored>(d.body); }));
  routing::ResidentSessionBlocks resident;
  for (const WorkerDelta& d : recorder.deltas()) {
    if (auto* s = std::get_if<routing::SessionStored>(&d.body)) resident = s->state;
  }
  EXPECT_EQ(resident.session, SessionId("s1"));
  EXPECT_EQ(resident.num_tokens, 43);
  EXPECT_EQ(resident.hashes, computeBlockHashes(turn, 16, recorder.snapshots()[0].hash_root));

  // A second subscriber's snapshot shows it resident.
  StreamRecorder late;
  auto late_client = subscribe(agent->url(""), late);
  ASSERT_TRUE(late.waitForSnapshots(1));
  ASSERT_EQ(late.snapshots()[0].sessions.size(), 1u);
  EXPECT_EQ(late.snapshots()[0].sessions[0].hashes, resident.hashes);

  complete(*agent, prompt(4, 150), 30);  // 180 tokens reserve all 12 blocks
  ASSERT_TRUE(recorder.waitForDelta([](const WorkerDelta& d) {
    auto* r = std::get_if<routing::SessionRemoved>(&d.body);
    return r != nullptr && r->session == SessionId("s1");
  }));
}

// The stream is cut between worker and router (a proxy closes the
// connection): the client says stale, reconnects, and takes exactly one new
// snapshot, which holds what happened meanwhile; the agent served all along.
TEST(WorkerEventsProcessTest, CutStreamIsResyncedFromOneSnapshot) {
  auto agent = AgentProcess::start({"--model-name", "tiny", "--num-blocks", "64"});
  ASSERT_NE(agent, nullptr);
  const int port = std::stoi(agent->url("").substr(agent->url("").rfind(':') + 1));
  testutil::TcpProxy proxy(port);
  StreamRecorder recorder;
  auto client = subscribe("http://127.0.0.1:" + std::to_string(proxy.port()), recorder);
  ASSERT_TRUE(recorder.waitForSnapshots(1));

  proxy.cutAll();
  const std::vector<TokenId> meanwhile = prompt(5, 32);
  complete(*agent, meanwhile, 1);  // the agent serves whatever happens to the stream
  ASSERT_TRUE(recorder.waitForSnapshots(2));
  ASSERT_TRUE(waitFor([&] { return recorder.stale().size() == 2; }));
  EXPECT_EQ(recorder.stale(), (std::vector<bool>{true, false}));
  EXPECT_EQ(proxy.numAccepted(), 2);
  const routing::WorkerSnapshot resynced = recorder.snapshots()[1];
  EXPECT_EQ(resynced.epoch, recorder.snapshots()[0].epoch);  // same worker, same epoch
  // Whatever the old stream did not carry, the new snapshot holds.
  const std::vector<BlockHash> want = computeBlockHashes(meanwhile, 16, resynced.hash_root);
  if (!contains(resynced.cached, want)) {
    ASSERT_TRUE(recorder.waitForDelta([&](const WorkerDelta& d) {
      auto* s = std::get_if<routing::BlocksStored>(&d.body);
      return d.seq > resynced.seq && s != nullptr && contains(s->hashes, want);
    }));
  }
  EXPECT_EQ(recorder.numSnapshots(), 2u);
}

// Prefill and decode agents serve the stream too: P's holds the prompt
// blocks it computed for D.
TEST(WorkerEventsProcessTest, PrefillAndDecodeAgentsServeTheStream) {
  auto prefill = AgentProcess::start({"--model-name", "tiny", "--role", "prefill", "--kv-listen", "127.0.0.1:0",
                                      "--kv-tls", "tcp", "--num-blocks", "64"});
  ASSERT_NE(prefill, nullptr);
  auto decode =
      AgentProcess::start({"--model-name", "tiny", "--role", "decode", "--kv-listen", "127.0.0.1:0", "--kv-tls", "tcp",
                           "--num-blocks", "64", "--prefill-peer", "127.0.0.1:" + std::to_string(prefill->kvPort())});
  ASSERT_NE(decode, nullptr);
  StreamRecorder p, d;
  auto pc = subscribe(prefill->url(""), p);
  auto dc = subscribe(decode->url(""), d);
  ASSERT_TRUE(p.waitForSnapshots(1));
  ASSERT_TRUE(d.waitForSnapshots(1));
  EXPECT_EQ(p.snapshots()[0].role, routing::WorkerRole::kPrefill);
  EXPECT_EQ(d.snapshots()[0].role, routing::WorkerRole::kDecode);
  EXPECT_NE(p.snapshots()[0].epoch, d.snapshots()[0].epoch);

  const std::vector<TokenId> tokens = prompt(6, 64);
  complete(*decode, tokens, 2);
  const std::vector<BlockHash> want = computeBlockHashes(tokens, 16, p.snapshots()[0].hash_root);
  ASSERT_TRUE(p.waitForDelta([&](const WorkerDelta& delta) {
    auto* s = std::get_if<routing::BlocksStored>(&delta.body);
    return s != nullptr && contains(s->hashes, want);
  }));
}

// SIGTERM: subscribers hear that the worker drains, and then their streams
// end, so an open stream does not hold the drain for its whole grace period
// (120 s here, beyond the 60 s the helper waits before SIGKILL).
TEST(WorkerEventsProcessTest, DrainIsAnnouncedAndEndsTheStreams) {
  auto agent = AgentProcess::start({"--model-name", "tiny", "--drain-grace", "120s"});
  ASSERT_NE(agent, nullptr);
  StreamRecorder recorder;
  auto client = subscribe(agent->url(""), recorder);
  ASSERT_TRUE(recorder.waitForSnapshots(1));
  EXPECT_EQ(agent->stop(SIGTERM), 0);
  ASSERT_TRUE(recorder.waitForDelta([](const WorkerDelta& d) {
    auto* l = std::get_if<routing::WorkerLoad>(&d.body);
    return l != nullptr && l->draining;
  }));
}

}  // namespace
}  // namespace tandem::agent
