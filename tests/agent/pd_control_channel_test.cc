// Bad input on the P/D control channel, against real agent processes: a raw
// kvproto peer in this process (a real UcxTransport over tcp) plays D
// towards a prefill agent and P towards a decode agent, and sends what a
// broken or hostile peer could: truncated messages, a wrong version,
// oversized lengths, out-of-range blocks and layers, unknown transfer ids,
// messages the role does not take, an Abort that overtakes its request.
// Each must be refused and counted in
// tandem_kv_control_messages_rejected_total{reason}; the agent keeps
// serving correctly and leaks nothing.

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <map>
#include <set>
#include <thread>

#include "agent/transport/ucx_transport.h"
#include "engine/model/weights.h"
#include "src/common/block_hash.h"
#include "src/http/client.h"
#include "src/auth/kv_handshake.h"
#include "src/kvproto/kvproto.h"
#include "tests/agent/agent_process.h"

namespace tandem::agent {
namespace {

using nlohmann::json;
using testing::AgentProcess;
using testing::metricValue;
using testing::metricValueWith;
using testing::scrape;
using testing::waitFor;
using transport::ConnId;

constexpr int kBlocks = 64;
// The agents here run with this pinned fingerprint (and no salt), so the raw
// peer's Hello names the same model.
constexpr uint64_t kFingerprint = 0x7e57ab1e00c0ffeeULL;
constexpr const char* kFingerprintFlag = "7e57ab1e00c0ffee";
std::vector<std::string> identityFlags() { return {"--model-fingerprint", kFingerprintFlag}; }
constexpr int kBlockSize = 16;  // the agent's default

const engine::ModelConfig& tiny() {
  static const engine::ModelConfig c = engine::tinyModelConfig();
  return c;
}
uint64_t bytesPerLayerBlock() {
  return static_cast<uint64_t>(kBlockSize) * static_cast<uint64_t>(tiny().num_kv_heads) * static_cast<uint64_t>(tiny().head_dim) * 2 *
         sizeof(float);
}

// A kvproto peer with its own registered memory; received messages are
// decoded (they come from our agents, which encode correctly) and queued.
// It holds `keys` (insecure: the agents' default) and, as an acceptor,
// answers a handshake as a prefill agent does (the handshake's messages are
// not queued); as a connector it authenticates when told (authenticate()).
struct RawPeer {
  std::vector<std::byte> memory;
  std::shared_ptr<const auth::PoolKeys> keys;
  std::unique_ptr<transport::UcxTransport> t;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<ConnId, kvproto::Message>> inbox;  // guarded by mu
  std::map<ConnId, auth::KvAuthAcceptor> acceptors;        // guarded by mu
  std::set<ConnId> authenticated;                          // guarded by mu: connections whose connector proved the key
  std::atomic<bool> answer_handshakes{true};               // false: an AuthHello is queued like any message

  explicit RawPeer(std::shared_ptr<const auth::PoolKeys> k = auth::PoolKeys::insecure())
      : memory(static_cast<size_t>(kBlocks) * static_cast<size_t>(tiny().num_layers) * bytesPerLayerBlock()),
        keys(std::move(k)) {
    transport::TransportOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.tls = "tcp";
    o.region = memory;
    transport::TransportCallbacks cb;
    cb.on_message = [this](ConnId c, std::vector<uint8_t> bytes) {
      auto m = kvproto::decode(bytes);
      ASSERT_TRUE(m.ok()) << "an agent sent a message that does not decode: " << m.status();
      std::lock_guard l(mu);
      if (auto* h = std::get_if<kvproto::AuthHello>(&m->body); h && answer_handshakes) {
        auto [it, fresh] = acceptors.try_emplace(c, keys, auth::KvIdentity{kvproto::PeerRole::kPrefill, "raw-test-peer"});
        auto r = it->second.onHello(*h);
        if (auto* f = std::get_if<auth::AuthFailure>(&r)) {
          send(c, 0, kvproto::Abort{kvproto::FailureReason::kTransferFailed, "authentication failed: " + f->message});
        } else {
          send(c, 0, std::get<kvproto::AuthChallenge>(r));
        }
        return;
      }
      if (auto* proof = std::get_if<kvproto::AuthProof>(&m->body)) {
        auto it = acceptors.find(c);
        if (it != acceptors.end() && !it->second.onProof(*proof)) authenticated.insert(c);
        return;
      }
      inbox.emplace_back(c, std::move(*m));
      cv.notify_all();
    };
    auto started = transport::UcxTransport::start(o, std::move(cb));
    EXPECT_TRUE(started.ok()) << started.status();
    if (started.ok()) t = std::move(*started);
  }

  ~RawPeer() { t.reset(); }  // no callback may run once the members below it are gone

  kvproto::Hello hello(kvproto::PeerRole role) const {
    return {.model_fingerprint = kFingerprint,
            .hash_root = blockHashRoot(kFingerprint, "").value(),
            .role = role,
            .num_layers = static_cast<uint16_t>(tiny().num_layers),
            .num_blocks = kBlocks,
            .block_size = kBlockSize,
            .num_kv_heads = static_cast<uint16_t>(tiny().num_kv_heads),
            .head_dim = static_cast<uint16_t>(tiny().head_dim),
            .dtype = kvproto::KvDtype::kFloat32,
            .region_base = t->regionBase(),
            .rkey = t->packedRkey(),
            .peer_name = "raw-test-peer"};
  }

  void send(ConnId c, uint64_t tid, kvproto::Body body) { t->send(c, kvproto::encode({tid, std::move(body)})); }

  // The next message whose type is `type` (others stay queued); nullopt after `wait`.
  std::optional<std::pair<ConnId, kvproto::Message>> next(kvproto::MessageType type,
                                                          std::chrono::seconds wait = std::chrono::seconds(30)) {
    std::unique_lock l(mu);
    std::optional<std::pair<ConnId, kvproto::Message>> found;
    cv.wait_for(l, wait, [&] {
      for (auto it = inbox.begin(); it != inbox.end(); ++it) {
        if (kvproto::typeOf(it->second.body) == type) {
          found = std::move(*it);
          inbox.erase(it);
          return true;
        }
      }
      return false;
    });
    return found;
  }

  // Runs the connector's side of the handshake on `c` as a decode agent
  // (or `role`): the failure the peer answered with (its Abort's message, or
  // this side's own check of its challenge), nothing when authenticated.
  std::optional<std::string> authenticate(ConnId c, kvproto::PeerRole role = kvproto::PeerRole::kDecode) {
    auto connector = auth::KvAuthConnector::start(keys, {role, "raw-test-peer"});
    if (!connector.ok()) return std::string(connector.status().message());
    send(c, 0, connector->hello());
    return finishAuthentication(c, *connector);
  }
  std::optional<std::string> finishAuthentication(ConnId c, auth::KvAuthConnector& connector) {
    for (int i = 0; i < 300; ++i) {
      if (auto challenge = next(kvproto::MessageType::kAuthChallenge, std::chrono::seconds(0))) {
        auto r = connector.onChallenge(std::get<kvproto::AuthChallenge>(challenge->second.body));
        if (auto* f = std::get_if<auth::AuthFailure>(&r)) return f->message;
        send(c, 0, std::get<kvproto::AuthProof>(r));
        return std::nullopt;
      }
      if (auto abort = next(kvproto::MessageType::kAbort, std::chrono::seconds(0))) {
        return std::get<kvproto::Abort>(abort->second.body).message;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return "no answer to the AuthHello";
  }

  // Every queued message for transfer `tid`, removed from the queue.
  std::vector<kvproto::Message> takeFor(uint64_t tid) {
    std::lock_guard l(mu);
    std::vector<kvproto::Message> out;
    for (auto it = inbox.begin(); it != inbox.end();) {
      if (it->second.transfer_id == tid) {
        out.push_back(std::move(it->second));
        it = inbox.erase(it);
      } else {
        ++it;
      }
    }
    return out;
  }
};

// Wire-level damage to a well-formed message.
std::vector<uint8_t> truncated(std::vector<uint8_t> wire) {
  wire.resize(wire.size() - 3);
  return wire;
}
std::vector<uint8_t> wrongVersion(std::vector<uint8_t> wire) {
  wire[4] = 9;  // version, offset 4 (kvproto.h)
  return wire;
}
// A PrefillRequest whose token list claims 2^31 entries.
std::vector<uint8_t> oversizedTokenList(uint64_t tid) {
  std::vector<uint8_t> wire = kvproto::encode({tid, kvproto::PrefillRequest{.tokens = {}}});
  const uint32_t huge = 0x80000000u;
  std::memcpy(wire.data() + kvproto::kHeaderSize + 8, &huge, sizeof(huge));  // after deadline_ms, lease_ms
  return wire;
}

double rejected(const AgentProcess& a, const std::string& reason) {
  return metricValueWith(scrape(a), "tandem_kv_control_messages_rejected_total", "reason=\"" + reason + "\"");
}
double authFailures(const AgentProcess& a, const std::string& reason) {
  return metricValueWith(scrape(a), "tandem_kv_auth_failures_total", "reason=\"" + reason + "\"");
}

std::vector<uint32_t> promptTokens(int n) {
  std::vector<uint32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<uint32_t>(5 + (i * 7) % 90));
  return t;
}

// A prefill agent over tcp with `blocks` KV blocks.
std::unique_ptr<AgentProcess> startPrefill(int blocks, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--role", "prefill", "--kv-listen", "127.0.0.1:0", "--kv-tls", "tcp", "--num-blocks",
                                   std::to_string(blocks)};
  for (const auto& v : {identityFlags(), extra}) args.insert(args.end(), v.begin(), v.end());
  return AgentProcess::start(args);
}

// A decode agent over tcp whose prefill peer is `fake_p`.
std::unique_ptr<AgentProcess> startDecode(const RawPeer& fake_p, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--role", "decode", "--kv-listen", "127.0.0.1:0", "--kv-tls", "tcp", "--num-blocks",
                                   std::to_string(kBlocks), "--prefill-peer", "127.0.0.1:" + std::to_string(fake_p.t->port())};
  for (const auto& v : {identityFlags(), extra}) args.insert(args.end(), v.begin(), v.end());
  return AgentProcess::start(args);
}

// `d` connects to the prefill agent at `port` as a decode agent would:
// the handshake, then Hello both ways. Returns the connection and P's Hello (nullopt: no Hello).
std::optional<std::pair<ConnId, kvproto::Hello>> connectAsDecode(RawPeer& d, int port) {
  const ConnId c = d.t->connect("127.0.0.1", port);
  if (auto failed = d.authenticate(c)) {
    ADD_FAILURE() << "the handshake failed: " << *failed;
    return std::nullopt;
  }
  d.send(c, 0, d.hello(kvproto::PeerRole::kDecode));
  auto hello = d.next(kvproto::MessageType::kHello);
  if (!hello) return std::nullopt;
  return std::make_pair(c, std::get<kvproto::Hello>(hello->second.body));
}

TEST(PdControlChannelTest, PrefillAgentRefusesBadMessagesAndKeepsServing) {
  auto p = startPrefill(kBlocks);
  ASSERT_NE(p, nullptr);
  RawPeer d;
  ASSERT_NE(d.t, nullptr);
  auto connected = connectAsDecode(d, p->kvPort());
  ASSERT_TRUE(connected);
  const auto& [c, ph] = *connected;
  ASSERT_EQ(ph.num_blocks, static_cast<uint32_t>(kBlocks));
  d.t->setRemoteRegion(c, ph.region_base, static_cast<uint64_t>(ph.num_blocks) * ph.num_layers * bytesPerLayerBlock(), ph.rkey);

  // Malformed: refused by the decoder.
  const std::vector<uint8_t> request = kvproto::encode({10, kvproto::PrefillRequest{.tokens = promptTokens(20)}});
  d.t->send(c, truncated(request));
  d.t->send(c, wrongVersion(request));
  d.t->send(c, oversizedTokenList(10));
  d.send(c, 10, kvproto::PrefillAccepted{.block_ids = {static_cast<uint32_t>(kBlocks)}});  // block id out of P's range
  // Well-formed but not for a prefill agent.
  d.send(c, 10, kvproto::PrefillAccepted{.block_ids = {1}});
  d.send(c, 10, kvproto::LayerReady{.layer = 0, .first_block = 0, .checksums = {1}});
  // A transfer P never saw.
  d.send(c, 777, kvproto::Release{});
  // An Abort that overtook its PrefillRequest: the request must not be computed.
  d.send(c, 12, kvproto::Abort{.reason = kvproto::FailureReason::kCancelled, .message = "client went away"});
  d.send(c, 12, kvproto::PrefillRequest{.tokens = promptTokens(30)});
  // Tokens outside the vocabulary: a typed Abort, nothing computed.
  d.send(c, 11, kvproto::PrefillRequest{.tokens = {5, 999999}});
  auto abort = d.next(kvproto::MessageType::kAbort);
  ASSERT_TRUE(abort);
  EXPECT_EQ(abort->second.transfer_id, 11u);
  EXPECT_EQ(std::get<kvproto::Abort>(abort->second.body).reason, kvproto::FailureReason::kTransferFailed);

  EXPECT_TRUE(waitFor([&] { return rejected(*p, "malformed") == 4; })) << scrape(*p);
  EXPECT_EQ(rejected(*p, "unexpected_type"), 2);
  EXPECT_EQ(rejected(*p, "unknown_transfer"), 2);  // the Release, and the early Abort
  EXPECT_EQ(rejected(*p, "after_end"), 1);

  // A good request on the same connection still works end to end: every
  // announced layer block is pulled and matches P's checksum.
  const std::vector<uint32_t> prompt = promptTokens(40);
  d.send(c, 13, kvproto::PrefillRequest{.tokens = prompt, .temperature = 0});
  auto done = d.next(kvproto::MessageType::kPrefillDone);
  ASSERT_TRUE(done) << p->log();
  ASSERT_EQ(done->second.transfer_id, 13u);
  std::vector<uint32_t> blocks;
  size_t announced = 0;
  for (const kvproto::Message& m : d.takeFor(13)) {
    if (auto* a = std::get_if<kvproto::PrefillAccepted>(&m.body)) blocks = a->block_ids;
    const auto* l = std::get_if<kvproto::LayerReady>(&m.body);
    if (l == nullptr) continue;
    ASSERT_FALSE(blocks.empty()) << "a layer was announced before the request was accepted";
    for (size_t i = 0; i < l->checksums.size(); ++i) {
      const uint64_t offset = (static_cast<uint64_t>(l->layer) * kBlocks + blocks[l->first_block + i]) * bytesPerLayerBlock();
      std::promise<absl::Status> got;
      d.t->get(c, d.memory.data(), offset, bytesPerLayerBlock(), [&](absl::Status s) { got.set_value(s); });
      ASSERT_TRUE(got.get_future().get().ok());
      EXPECT_EQ(kvproto::layerBlockChecksum(std::span<const std::byte>(d.memory.data(), bytesPerLayerBlock())), l->checksums[i]);
      ++announced;
    }
  }
  EXPECT_EQ(blocks.size(), (prompt.size() + kBlockSize - 1) / kBlockSize);
  EXPECT_EQ(announced, blocks.size() * static_cast<size_t>(tiny().num_layers));
  EXPECT_TRUE(d.takeFor(12).empty()) << "the prefill agent answered a request whose Abort came first";
  d.send(c, 13, kvproto::Release{});
  EXPECT_TRUE(waitFor([&] { return metricValue(scrape(*p), "tandem_kv_leases_active{") == 0; }));
  EXPECT_TRUE(waitFor([&] { return metricValue(scrape(*p), "tandem_kv_blocks_free{") == kBlocks; }));
  d.t->close(c);
  EXPECT_EQ(p->stop(SIGTERM), 0) << p->log();
}

// D aborts while P is still computing the prompt: P stops, keeps nothing,
// and still accounts the prefill (its request metrics and trace).
TEST(PdControlChannelTest, AbortDuringThePrefillStopsItAndItIsAccounted) {
  constexpr int kManyBlocks = 512;
  auto p = startPrefill(kManyBlocks);
  ASSERT_NE(p, nullptr);
  RawPeer d;
  ASSERT_NE(d.t, nullptr);
  auto connected = connectAsDecode(d, p->kvPort());
  ASSERT_TRUE(connected);
  const ConnId c = connected->first;
  // ~8K tokens: P computes for a while after accepting (16 chunks of 512).
  d.send(c, 30, kvproto::PrefillRequest{.tokens = promptTokens(8000)});
  auto accepted = d.next(kvproto::MessageType::kPrefillAccepted);
  ASSERT_TRUE(accepted);
  d.send(c, 30, kvproto::Abort{.reason = kvproto::FailureReason::kCancelled, .message = "client went away"});
  EXPECT_TRUE(waitFor([&] {
    return metricValueWith(scrape(*p), "tandem_requests_total", "finish_reason=\"cancelled\"") == 1;
  })) << scrape(*p);
  EXPECT_TRUE(waitFor([&] { return metricValue(scrape(*p), "tandem_kv_blocks_free{") == kManyBlocks; })) << scrape(*p);
  EXPECT_EQ(metricValue(scrape(*p), "tandem_kv_leases_active{"), 0);
  for (const kvproto::Message& m : d.takeFor(30)) {
    EXPECT_FALSE(std::holds_alternative<kvproto::PrefillDone>(m.body)) << "the prefill ran to the end despite the Abort";
  }
  EXPECT_NE(p->trace().find("\"finish_reason\":\"cancelled\""), std::string::npos) << p->trace();
  d.t->close(c);
  EXPECT_EQ(p->stop(SIGTERM), 0) << p->log();
}

// A D that never releases: P's lease expiry frees the blocks, and P forgets
// the transfer (a Release that comes later names an unknown transfer).
TEST(PdControlChannelTest, PrefillAgentForgetsTransfersWhoseLeaseRanOut) {
  auto p = startPrefill(kBlocks, {"--lease-ttl", "200ms"});
  ASSERT_NE(p, nullptr);
  RawPeer d;
  ASSERT_NE(d.t, nullptr);
  auto connected = connectAsDecode(d, p->kvPort());
  ASSERT_TRUE(connected);
  const ConnId c = connected->first;
  d.send(c, 50, kvproto::PrefillRequest{.tokens = promptTokens(40)});
  ASSERT_TRUE(d.next(kvproto::MessageType::kPrefillDone));
  // The lease began before P sent PrefillDone, so it has run out 200 ms
  // after its arrival here (one monotonic clock for both processes). The
  // gauges alone are not enough: P sends PrefillDone inside the engine
  // step and updates them after it, so a quick scrape still reads the
  // values from before the request.
  const auto lease_over = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  EXPECT_TRUE(waitFor([&] {
    return std::chrono::steady_clock::now() >= lease_over &&
           metricValue(scrape(*p), "tandem_kv_leases_active{") == 0;
  }));
  EXPECT_TRUE(waitFor([&] { return metricValue(scrape(*p), "tandem_kv_blocks_free{") == kBlocks; }));
  // The next request makes P forget transfers whose lease ran out.
  d.send(c, 51, kvproto::PrefillRequest{.tokens = promptTokens(20)});
  ASSERT_TRUE(d.next(kvproto::MessageType::kPrefillDone));
  d.send(c, 50, kvproto::Release{});
  d.send(c, 51, kvproto::Release{});
  EXPECT_TRUE(waitFor([&] { return rejected(*p, "unknown_transfer") == 1; })) << scrape(*p);
  d.t->close(c);
  EXPECT_EQ(p->stop(SIGTERM), 0) << p->log();
}

// SIGTERM while a prefill is being computed: the engine ends the request
// after the prefill service is gone; the agent must still exit cleanly.
TEST(PdControlChannelTest, PrefillAgentStopsCleanlyWithAPrefillInFlight) {
  auto p = startPrefill(512, {"--drain-grace", "0s"});
  ASSERT_NE(p, nullptr);
  RawPeer d;
  ASSERT_NE(d.t, nullptr);
  auto connected = connectAsDecode(d, p->kvPort());
  ASSERT_TRUE(connected);
  const ConnId c = connected->first;
  d.send(c, 40, kvproto::PrefillRequest{.tokens = promptTokens(8000)});
  ASSERT_TRUE(d.next(kvproto::MessageType::kPrefillAccepted));
  EXPECT_EQ(p->stop(SIGTERM), 0) << p->log();
  // No drain grace: the prefill (~16 chunks) was cut off, and still accounted.
  EXPECT_NE(p->trace().find("\"finish_reason\":\"cancelled\""), std::string::npos) << p->trace();
}

struct Reply {
  int status = -1;
  std::string code;
};

std::future<Reply> postAsync(const AgentProcess& a, const std::string& prompt) {
  return std::async(std::launch::async, [url = a.url("/v1/completions"), prompt] {
    Reply r;
    auto resp = http::httpPost(url, json{{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}},
                               std::chrono::seconds(60));
    if (!resp.ok()) return r;
    r.status = resp->status;
    auto j = json::parse(resp->body, nullptr, false);
    if (j.contains("error") && j["error"]["code"].is_string()) r.code = j["error"]["code"];
    return r;
  });
}

TEST(PdControlChannelTest, DecodeAgentRefusesBadMessagesAndFailsTheTransferCleanly) {
  RawPeer fake_p;
  ASSERT_NE(fake_p.t, nullptr);
  auto d = startDecode(fake_p);
  ASSERT_NE(d, nullptr);
  const std::string prompt(40, 'x');
  std::future<Reply> first = postAsync(*d, prompt);
  auto hello = fake_p.next(kvproto::MessageType::kHello);
  ASSERT_TRUE(hello);
  const ConnId c = hello->first;
  auto req = fake_p.next(kvproto::MessageType::kPrefillRequest);
  ASSERT_TRUE(req);
  const uint64_t tid = req->second.transfer_id;
  fake_p.send(c, 0, fake_p.hello(kvproto::PeerRole::kPrefill));

  const std::vector<uint8_t> accepted = kvproto::encode({tid, kvproto::PrefillAccepted{.lease_ms = 30000, .block_ids = {0, 1, 2}}});
  fake_p.t->send(c, truncated(accepted));
  fake_p.t->send(c, wrongVersion(accepted));
  fake_p.send(c, tid, kvproto::PrefillAccepted{.lease_ms = 30000, .block_ids = {0, static_cast<uint32_t>(kBlocks)}});  // past our Hello's blocks
  fake_p.send(c, tid, kvproto::LayerReady{.layer = static_cast<uint16_t>(tiny().num_layers), .first_block = 0, .checksums = {1}});
  fake_p.send(c, tid + 100, kvproto::PrefillDone{.first_token = 65});  // unknown transfer
  fake_p.send(c, tid, kvproto::PrefillRequest{.tokens = {1, 2, 3}});    // not for a decode agent
  fake_p.send(c, tid, kvproto::Ping{});
  // Garbage does not end the transfer; this does: P claims one block for a
  // prompt that needs three.
  EXPECT_TRUE(waitFor([&] { return rejected(*d, "unexpected_type") == 2; })) << scrape(*d);
  fake_p.send(c, tid, kvproto::PrefillAccepted{.lease_ms = 30000, .block_ids = {0}});

  Reply r = first.get();
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.code, "transfer_failed");
  EXPECT_EQ(rejected(*d, "malformed"), 4);
  EXPECT_EQ(rejected(*d, "unknown_transfer"), 1);
  auto told = fake_p.next(kvproto::MessageType::kAbort);  // D tells P it gave up
  ASSERT_TRUE(told);
  EXPECT_EQ(told->second.transfer_id, tid);

  // P's own Abort ends the next request with its typed reason, and D does
  // not echo it back (the request after it arrives with nothing before it).
  std::future<Reply> second = postAsync(*d, prompt + "y");
  auto req2 = fake_p.next(kvproto::MessageType::kPrefillRequest);
  ASSERT_TRUE(req2);
  fake_p.send(c, req2->second.transfer_id, kvproto::Abort{.reason = kvproto::FailureReason::kCapacity, .message = "full"});
  Reply r2 = second.get();
  EXPECT_EQ(r2.status, 503);
  EXPECT_EQ(r2.code, "capacity");
  std::future<Reply> third = postAsync(*d, prompt + "z");
  auto req3 = fake_p.next(kvproto::MessageType::kPrefillRequest);
  ASSERT_TRUE(req3);
  EXPECT_TRUE(fake_p.takeFor(req2->second.transfer_id).empty()) << "D echoed P's Abort";
  fake_p.send(c, req3->second.transfer_id, kvproto::Abort{.reason = kvproto::FailureReason::kCapacity, .message = "full"});
  EXPECT_EQ(third.get().code, "capacity");

  EXPECT_TRUE(waitFor([&] { return metricValue(scrape(*d), "tandem_kv_blocks_free{") == kBlocks; })) << scrape(*d);
  EXPECT_EQ(metricValue(scrape(*d), "tandem_kv_transfer_inflight{"), 0);
  EXPECT_EQ(metricValueWith(scrape(*d), "tandem_kv_transfer_failures_total", "reason=\"transfer_failed\""), 1);
  EXPECT_EQ(metricValueWith(scrape(*d), "tandem_kv_transfer_failures_total", "reason=\"capacity\""), 2);
  EXPECT_EQ(d->stop(SIGTERM), 0) << d->log();
}

// A prefill peer with another KV layout (another model): requests fail at
// once with a typed error naming the mismatch, not at the prefill deadline.
// A connection to D's own KV listener is closed at its first message (no
// role connects to a decode agent) and counted as unauthenticated.
TEST(PdControlChannelTest, DecodeAgentFailsFastOnAnIncompatiblePeerAndIgnoresStrangers) {
  RawPeer fake_p;
  ASSERT_NE(fake_p.t, nullptr);
  auto d = startDecode(fake_p, {"--prefill-timeout", "120s"});
  ASSERT_NE(d, nullptr);
  // A stranger connects to D's KV listener and claims to be a prefill agent.
  RawPeer stranger;
  ASSERT_NE(stranger.t, nullptr);
  const ConnId s = stranger.t->connect("127.0.0.1", d->kvPort());
  stranger.send(s, 0, stranger.hello(kvproto::PeerRole::kPrefill));
  EXPECT_TRUE(waitFor([&] { return authFailures(*d, "unauthenticated") >= 1; })) << scrape(*d);
  EXPECT_FALSE(stranger.next(kvproto::MessageType::kHello, std::chrono::seconds(1))) << "D answered a stranger";

  std::future<Reply> first = postAsync(*d, std::string(40, 'v'));
  auto hello = fake_p.next(kvproto::MessageType::kHello);
  ASSERT_TRUE(hello);
  const ConnId c = hello->first;
  ASSERT_TRUE(fake_p.next(kvproto::MessageType::kPrefillRequest));
  kvproto::Hello other = fake_p.hello(kvproto::PeerRole::kPrefill);
  other.head_dim = static_cast<uint16_t>(2 * tiny().head_dim);
  fake_p.send(c, 0, other);
  Reply r = first.get();
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.code, "transfer_failed");
  // The next request fails at once too: no PrefillRequest is sent.
  Reply again = postAsync(*d, std::string(40, 'u')).get();
  EXPECT_EQ(again.code, "transfer_failed");
  EXPECT_NE(d->log().find("different KV layout"), std::string::npos) << d->log();
  EXPECT_TRUE(waitFor([&] { return metricValue(scrape(*d), "tandem_kv_blocks_free{") == kBlocks; }));
  {
    std::lock_guard l(fake_p.mu);
    for (const auto& [conn, m] : fake_p.inbox) {
      EXPECT_NE(kvproto::typeOf(m.body), kvproto::MessageType::kPrefillRequest) << "a request went to the incompatible peer";
    }
  }
  stranger.t->close(s);
  EXPECT_EQ(d->stop(SIGTERM), 0) << d->log();
}

// SIGTERM while a request waits for its prefill peer (which never answers):
// the transfer is failed, the client hears back, the agent exits cleanly.
TEST(PdControlChannelTest, DecodeAgentStopsCleanlyWithATransferInFlight) {
  RawPeer fake_p;
  ASSERT_NE(fake_p.t, nullptr);
  auto d = startDecode(fake_p, {"--drain-grace", "0s"});
  ASSERT_NE(d, nullptr);
  std::future<Reply> pending = postAsync(*d, std::string(40, 'w'));
  auto req = fake_p.next(kvproto::MessageType::kPrefillRequest);
  ASSERT_TRUE(req);
  EXPECT_EQ(d->stop(SIGTERM), 0) << d->log();
  Reply r = pending.get();
  EXPECT_NE(r.status, 200);
}

}  // namespace
}  // namespace tandem::agent

namespace tandem::agent {
namespace {

// A Hello from a peer of kvproto versions [6, 7] (its header says 7), past
// this build's [4, 5].
std::vector<uint8_t> newerHello(const RawPeer& peer, kvproto::PeerRole role) {
  kvproto::Hello h = peer.hello(role);
  h.min_version = 6;
  h.max_version = 7;
  std::vector<uint8_t> wire = kvproto::encode({0, h});
  wire[4] = 7;
  return wire;
}

// P answers every Hello with its own (so the peer can name both sides), but
// refuses the prefill requests of a decode agent with no common protocol
// version, another model fingerprint, another hash root (another salt) or
// another tensor-parallel shard: each is counted and named; a matching peer
// is still served.
TEST(PdControlChannelTest, PrefillAgentRefusesAPeerOfAnotherVersionModelOrSalt) {
  auto p = startPrefill(kBlocks);
  ASSERT_NE(p, nullptr);
  struct Case {
    std::string reason;
    std::function<void(RawPeer&, ConnId)> hello;
    std::vector<std::string> named;  // in the Abort's message
  };
  const std::vector<Case> cases = {
      {"incompatible_version",
       [](RawPeer& d, ConnId c) { d.t->send(c, newerHello(d, kvproto::PeerRole::kDecode)); },
       {"[6, 7]", "[4, 5]"}},
      {"fingerprint_mismatch",
       [](RawPeer& d, ConnId c) {
         kvproto::Hello h = d.hello(kvproto::PeerRole::kDecode);
         h.model_fingerprint = 0x1234;
         d.send(c, 0, h);
       },
       {"0000000000001234", kFingerprintFlag}},
      {"hash_root_mismatch",
       [](RawPeer& d, ConnId c) {
         kvproto::Hello h = d.hello(kvproto::PeerRole::kDecode);
         h.hash_root = blockHashRoot(kFingerprint, "another-tenant").value();
         d.send(c, 0, h);
       },
       {"--cache-salt"}},
      // KV blocks move byte for byte: a bf16 pool's are not an fp32 one's.
      {"kv_dtype_mismatch",
       [](RawPeer& d, ConnId c) {
         kvproto::Hello h = d.hello(kvproto::PeerRole::kDecode);
         h.dtype = kvproto::KvDtype::kBfloat16;
         d.send(c, 0, h);
       },
       {"keeps its KV cache in bfloat16, this agent in float32", "--kv-dtype"}},
      // Rank 1 of 2 holds the upper half of the KV heads; this agent is
      // rank 0 of 1 holding all of them.
      {"tensor_parallel_mismatch",
       [](RawPeer& d, ConnId c) {
         kvproto::Hello h = d.hello(kvproto::PeerRole::kDecode);
         h.tp_rank = 1;
         h.tp_world = 2;
         h.num_kv_heads = static_cast<uint16_t>(tiny().num_kv_heads / 2);
         h.kv_head_begin = h.num_kv_heads;
         d.send(c, 0, h);
       },
       {"rank 1 of 2, KV heads [" + std::to_string(tiny().num_kv_heads / 2) + ", " +
            std::to_string(tiny().num_kv_heads / 2 * 2) + ")",
        "rank 0 of 1, KV heads [0, " + std::to_string(tiny().num_kv_heads) + ")",
        "the prefill rank of the same rank and KV heads"}},
  };
  for (const Case& k : cases) {
    RawPeer d;
    ASSERT_NE(d.t, nullptr);
    const ConnId c = d.t->connect("127.0.0.1", p->kvPort());
    ASSERT_FALSE(d.authenticate(c).has_value()) << k.reason;
    k.hello(d, c);
    auto hello = d.next(kvproto::MessageType::kHello);
    ASSERT_TRUE(hello) << k.reason;
    const auto& ph = std::get<kvproto::Hello>(hello->second.body);
    EXPECT_EQ(ph.min_version, kvproto::kMinVersion);
    EXPECT_EQ(ph.max_version, kvproto::kMaxVersion);
    EXPECT_EQ(ph.model_fingerprint, kFingerprint);
    EXPECT_EQ(ph.hash_root, blockHashRoot(kFingerprint, "").value());
    EXPECT_EQ(ph.tp_rank, 0);  // no agent runs tensor-parallel yet
    EXPECT_EQ(ph.tp_world, 1);
    EXPECT_EQ(ph.kv_head_begin, 0);
    d.send(c, 5, kvproto::PrefillRequest{.tokens = promptTokens(20)});
    auto abort = d.next(kvproto::MessageType::kAbort);
    ASSERT_TRUE(abort) << k.reason;
    EXPECT_EQ(abort->second.transfer_id, 5u);
    const auto& a = std::get<kvproto::Abort>(abort->second.body);
    EXPECT_EQ(a.reason, kvproto::FailureReason::kTransferFailed);
    for (const std::string& n : k.named) EXPECT_NE(a.message.find(n), std::string::npos) << a.message;
    EXPECT_TRUE(waitFor([&] { return rejected(*p, k.reason) == 1; })) << scrape(*p);
    EXPECT_TRUE(d.takeFor(5).empty()) << "a refused peer's request was computed";
  }
  // A peer of the same model is served.
  RawPeer d;
  ASSERT_NE(d.t, nullptr);
  auto connected = connectAsDecode(d, p->kvPort());
  ASSERT_TRUE(connected);
  d.send(connected->first, 6, kvproto::PrefillRequest{.tokens = promptTokens(20)});
  auto done = d.next(kvproto::MessageType::kPrefillDone);
  ASSERT_TRUE(done) << p->log();
  d.send(connected->first, 6, kvproto::Release{});
  EXPECT_TRUE(waitFor([&] { return metricValue(scrape(*p), "tandem_kv_leases_active{") == 0; }));
  EXPECT_EQ(p->stop(SIGTERM), 0) << p->log();
}

// D refuses a prefill peer whose Hello shows no common version: requests
// fail at once, naming both ranges, and it is counted.
TEST(PdControlChannelTest, DecodeAgentRefusesAPrefillPeerOfAnotherVersion) {
  RawPeer fake_p;
  ASSERT_NE(fake_p.t, nullptr);
  auto d = startDecode(fake_p, {"--prefill-timeout", "120s"});
  ASSERT_NE(d, nullptr);
  std::future<Reply> first = postAsync(*d, std::string(40, 'v'));
  auto hello = fake_p.next(kvproto::MessageType::kHello);
  ASSERT_TRUE(hello);
  const auto& dh = std::get<kvproto::Hello>(hello->second.body);
  EXPECT_EQ(dh.model_fingerprint, kFingerprint);
  EXPECT_EQ(dh.max_version, kvproto::kMaxVersion);
  fake_p.t->send(hello->first, newerHello(fake_p, kvproto::PeerRole::kPrefill));
  Reply r = first.get();
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.code, "transfer_failed");
  EXPECT_TRUE(waitFor([&] { return rejected(*d, "incompatible_version") == 1; })) << scrape(*d);
  EXPECT_NE(d->log().find("speaks kvproto versions [6, 7], this agent [4, 5]"), std::string::npos) << d->log();
  EXPECT_TRUE(waitFor([&] { return metricValue(scrape(*d), "tandem_kv_blocks_free{") == kBlocks; }));
  EXPECT_EQ(d->stop(SIGTERM), 0) << d->log();
}

}  // namespace
}  // namespace tandem::agent

// The KV channel's authentication (docs/security.md), against real agents
// started with --pool-key-dir.
namespace tandem::agent {
namespace {

const std::string kPoolKey(64, 'a');
const std::string kOtherPoolKey(64, 'b');

// A key directory with `key` in it, removed at the end of the test.
struct KeyDir {
  std::string path;
  explicit KeyDir(const std::string& key) {
    path = (std::filesystem::temp_directory_path() /
            ("pd_auth_test." + std::to_string(::getpid()) + "." + std::to_string(counter++)))
               .string();
    std::filesystem::create_directories(path);
    std::ofstream(path + "/key") << key << "\n";
  }
  ~KeyDir() { std::filesystem::remove_all(path); }
  static inline int counter = 0;
};

std::shared_ptr<const auth::PoolKeys> keysOf(const std::string& key) { return *auth::PoolKeys::of({key}, {"test"}); }

// Nothing reaches a peer without the key before it proved it: no Hello (so
// no remote key of P's KV pool), no prefill; each attempt is closed and
// counted; P keeps serving the decode agent that holds the key.
TEST(PdAuthTest, PrefillAgentServesOnlyDecodeAgentsThatProveThePoolKey) {
  KeyDir dir(kPoolKey);
  auto p = startPrefill(kBlocks, {"--pool-key-dir", dir.path});
  ASSERT_NE(p, nullptr);
  const auto noHelloNorPrefill = [](RawPeer& peer) {
    EXPECT_FALSE(peer.next(kvproto::MessageType::kHello, std::chrono::seconds(1))) << "P sent its region's key";
    EXPECT_FALSE(peer.next(kvproto::MessageType::kPrefillAccepted, std::chrono::seconds(0)));
  };

  {  // No key (an insecure agent or anyone): P does not know its key.
    RawPeer raw;
    const ConnId c = raw.t->connect("127.0.0.1", p->kvPort());
    auto failed = raw.authenticate(c);
    ASSERT_TRUE(failed.has_value());
    EXPECT_NE(failed->find("holds pool keys [insecure]"), std::string::npos) << *failed;
    raw.send(c, 0, raw.hello(kvproto::PeerRole::kDecode));
    raw.send(c, 7, kvproto::PrefillRequest{.tokens = promptTokens(20)});
    noHelloNorPrefill(raw);
    EXPECT_TRUE(waitFor([&] { return authFailures(*p, "unknown_key") == 1; })) << scrape(*p);
  }
  {  // Skipping the handshake: a Hello, a prefill request straight away.
    for (int i = 0; i < 2; ++i) {
      RawPeer raw;
      const ConnId c = raw.t->connect("127.0.0.1", p->kvPort());
      if (i == 0) raw.send(c, 0, raw.hello(kvproto::PeerRole::kDecode));
      raw.send(c, 8, kvproto::PrefillRequest{.tokens = promptTokens(20)});
      noHelloNorPrefill(raw);
    }
    EXPECT_TRUE(waitFor([&] { return authFailures(*p, "unauthenticated") >= 2; })) << scrape(*p);
  }
  {  // Another pool's key.
    RawPeer raw(keysOf(kOtherPoolKey));
    const ConnId c = raw.t->connect("127.0.0.1", p->kvPort());
    ASSERT_TRUE(raw.authenticate(c).has_value());
    noHelloNorPrefill(raw);
    EXPECT_TRUE(waitFor([&] { return authFailures(*p, "unknown_key") == 2; })) << scrape(*p);
  }
  {  // A replayed handshake: a captured AuthHello and AuthProof on a new connection.
    RawPeer honest(keysOf(kPoolKey));
    const ConnId c = honest.t->connect("127.0.0.1", p->kvPort());
    auto connector = auth::KvAuthConnector::start(honest.keys, {kvproto::PeerRole::kDecode, "raw-test-peer"});
    ASSERT_TRUE(connector.ok());
    honest.send(c, 0, connector->hello());
    auto challenge = honest.next(kvproto::MessageType::kAuthChallenge);
    ASSERT_TRUE(challenge);
    auto proof = connector->onChallenge(std::get<kvproto::AuthChallenge>(challenge->second.body));
    ASSERT_TRUE(std::holds_alternative<kvproto::AuthProof>(proof));
    honest.send(c, 0, std::get<kvproto::AuthProof>(proof));

    RawPeer replay;  // holds no key
    const ConnId r = replay.t->connect("127.0.0.1", p->kvPort());
    replay.send(r, 0, connector->hello());
    ASSERT_TRUE(replay.next(kvproto::MessageType::kAuthChallenge));  // a fresh nonce: the old proof no longer fits
    replay.send(r, 0, std::get<kvproto::AuthProof>(proof));
    replay.send(r, 0, replay.hello(kvproto::PeerRole::kDecode));
    noHelloNorPrefill(replay);
    EXPECT_TRUE(waitFor([&] { return authFailures(*p, "bad_proof") == 1; })) << scrape(*p);
  }
  {  // The right key, but a prefill agent asking another prefill agent for KV.
    RawPeer other_p(keysOf(kPoolKey));
    const ConnId c = other_p.t->connect("127.0.0.1", p->kvPort());
    ASSERT_FALSE(other_p.authenticate(c, kvproto::PeerRole::kPrefill).has_value());
    other_p.send(c, 0, other_p.hello(kvproto::PeerRole::kPrefill));
    ASSERT_TRUE(other_p.next(kvproto::MessageType::kHello));  // authenticated: P says Hello
    other_p.send(c, 9, kvproto::PrefillRequest{.tokens = promptTokens(20)});
    auto refused = other_p.next(kvproto::MessageType::kAbort);
    ASSERT_TRUE(refused);
    EXPECT_NE(std::get<kvproto::Abort>(refused->second.body).message.find("only decode agents"), std::string::npos);
    EXPECT_FALSE(other_p.next(kvproto::MessageType::kPrefillAccepted, std::chrono::seconds(1)));
    EXPECT_TRUE(waitFor([&] { return authFailures(*p, "wrong_role") == 1; })) << scrape(*p);
  }
  // A decode agent with the key is served, after all that.
  RawPeer d(keysOf(kPoolKey));
  auto connected = connectAsDecode(d, p->kvPort());
  ASSERT_TRUE(connected);
  EXPECT_FALSE(connected->second.rkey.empty());
  d.send(connected->first, 6, kvproto::PrefillRequest{.tokens = promptTokens(20)});
  ASSERT_TRUE(d.next(kvproto::MessageType::kPrefillDone)) << p->log();
  d.send(connected->first, 6, kvproto::Release{});
  EXPECT_TRUE(waitFor([&] { return metricValue(scrape(*p), "tandem_kv_leases_active{") == 0; }));
  EXPECT_NE(p->log().find("failed authentication (logged once per address)"), std::string::npos);
  EXPECT_EQ(p->stop(SIGTERM), 0) << p->log();
}

// A decode agent with the key trusts no prefill peer that cannot prove it:
// it sends it neither its Hello (its own region's key) nor a prompt, and
// its requests fail at once, naming why.
TEST(PdAuthTest, DecodeAgentSendsNothingToAPrefillPeerWithoutThePoolKey) {
  KeyDir dir(kPoolKey);
  RawPeer fake_p(keysOf(kOtherPoolKey));
  ASSERT_NE(fake_p.t, nullptr);
  auto d = startDecode(fake_p, {"--pool-key-dir", dir.path, "--prefill-timeout", "120s"});
  ASSERT_NE(d, nullptr);
  Reply r = postAsync(*d, std::string(40, 'v')).get();
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.code, "transfer_failed");
  EXPECT_TRUE(waitFor([&] { return authFailures(*d, "refused_by_peer") >= 1; })) << scrape(*d);
  EXPECT_NE(d->log().find("none in common"), std::string::npos) << d->log();
  EXPECT_FALSE(fake_p.next(kvproto::MessageType::kHello, std::chrono::seconds(1))) << "D sent its region's key";
  EXPECT_FALSE(fake_p.next(kvproto::MessageType::kPrefillRequest, std::chrono::seconds(0))) << "D sent a prompt";
  EXPECT_TRUE(waitFor([&] { return metricValue(scrape(*d), "tandem_kv_blocks_free{") == kBlocks; }));
  EXPECT_EQ(d->stop(SIGTERM), 0) << d->log();
}

// Rotating the pool key (docs/security.md) while a prefill agent runs: at
// each step of the procedure, decode agents that already saw the Secret's
// edit and those that have not yet both authenticate, and a prompt is
// served; after the last step the old key is refused.
TEST(PdAuthTest, RotatingThePoolKeyKeepsEveryStepsAgentsTogether) {
  const std::string k1 = kPoolKey, k2 = kOtherPoolKey;
  KeyDir dir(k1);
  auto p = startPrefill(kBlocks, {"--pool-key-dir", dir.path});
  ASSERT_NE(p, nullptr);
  auto keys = [](std::vector<std::string> secrets) {
    return *auth::PoolKeys::of(secrets, std::vector<std::string>(secrets.size(), "k"));
  };
  // Whether a decode agent holding `held` authenticates to P now.
  auto authenticates = [&](std::vector<std::string> held) {
    RawPeer d(keys(std::move(held)));
    const ConnId c = d.t->connect("127.0.0.1", p->kvPort());
    return !d.authenticate(c).has_value();
  };
  auto served = [&](std::vector<std::string> held) {
    RawPeer d(keys(std::move(held)));
    auto connected = connectAsDecode(d, p->kvPort());
    if (!connected) return false;
    d.send(connected->first, 1, kvproto::PrefillRequest{.tokens = promptTokens(20)});
    const bool done = d.next(kvproto::MessageType::kPrefillDone).has_value();
    d.send(connected->first, 1, kvproto::Release{});
    return done;
  };
  auto write = [&](const std::string& file, const std::string& key) { std::ofstream(dir.path + "/" + file) << key; };
  EXPECT_TRUE(served({k1}));
  EXPECT_FALSE(authenticates({k2}));

  // 1. next-key added: P accepts k2 too; an agent already at step 2 gets in.
  write("next-key", k2);
  ASSERT_TRUE(waitFor([&] { return authenticates({k2}); }, std::chrono::seconds(30))) << p->log();
  EXPECT_TRUE(served({k1}));
  EXPECT_TRUE(served({k2, k1}));
  // 2. k2 proves, k1 still accepted.
  write("key", k2);
  write("previous-key", k1);
  std::filesystem::remove(dir.path + "/next-key");
  std::this_thread::sleep_for(std::chrono::seconds(6));  // past the agent's 5 s re-read
  EXPECT_TRUE(served({k1, k2}));  // an agent still at step 1
  EXPECT_TRUE(served({k2}));      // one already at step 3
  EXPECT_TRUE(served({k1}));      // one that saw no edit yet
  // 3. k1 gone.
  std::filesystem::remove(dir.path + "/previous-key");
  ASSERT_TRUE(waitFor([&] { return !authenticates({k1}); }, std::chrono::seconds(30))) << p->log();
  EXPECT_TRUE(served({k2}));
  EXPECT_EQ(p->stop(SIGTERM), 0) << p->log();
}

// A peer that connects and never finishes the handshake is closed once it
// is 10 s old (swept when the next peer connects), and counted.
TEST(PdAuthTest, AConnectionThatNeverAuthenticatesIsClosed) {
  KeyDir dir(kPoolKey);
  auto p = startPrefill(kBlocks, {"--pool-key-dir", dir.path});
  ASSERT_NE(p, nullptr);
  RawPeer silent;
  silent.t->connect("127.0.0.1", p->kvPort());  // says nothing
  RawPeer halfway(keysOf(kPoolKey));
  const ConnId h = halfway.t->connect("127.0.0.1", p->kvPort());
  auto connector = auth::KvAuthConnector::start(halfway.keys, {kvproto::PeerRole::kDecode, "raw-test-peer"});
  ASSERT_TRUE(connector.ok());
  halfway.send(h, 0, connector->hello());  // and never proves the key
  ASSERT_TRUE(halfway.next(kvproto::MessageType::kAuthChallenge));
  std::this_thread::sleep_for(std::chrono::milliseconds(10'500));
  RawPeer d(keysOf(kPoolKey));
  ASSERT_TRUE(connectAsDecode(d, p->kvPort()));  // the next peer is served, and the two are swept
  EXPECT_TRUE(waitFor([&] { return authFailures(*p, "handshake_timeout") == 2; })) << scrape(*p);
  EXPECT_EQ(p->stop(SIGTERM), 0) << p->log();
}

// A prefill peer that never answers the handshake (hung, or of an older
// protocol that ignores the AuthHello): its heartbeats go unanswered, so
// D serves the request itself; after 10 s D closes the connection, naming
// why, and it never sent that peer its Hello or a prompt.
TEST(PdAuthTest, DecodeAgentGivesUpOnAPrefillPeerThatNeverAnswersTheHandshake) {
  KeyDir dir(kPoolKey);
  RawPeer fake_p(keysOf(kPoolKey));
  ASSERT_NE(fake_p.t, nullptr);
  fake_p.answer_handshakes = false;
  auto d = startDecode(fake_p, {"--pool-key-dir", dir.path, "--prefill-timeout", "120s"});
  ASSERT_NE(d, nullptr);
  Reply r = postAsync(*d, std::string(40, 'h')).get();
  EXPECT_EQ(r.status, 200);
  EXPECT_TRUE(waitFor([&] { return authFailures(*d, "handshake_timeout") >= 1; })) << scrape(*d);
  EXPECT_NE(d->log().find("did not answer the authentication handshake"), std::string::npos) << d->log();
  EXPECT_FALSE(fake_p.next(kvproto::MessageType::kHello, std::chrono::seconds(0)));
  EXPECT_FALSE(fake_p.next(kvproto::MessageType::kPrefillRequest, std::chrono::seconds(0)));
  EXPECT_EQ(d->stop(SIGTERM), 0) << d->log();
}

// Real agents sharing the pool key work together; one with another key
// fails at once with an error naming both key sets.
TEST(PdAuthTest, AgentsOfOnePoolWorkTogetherAndAnotherPoolsDoNot) {
  KeyDir dir(kPoolKey);
  KeyDir other(kOtherPoolKey);
  auto p = startPrefill(kBlocks, {"--pool-key-dir", dir.path});
  ASSERT_NE(p, nullptr);
  const std::string peer = "127.0.0.1:" + std::to_string(p->kvPort());
  const auto decodeWith = [&](const std::string& key_dir) {
    return AgentProcess::start({"--role", "decode", "--kv-listen", "127.0.0.1:0", "--kv-tls", "tcp", "--num-blocks",
                                std::to_string(kBlocks), "--prefill-peer", peer, "--model-fingerprint",
                                kFingerprintFlag, "--pool-key-dir", key_dir});
  };
  auto good = decodeWith(dir.path);
  ASSERT_NE(good, nullptr);
  Reply ok = postAsync(*good, std::string(40, 'a')).get();
  EXPECT_EQ(ok.status, 200) << good->log();
  auto bad = decodeWith(other.path);
  ASSERT_NE(bad, nullptr);
  // (D may still answer, computing the prompt itself: what matters is that
  // no KV came from P.)
  postAsync(*bad, std::string(40, 'b')).get();
  EXPECT_TRUE(waitFor([&] { return authFailures(*p, "unknown_key") >= 1; })) << scrape(*p);
  EXPECT_TRUE(waitFor([&] { return authFailures(*bad, "refused_by_peer") >= 1; })) << scrape(*bad);
  EXPECT_EQ(metricValue(scrape(*bad), "tandem_kv_transfer_bytes_total{"), 0);
  EXPECT_GT(metricValue(scrape(*good), "tandem_kv_transfer_bytes_total{"), 0);
  EXPECT_NE(bad->log().find("none in common"), std::string::npos) << bad->log();
  EXPECT_EQ(good->stop(SIGTERM), 0) << good->log();
  EXPECT_EQ(bad->stop(SIGTERM), 0) << bad->log();
  EXPECT_EQ(p->stop(SIGTERM), 0) << p->log();
}

}  // namespace
}  // namespace tandem::agent
