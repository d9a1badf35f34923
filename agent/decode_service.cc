#include "agent/decode_service.h"

#include <atomic>
#include <limits>
#include <random>
#include <thread>
#include <unordered_map>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/pd_metrics.h"
#include "src/auth/kv_handshake.h"
#include "agent/pd_transfer.h"
#include "agent/prefill_peers.h"
#include "src/common/log.h"
#include "src/common/strings.h"

namespace tandem::agent {

using kvproto::FailureReason;
using transport::ConnId;
using transport::GetId;
using Kind = TransferAction::Kind;

std::string_view pdPathName(PdPath path) {
  switch (path) {
    case PdPath::kDirect:
      return "direct";
    case PdPath::kDisagg:
      return "disagg";
    case PdPath::kFallback:
      return "fallback";
  }
  return "direct";
}

struct DecodeService::Impl : std::enable_shared_from_this<DecodeService::Impl> {
  // One request's transfer: its state machine and what carrying out its
  // actions needs.
  struct Entry {
    DecodeTransfer tr;
    uint64_t handle = 0;          // the engine loop's
    std::optional<RequestId> id;  // the engine's, once admitted
    PdUpdateCallback cb;
    std::vector<TokenId> prompt;
    engine::SamplingParams sampling;
    ConnId conn = 0;
    size_t peer = 0;                         // which prefill peer serves it
    bool peer_counted = false;               // counted in its peer's num_inflight
    std::unordered_map<PullId, GetId> gets;  // outstanding pulls' transport gets
    // How the request ends when the transfer failed: error, unless the
    // engine was asked to end it (a cancel: the requested reason).
    engine::FinishReason end_reason = engine::FinishReason::kError;
    std::optional<PdTimings> timings;  // with first_step_ms, once the first token is out
    bool inflight_counted = false;     // counted in tandem_kv_transfer_inflight
    // Moved off a peer that was not healthy before it accepted: the peer it
    // left, and whether the prompt is computed here instead (`tr` is then a
    // fresh, idle transfer and `conn` 0).
    std::string moved_from;
    bool local = false;
    // Peers it was moved off: never asked again for it (a late message of
    // the first attempt could otherwise pass for the answer to a second).
    std::vector<size_t> left;
    // Once its peer accepted: when, and how many prompt tokens it computes
    // (the prompt less what it had cached): the peer's rate, measured.
    MonoTime accepted_at{};
    int64_t computed_tokens = 0;
  };

  engine::EngineLoop& loop;
  PdMetrics& metrics;
  const Clock& clock;
  const PdOptions options;
  Logger log{"decode"};
  engine::KvLayout layout;
  ModelIdentity model;  // set at start, before the transport exists
  std::byte* region = nullptr;
  bool region_on_device = false;  // Engine::kvRegionOnDevice: never read on the host
  // Verified pulls into device memory whose checks are pending, and their
  // layer blocks in order: one engine-thread task checks all of them
  // (checkLandedPulls), posted when the first lands.
  struct LandedPull {
    uint64_t tid;
    TransferAction pull;
    MonoTime done_at;  // when its get completed
  };
  std::unique_ptr<transport::KvTransport> t;
  std::thread watchdog;
  std::atomic<uint64_t> next_tid{1};
  // The transport is being shut down: nothing is sent or pulled any more
  // (set under mu; every send and get is issued under mu).
  std::atomic<bool> transport_closed{false};

  absl::Mutex mu;
  std::vector<LandedPull> landed ABSL_GUARDED_BY(mu);
  std::vector<engine::KvLayerBlock> landed_blocks ABSL_GUARDED_BY(mu);
  bool check_posted ABSL_GUARDED_BY(mu) = false;
  absl::CondVar cv;  // wakes the watchdog: stopping, or a deadline may have moved
  std::unordered_map<uint64_t, Entry> transfers ABSL_GUARDED_BY(mu);  // by transfer id
  std::unordered_map<uint64_t, uint64_t> by_handle ABSL_GUARDED_BY(mu);
  // The prefill peers; a peer's `incompatible` says why it cannot serve
  // this agent (its Hello showed another protocol version, model, hash root,
  // tensor-parallel shard or KV layout): its transfers fail at once instead
  // of waiting for a deadline.
  PrefillPeers peers ABSL_GUARDED_BY(mu);
  std::mt19937_64 rng ABSL_GUARDED_BY(mu){std::random_device{}()};
  uint64_t gets_counted ABSL_GUARDED_BY(mu) = 0;  // transport gets already in the metric
  uint64_t next_heartbeat ABSL_GUARDED_BY(mu) = 0;  // the last heartbeat's sequence number
  // Each connection to a prefill peer until and after its handshake
  // (src/auth/kv_handshake.h). Until the peer proved it holds the pool key
  // nothing but the AuthHello goes out: what this side sends meanwhile
  // (prefill requests, heartbeats) waits in `queued`, and goes out after the
  // proof and the Hello; nothing but the challenge is taken in.
  struct Handshake {
    enum class State { kAwaitingChallenge, kDone, kFailed };
    State state = State::kAwaitingChallenge;
    MonoTime started{};  // a prefill peer that has not answered kHandshakeTimeout later fails
    std::optional<auth::KvAuthConnector> connector;
    std::vector<std::vector<uint8_t>> queued;
  };
  static constexpr size_t kMaxQueued = 1 << 14;
  static constexpr Duration kHandshakeTimeout = std::chrono::seconds(10);
  std::unordered_map<ConnId, Handshake> handshakes ABSL_GUARDED_BY(mu);
  std::unordered_map<std::string, std::string> incompatible_logged ABSL_GUARDED_BY(mu);  // by peer name
  AuthFailureLog auth_failures{metrics, "decode"};
  bool stopping ABSL_GUARDED_BY(mu) = false;

  Impl(const PdEnv& env, const PdOptions& o)
      : loop(env.loop),
        metrics(env.metrics),
        clock(env.clock),
        options(o),
        peers(o.prefill_peers->prefillPeers(), o.peer_health, env.clock, o.prefill_deadline) {}

  void send(ConnId c, uint64_t tid, kvproto::Body body) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (transport_closed.load()) return;
    std::vector<uint8_t> bytes = kvproto::encode({tid, std::move(body)});
    if (auto h = handshakes.find(c); h != handshakes.end() && h->second.state != Handshake::State::kDone) {
      // Waits for the handshake; dropped if it fails (the transfers fail then).
      // (Bounded: a peer that never answers is marked unhealthy long before.)
      if (h->second.state == Handshake::State::kAwaitingChallenge && h->second.queued.size() < kMaxQueued) {
        h->second.queued.push_back(std::move(bytes));
      }
      return;
    }
    t->send(c, std::move(bytes));
  }

  // Connects (again) to peer `p` if needed.
  ConnId ensureConnected(size_t p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (transport_closed.load()) return 0;
    PrefillPeers::Peer& peer = peers[p];
    if (peer.conn == 0) {
      peer.conn = t->connect(peer.address.host, peer.address.port);
      peer.hello.reset();
      peer.incompatible.reset();
      Handshake& h = handshakes[peer.conn];
      h.started = clock.now();
      auto connector = auth::KvAuthConnector::start(currentPoolKeys(options), {kvproto::PeerRole::kDecode, "decode"});
      if (!connector.ok()) {
        h.state = Handshake::State::kFailed;
        peer.incompatible = strCat("cannot start the KV handshake: ", toStd(connector.status().message()));
        return peer.conn;
      }
      // Built in place (not through send()'s Body): GCC 12 warns about the
      // variant's moved-from members otherwise.
      kvproto::Message hello{.transfer_id = 0, .body = connector->hello()};
      h.connector.emplace(std::move(*connector));
      t->send(peer.conn, kvproto::encode(hello));
    }
    return peer.conn;
  }

  // The transfer no longer counts as in flight to its peer.
  void uncountPeer(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!e.peer_counted) return;
    peers[e.peer].num_inflight--;
    e.peer_counted = false;
  }

  // ------------------------------------------------------------ actions --

  // Carries out what transfer `tid`'s state machine asked for, in order.
  void apply(uint64_t tid, Entry& e, const TransferActions& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (const TransferAction& a : actions) {
      switch (a.kind) {
        case Kind::kSendPrefillRequest:
          sendPrefillRequest(tid, e);
          break;
        case Kind::kIssuePull:
          issuePull(tid, e, a);
          break;
        case Kind::kCancelPull:
          if (auto g = e.gets.find(a.pull); g != e.gets.end()) t->cancelGet(g->second);
          break;
        case Kind::kReportFailure:
          reportFailure(tid, a);
          break;
        case Kind::kSendAbort:
          send(e.conn, tid, kvproto::Abort{a.reason, a.message});
          break;
        case Kind::kSendRelease:
          send(e.conn, tid, kvproto::Release{});
          break;
        case Kind::kCompleteImport:
          peers[e.peer].health->recordSuccess();
          peers[e.peer].rate.record(e.computed_tokens, clock.now() - e.accepted_at);
          uncountPeer(e);
          completeImport(e, a.first_token);
          break;
        case Kind::kEndImport:
          uncountPeer(e);
          // Every pull is over, so D's blocks may take another attempt's KV.
          if (std::optional<std::string_view> why = failoverReason(e)) {
            // The rest of `actions` (none: kEndImport is the last) was the old transfer's.
            return moveOff(tid, e, *why, e.tr.dBlocks());
          }
          endImport(e, a.message);
          break;
      }
    }
  }

  void sendPrefillRequest(uint64_t tid, Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!e.inflight_counted) metrics.inflight.increment();  // once, also when moved to another peer
    metrics.prefillRequested(peers[e.peer].name);
    e.inflight_counted = true;
    kvproto::PrefillRequest req;
    req.deadline_ms = static_cast<uint32_t>(options.prefill_timeout.count());
    req.lease_ms = static_cast<uint32_t>(options.lease_ttl.count());
    req.tokens.assign(e.prompt.begin(), e.prompt.end());
    req.temperature = e.sampling.temperature;
    req.top_p = e.sampling.top_p;
    req.top_k = static_cast<uint32_t>(e.sampling.top_k);
    req.seed = e.sampling.seed;
    send(e.conn, tid, std::move(req));
    cv.SignalAll();  // a new deadline for the watchdog
  }

  // Where (layer, i-th block of the request) lives in this side's pool.
  std::byte* localBlock(const Entry& e, uint32_t layer, size_t i) const {
    return region + layerBlockOffset(layer, static_cast<uint32_t>(e.tr.dBlocks()[i].value()),
                                     static_cast<uint32_t>(layout.num_blocks), layout.bytesPerLayerBlock());
  }

  // One logical get of the range; the transport merges blocks that are
  // contiguous on both sides into one wire get.
  void issuePull(uint64_t tid, Entry& e, const TransferAction& a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const uint64_t bytes = layout.bytesPerLayerBlock();
    std::vector<transport::KvTransport::Segment> segments;
    segments.reserve(a.count);
    for (size_t i = a.first; i < a.first + a.count; ++i) {
      segments.push_back({.local = localBlock(e, a.layer, i),
                          .remote_offset = layerBlockOffset(a.layer, e.tr.pBlocks()[i], e.tr.peerBlocks(), bytes),
                          .length = bytes});
    }
    // The completion takes mu, which we hold: it cannot run before the id is recorded.
    e.gets[a.pull] = t->getv(e.conn, std::move(segments), [this, tid, a](absl::Status s) { onPullDone(tid, a, s); });
  }

  void reportFailure(uint64_t tid, const TransferAction& a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    metrics.failure(a.reason);
    // Failures that say something about the peer feed its health window.
    auto it = transfers.find(tid);
    if (it != transfers.end() && a.reason != FailureReason::kCancelled && a.reason != FailureReason::kCapacity) {
      peers[it->second.peer].health->recordFailure();
      cv.SignalAll();  // the peer's state is looked at after this transfer's actions (updatePeerState)
    }
    log.warn("kv transfer failed", {{"transfer", tid},
                                    {"peer", it != transfers.end() ? peers[it->second.peer].name : std::string()},
                                    {"reason", kvproto::failureReasonName(a.reason)},
                                    {"detail", a.message}});
  }

  void completeImport(Entry& e, uint32_t first_token) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    metrics.bytes.increment(static_cast<double>(e.tr.numLayerBlocks() * layout.bytesPerLayerBlock()));
    metrics.seconds.observe(std::chrono::duration<double>(clock.now() - e.tr.started()).count());
    metrics.inflight.decrement();
    e.inflight_counted = false;
    loop.post(
        [id = *e.id, first_token](engine::Engine& eng) { eng.completeImport(id, static_cast<TokenId>(first_token)); });
  }

  // The only place a failed import is ended (the state machine emits it
  // once no pull is outstanding).
  void endImport(const Entry& e, const std::string& message) {
    if (!e.id) {
      loop.cancel(e.handle, e.end_reason);  // still queued in the engine
      return;
    }
    loop.post([id = *e.id, msg = message, why = e.end_reason](engine::Engine& eng) {
      if (!eng.abortImport(id, why, msg)) eng.cancel(id, why, msg);
    });
  }

  void fail(uint64_t tid, Entry& e, FailureReason reason, std::string_view message, bool tell_peer = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    TransferActions actions;
    e.tr.fail(reason, message, tell_peer, actions);
    apply(tid, e, actions);
  }

  // ------------------------------------------------------------- events --

  // Brings tandem_kv_transfer_gets_total up to the transport's count (only
  // pulls issue gets on this transport).
  void countGets() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const uint64_t issued = t->ucxGetsIssued();
    metrics.gets.increment(static_cast<double>(issued - gets_counted));
    gets_counted = issued;
  }

  // Transport thread: a pull completed, failed or was cancelled.
  void onPullDone(uint64_t tid, const TransferAction& pull, const absl::Status& s) {
    absl::MutexLock lock(&mu);
    countGets();
    auto it = transfers.find(tid);
    if (it == transfers.end()) return;
    Entry& e = it->second;
    e.gets.erase(pull.pull);
    const MonoTime now = clock.now();
    const bool verify = s.ok() && e.tr.verifying() && e.tr.state() == TransferState::kPulling;
    if (verify && region_on_device) {
      // The blocks landed in device memory (EngineOptions::kv_direct): their
      // checksums are computed there, on the engine thread, and the pull is
      // done once they are. Until then the transfer counts it outstanding,
      // so a failure meanwhile ends the import only after it.
      for (size_t i = pull.first; i < pull.first + pull.count; ++i) {
        landed_blocks.push_back({.layer = static_cast<int32_t>(pull.layer), .block = e.tr.dBlocks()[i]});
      }
      landed.push_back({.tid = tid, .pull = pull, .done_at = now});
      e.tr.pullLanded(pull.pull);
      if (!check_posted) {
        check_posted = true;
        loop.post([self = shared_from_this()](engine::Engine& eng) { self->checkLandedPulls(eng); });
      }
      return;
    }
    std::vector<uint64_t> checksums;
    if (verify) {
      for (size_t i = pull.first; i < pull.first + pull.count; ++i) {
        checksums.push_back(kvproto::layerBlockChecksum({localBlock(e, pull.layer, i), layout.bytesPerLayerBlock()}));
      }
      metrics.checksum_checked.increment(static_cast<double>(pull.count));
    }
    TransferActions actions;
    e.tr.pullDone(pull.pull, s, checksums, now, actions);
    apply(tid, e, actions);
  }

  // Engine thread: the checks of every pull into device memory that landed
  // since the last time (onPullDone), in one launch.
  void checkLandedPulls(engine::Engine& eng) {
    std::vector<LandedPull> pulls;
    std::vector<engine::KvLayerBlock> blocks;
    {
      absl::MutexLock lock(&mu);
      pulls.swap(landed);
      blocks.swap(landed_blocks);
      check_posted = false;
    }
    std::vector<uint64_t> sums(blocks.size());
    const absl::Status st = eng.kvRegionChecksums(blocks, sums);
    absl::MutexLock lock(&mu);
    size_t at = 0;
    for (const LandedPull& p : pulls) {
      pullChecked(p.tid, p.pull, p.done_at, st, std::span<const uint64_t>(sums).subspan(at, p.pull.count));
      at += p.pull.count;
    }
  }

  // A pull into device memory, checked: `sums` are its blocks' checksums
  // (when `st` is OK); `done_at` is when its get completed.
  void pullChecked(uint64_t tid, const TransferAction& pull, MonoTime done_at, const absl::Status& st,
                   std::span<const uint64_t> sums) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = transfers.find(tid);
    if (it == transfers.end()) return;
    Entry& e = it->second;
    if (st.ok()) metrics.checksum_checked.increment(static_cast<double>(pull.count));
    TransferActions actions;
    e.tr.pullDone(pull.pull,
                  st.ok() ? st
                          : absl::Status(st.code(),
                                         strCat("checksumming the pulled blocks on the device: ", toStd(st.message()))),
                  st.ok() ? sums : std::span<const uint64_t>(), done_at, actions);
    apply(tid, e, actions);
  }

  // Peer `p` cannot serve this agent: every transfer on `c` fails now, and
  // new ones until it reconnects.
  void markIncompatible(size_t p, ConnId c, std::string why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    // Once per peer and reason: a peer that keeps refusing this agent is
    // asked again at every heartbeat.
    if (std::string& said = incompatible_logged[peers[p].name]; said != why) {
      log.error("no transfer can work", {{"peer", peers[p].name}, {"detail", why}});
      said = why;
    }
    peers[p].incompatible = std::move(why);
    for (auto& [tid, e] : transfers) {
      if (e.conn == c) fail(tid, e, FailureReason::kTransferFailed, *peers[p].incompatible);
    }
  }

  void onHello(size_t p, ConnId c, const kvproto::Hello& h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (h.role != kvproto::PeerRole::kPrefill) {
      log.error("the prefill peer's Hello names another role",
                {{"peer", h.peer_name}, {"role", kvproto::peerRoleName(h.role)}});
      metrics.rejected("unexpected_type");
      return;
    }
    if (auto no = refusePeer(model, layout, h)) {
      metrics.rejected(no->reason);
      return markIncompatible(p, c, std::move(no->message));
    }
    if (h.num_layers != layout.num_layers || h.block_size != layout.block_size ||
        h.num_kv_heads != layout.num_kv_heads || h.head_dim != layout.head_dim) {
      return markIncompatible(
          p, c,
          strCat("the prefill peer ", h.peer_name, " has a different KV layout (", h.num_layers, " layers, block size ",
                 h.block_size, ", ", h.num_kv_heads, " kv heads, head_dim ", h.head_dim, ") than this agent (",
                 layout.num_layers, ", ", layout.block_size, ", ", layout.num_kv_heads, ", ", layout.head_dim,
                 "): do both serve the same model?"));
    }
    peers[p].incompatible.reset();
    peers[p].hello = h;
    t->setRemoteRegion(
        c, h.region_base,
        static_cast<uint64_t>(h.num_blocks) * static_cast<uint64_t>(h.num_layers) * layout.bytesPerLayerBlock(),
        h.rkey);
    const MonoTime now = clock.now();
    for (auto& [tid, e] : transfers) {
      if (e.conn != c) continue;
      TransferActions actions;
      e.tr.peerReady(h.num_blocks, now, actions);
      apply(tid, e, actions);
    }
  }

  // A well-formed message from the prefill peer about one transfer.
  void onTransferMessage(ConnId c, kvproto::Message& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = transfers.find(m.transfer_id);
    if (it == transfers.end() || it->second.conn != c) {
      // Also P's messages that crossed this side's abort of the transfer.
      log.debug("message for an unknown transfer", {{"transfer", m.transfer_id}});
      metrics.rejected("unknown_transfer");
      return;
    }
    const uint64_t tid = it->first;
    Entry& e = it->second;
    const MonoTime now = clock.now();
    TransferActions actions;
    if (auto* a = std::get_if<kvproto::PrefillAccepted>(&m.body)) {
      // Finish (or fail) with a margin before P's lease ends.
      const MonoTime lease_end = now + std::chrono::milliseconds(static_cast<int64_t>(a->lease_ms) * 9 / 10);
      const int64_t cached = std::min<int64_t>(a->num_cached_tokens, static_cast<int64_t>(e.prompt.size()));
      e.tr.accepted(std::move(a->block_ids), lease_end, now, actions);
      // From now on P gets time in proportion to the tokens it computes.
      e.accepted_at = now;
      e.computed_tokens = static_cast<int64_t>(e.prompt.size()) - cached;
      e.tr.tightenDeadline(now + peers[e.peer].rate.budget(e.computed_tokens));
      cv.SignalAll();  // the lease margin or the new deadline may be the next one
    } else if (auto* l = std::get_if<kvproto::LayerReady>(&m.body)) {
      e.tr.layerReady(std::move(*l), now, actions);
    } else if (auto* d = std::get_if<kvproto::PrefillDone>(&m.body)) {
      e.tr.prefillDone(d->first_token, now, actions);
    } else if (auto* ab = std::get_if<kvproto::Abort>(&m.body)) {
      e.tr.fail(ab->reason, ab->message, /*tell_peer=*/false, actions);  // P ended it already
    }
    apply(tid, e, actions);
  }

  void onMessage(ConnId c, std::vector<uint8_t> bytes) {
    absl::MutexLock lock(&mu);
    if (transport_closed.load()) return;
    const std::optional<size_t> p = peers.byConn(c);
    // Only the connections this agent opened to its prefill peers speak for
    // P; one accepted on its own listener was closed at once (onAccept) and
    // what it sent meanwhile is dropped.
    if (!p) return;
    auto hs_it = handshakes.find(c);
    if (hs_it == handshakes.end()) return;  // closed by this side
    Handshake& hs = hs_it->second;
    const uint32_t peer_blocks = peers[*p].hello ? peers[*p].hello->num_blocks : UINT32_MAX;
    auto m =
        kvproto::decode(bytes, {.num_blocks = peer_blocks, .num_layers = static_cast<uint16_t>(layout.num_layers)});
    if (!m.ok()) {
      if (hs.state != Handshake::State::kDone) {
        return authFailed(*p, c, hs, "malformed",
                          strCat("the prefill peer ", peers[*p].name, " sent a malformed message before "
                                 "authenticating: ", toStd(m.status().message())));
      }
      log.warn("rejected a control message", {{"error", toStd(m.status().message())}});
      metrics.rejected("malformed");
      return;
    }
    if (auto* ch = std::get_if<kvproto::AuthChallenge>(&m->body)) return onChallenge(*p, c, hs, *ch);
    if (hs.state != Handshake::State::kDone) {
      if (auto* ab = std::get_if<kvproto::Abort>(&m->body); ab && hs.state == Handshake::State::kAwaitingChallenge) {
        // P refused this agent's handshake and says why.
        return authFailed(*p, c, hs, "refused_by_peer",
                          strCat("the prefill peer ", peers[*p].name, " refused this agent: ", ab->message));
      }
      auth_failures.report(t->peerAddress(c), "unauthenticated",
                           strCat("the prefill peer ", peers[*p].name, " sent message type ",
                                  static_cast<int>(kvproto::typeOf(m->body)), " before authenticating"));
      return;
    }
    if (std::holds_alternative<kvproto::Pong>(m->body)) {
      if (std::optional<Duration> rtt = peers[*p].health->heartbeatAnswered(m->transfer_id)) {
        metrics.heartbeatAnswered(peers[*p].name, std::chrono::duration<double>(*rtt).count());
      }
      updatePeerState(*p);
    } else if (auto* h = std::get_if<kvproto::Hello>(&m->body)) {
      onHello(*p, c, *h);
    } else if (std::holds_alternative<kvproto::PrefillAccepted>(m->body) ||
               std::holds_alternative<kvproto::LayerReady>(m->body) ||
               std::holds_alternative<kvproto::PrefillDone>(m->body) ||
               std::holds_alternative<kvproto::Abort>(m->body)) {
      onTransferMessage(c, *m);
    } else {
      log.warn("unexpected message for the decode role", {{"type", static_cast<int>(kvproto::typeOf(m->body))}});
      metrics.rejected("unexpected_type");
    }
  }

  // P answered this side's AuthHello: prove the key in turn, then say
  // Hello and send what waited.
  void onChallenge(size_t p, ConnId c, Handshake& hs, const kvproto::AuthChallenge& ch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (hs.state != Handshake::State::kAwaitingChallenge || !hs.connector) {
      auth_failures.report(t->peerAddress(c), "unauthenticated",
                           strCat("an unexpected AuthChallenge from the prefill peer ", peers[p].name));
      return;
    }
    auto r = hs.connector->onChallenge(ch);
    if (auto* f = std::get_if<auth::AuthFailure>(&r)) {
      return authFailed(p, c, hs, f->reason,
                        strCat("cannot authenticate the prefill peer ", peers[p].name, ": ", f->message));
    }
    hs.state = Handshake::State::kDone;
    hs.connector.reset();
    t->send(c, kvproto::encode({0, std::move(std::get<kvproto::AuthProof>(r))}));
    kvproto::Message hello{.transfer_id = 0,
                           .body = helloFor(kvproto::PeerRole::kDecode, model, layout, *t, "decode")};
    t->send(c, kvproto::encode(hello));
    for (std::vector<uint8_t>& q : hs.queued) t->send(c, std::move(q));
    hs.queued.clear();
  }

  // The handshake with peer `p` failed: nothing more goes to it on `c`, and
  // its transfers fail now rather than at their deadline.
  // The connection is closed and forgotten (close() reports no
  // disconnect); `incompatible` stays until the next connection, which the
  // next heartbeat opens (a rotated key is picked up then).
  void authFailed(size_t p, ConnId c, Handshake& hs, std::string_view reason, std::string message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auth_failures.report(t->peerAddress(c), reason, message);
    hs.state = Handshake::State::kFailed;
    hs.connector.reset();
    hs.queued.clear();
    markIncompatible(p, c, std::move(message));
    t->close(c);
    handshakes.erase(c);  // `hs` is gone from here on
    if (peers[p].conn == c) {
      peers[p].conn = 0;
      peers[p].hello.reset();
    }
  }

  // A connection to this agent's own KV listener: no role connects to a
  // decode agent, so it is closed at once.
  void onAccept(ConnId c) {
    absl::MutexLock lock(&mu);
    if (transport_closed.load()) return;
    auth_failures.report(t->peerAddress(c), "unauthenticated",
                         "a connection to the decode agent's KV listener, which serves no one");
    t->close(c);
  }

  // Handshakes with prefill peers that have not answered in time (a hung
  // agent, or one of kvproto < 4 that ignores the AuthHello).
  void failLateHandshakes(MonoTime now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::vector<ConnId> late;
    for (const auto& [c, h] : handshakes) {
      if (h.state == Handshake::State::kAwaitingChallenge && h.started + kHandshakeTimeout <= now) late.push_back(c);
    }
    for (ConnId c : late) {
      const std::optional<size_t> p = peers.byConn(c);
      if (!p) {
        handshakes.erase(c);
        continue;
      }
      authFailed(*p, c, handshakes[c], "handshake_timeout",
                 strCat("the prefill peer ", peers[*p].name, " did not answer the authentication handshake within ",
                        absl::FormatDuration(absl::FromChrono(kHandshakeTimeout)),
                        " (hung, or of kvproto < 4: upgrade prefill and decode agents together)"));
    }
  }

  void onDisconnect(ConnId c, const absl::Status& why) {
    absl::MutexLock lock(&mu);
    handshakes.erase(c);
    if (auto p = peers.byConn(c)) {
      // What its Hello said holds for this connection only: the next one
      // (e.g. to a restarted P) says it again.
      peers[*p].conn = 0;
      peers[*p].incompatible.reset();
    }
    for (auto& [tid, e] : transfers) {
      if (e.conn == c)
        fail(tid, e, FailureReason::kPeerUnhealthy, strCat("prefill peer disconnected: ", toStd(why.message())));
    }
  }

  // ----------------------------------------------------------- watchdog --

  // When the watchdog must next act: the earliest transfer deadline, and
  // each peer's next heartbeat.
  MonoTime nextWake() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    // A directory that changes (discovery) is looked at every second.
    MonoTime next = options.prefill_peers->dynamic() ? clock.now() + std::chrono::seconds(1) : MonoTime::max();
    for (size_t p = 0; p < peers.size(); ++p) {
      if (!heartbeats(p)) continue;
      next = std::min(next, peers[p].health->nextHeartbeat(peers[p].num_inflight > 0));
    }
    for (const auto& [tid, e] : transfers) {
      if (auto d = e.tr.nextDeadline(); d && *d < next) next = *d;
    }
    return next;
  }

  // A peer gets heartbeats while it is a member or still has transfers.
  bool heartbeats(size_t p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return peers[p].member || peers[p].num_inflight > 0;
  }

  // The directory's current list: new prefill agents are connected, those
  // that left are no longer chosen (what they have in flight finishes).
  void syncPeers() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::vector<bool> was(peers.size());
    for (size_t p = 0; p < peers.size(); ++p) was[p] = peers[p].member;
    const std::vector<size_t> joined = peers.sync(options.prefill_peers->prefillPeers());
    for (size_t p = 0; p < was.size(); ++p) {
      if (was[p] != peers[p].member) {
        log.info(peers[p].member ? "prefill agent is back in the directory" : "prefill agent left the directory",
                 {{"peer", peers[p].name}, {"in_flight", static_cast<int64_t>(peers[p].num_inflight)}});
      }
    }
    for (size_t p : joined) {
      log.info("prefill agent joined the directory", {{"peer", peers[p].name}});
      metrics.peerState(peers[p].name, PeerState::kHealthy);
      ensureConnected(p);
    }
  }

  void watch() {
    absl::MutexLock lock(&mu);
    while (!stopping) {
      clock.waitUntil(cv, mu, nextWake());
      if (stopping) break;
      if (options.prefill_peers->dynamic()) syncPeers();
      const MonoTime now = clock.now();
      for (size_t p = 0; p < peers.size(); ++p) {
        if (!heartbeats(p)) continue;
        PeerHealth& health = *peers[p].health;
        if (now < health.nextHeartbeat(peers[p].num_inflight > 0)) continue;
        // (Reconnecting if needed, so a peer that went away can come back.)
        health.heartbeatSent(++next_heartbeat);
        send(ensureConnected(p), next_heartbeat, kvproto::Ping{});
      }
      for (auto& [tid, e] : transfers) {
        TransferActions actions;
        e.tr.tick(now, actions);
        apply(tid, e, actions);
      }
      failLateHandshakes(now);
      for (size_t p = 0; p < peers.size(); ++p) updatePeerState(p);
    }
  }

  // ------------------------------------------------------------ liveness --

  // Logs and shows a change of peer `p`'s state; one that is no longer
  // healthy loses the requests it has not accepted.
  void updatePeerState(size_t p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    PrefillPeers::Peer& peer = peers[p];
    const PeerState state = peer.health->state();
    if (state == peer.reported) return;
    peer.reported = state;
    metrics.peerState(peer.name, state);
    if (state == PeerState::kHealthy) {
      log.info("prefill peer answers again; using it", {{"peer", peer.name}});
      return;
    }
    log.warn("prefill peer is not healthy; it gets no new requests, and those it has not accepted move",
             {{"peer", peer.name},
              {"state", std::string(peerStateName(state))},
              {"missed_heartbeats", static_cast<int64_t>(peer.health->numMissedHeartbeats())}});
    for (auto& [tid, e] : transfers) {
      if (e.peer == p && !e.local && e.tr.state() == TransferState::kRequested) {
        moveOff(tid, e, peerStateName(state), e.tr.dBlocks());
      }
    }
  }

  // Whether a transfer that failed and ended (no pull outstanding) is tried
  // again elsewhere, and why (the failover metric's reason): its peer missed
  // the deadline or went away. Not a cancel, a refusal or a bad transfer.
  std::optional<std::string_view> failoverReason(const Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (stopping || transport_closed.load() || !e.id || e.local || e.end_reason != engine::FinishReason::kError) {
      return std::nullopt;
    }
    if (e.tr.failure() == FailureReason::kPrefillTimeout) return "deadline";
    if (e.tr.failure() == FailureReason::kPeerUnhealthy) return "disconnected";
    return std::nullopt;
  }

  // Moves transfer `tid`, admitted here with `blocks`, off its peer (`why`:
  // it is not healthy and has not accepted, or the transfer failed and
  // every pull of it is over) to another healthy peer it was not moved off
  // before, or else to local prefill. A peer that was asked and has not
  // answered is told (if it ever reads it, it frees what it computed).
  void moveOff(uint64_t tid, Entry& e, std::string_view why, std::vector<BlockId> blocks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (e.tr.state() == TransferState::kRequested) {
      send(e.conn, tid, kvproto::Abort{FailureReason::kPeerUnhealthy, "moved to another prefill peer"});
    }
    if (e.moved_from.empty()) e.moved_from = peers[e.peer].name;
    e.left.push_back(e.peer);
    uncountPeer(e);
    e.tr = DecodeTransfer(layout.num_layers, e.tr.verifying());
    std::optional<size_t> q = peers.choose(std::nullopt, e.left);
    // One known not to serve this agent would fail it again: compute it here.
    if (q && peers[*q].incompatible) q.reset();
    if (!q) {
      metrics.failover(why, "local");
      e.local = true;
      e.conn = 0;
      if (e.inflight_counted) metrics.inflight.decrement();
      e.inflight_counted = false;
      log.info("computing a request here: no prefill peer is healthy", {{"transfer", tid}, {"from", e.moved_from}});
      loop.post([id = *e.id](engine::Engine& eng) { eng.computeImportLocally(id); });
      return;
    }
    metrics.failover(why, "peer");
    e.peer = *q;
    e.peer_counted = true;
    peers[*q].num_inflight++;
    startTransfer(tid, e, std::move(blocks));
  }

  // Asks e.peer for the prompt that the engine gave `blocks`.
  void startTransfer(uint64_t tid, Entry& e, std::vector<BlockId> blocks) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const MonoTime now = clock.now();
    TransferActions actions;
    e.conn = ensureConnected(e.peer);
    const PrefillPeers::Peer& peer = peers[e.peer];
    if (peer.incompatible) return fail(tid, e, FailureReason::kTransferFailed, *peer.incompatible, /*tell_peer=*/false);
    e.tr.admitted(std::move(blocks), now, now + options.prefill_timeout, actions);
    if (peer.hello) e.tr.peerReady(peer.hello->num_blocks, now, actions);
    apply(tid, e, actions);
  }

  // ------------------------------------------------------------ requests --

  uint64_t submit(engine::RequestSpec spec, const RouteHint& hint, PdUpdateCallback cb) {
    const std::string_view named = hint.prefill_peer;
    const uint64_t tid = next_tid.fetch_add(1);
    {
      absl::MutexLock lock(&mu);
      const std::optional<size_t> p = peers.choose(peers.find(named));
      if (!p) {
        // Every prefill peer is unhealthy: compute the prompt here rather than fail.
        return loop.submit(std::move(spec), [cb = std::move(cb)](const engine::RequestUpdate& u) {
          cb(u, PdInfo{.path = PdPath::kFallback});
        });
      }
      const bool verify = std::uniform_real_distribution<double>(0, 1)(rng) < options.checksum_rate;
      Entry& e = transfers.try_emplace(tid, Entry{.tr = DecodeTransfer(layout.num_layers, verify)}).first->second;
      e.cb = std::move(cb);
      e.prompt = spec.prompt;
      e.sampling = spec.sampling;
      e.peer = *p;
      e.peer_counted = true;
      peers[*p].num_inflight++;
    }
    spec.import_kv = true;
    spec.direct_max_suffix_tokens = options.direct_max_suffix_tokens;
    if (hint.path == PdPath::kDirect) spec.direct_max_suffix_tokens = std::numeric_limits<int>::max();
    if (hint.path == PdPath::kDisagg) spec.direct_max_suffix_tokens = 0;
    uint64_t handle = loop.submit(
        std::move(spec), [self = shared_from_this(), tid](const engine::RequestUpdate& u) { self->onUpdate(tid, u); });
    absl::MutexLock lock(&mu);
    if (auto it = transfers.find(tid); it != transfers.end()) it->second.handle = handle;
    by_handle[handle] = tid;
    return handle;
  }

  // Engine thread: the engine admitted the import and gave it blocks.
  void onAdmitted(uint64_t tid, Entry& e, const engine::RequestUpdate& u) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    e.id = u.id;
    const MonoTime now = clock.now();
    TransferActions actions;
    if (e.tr.state() != TransferState::kQueued) {
      // It failed while still queued here: the end posted then may have
      // come too early (it only ends an importing request); end it again.
      e.tr.admitted(u.kv_blocks, now, now, actions);
      return apply(tid, e, actions);
    }
    // Its peer may have stopped being healthy while the request queued here.
    const PeerState state = peers[e.peer].health->state();
    if (state != PeerState::kHealthy) return moveOff(tid, e, peerStateName(state), u.kv_blocks);
    startTransfer(tid, e, u.kv_blocks);
  }

  // Engine thread: what the client's callback learns with this update.
  PdInfo infoFor(Entry& e, const engine::RequestUpdate& u) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    PdInfo info{.failure = e.tr.failure(),
                .path = e.local ? PdPath::kFallback : e.id ? PdPath::kDisagg : PdPath::kDirect,
                .moved_from_peer = e.moved_from};
    if (e.id && !e.local) info.prefill_peer = peers[e.peer].name;
    if (!e.tr.timings() || !e.tr.kvDoneAt()) return info;
    if (!e.timings && !u.new_tokens.empty()) {
      e.timings = e.tr.timings();
      // Ends at the engine's first-token time (the trace's TTFT), not now.
      const MonoTime first = u.first_token.value_or(clock.now());
      e.timings->first_step_ms = std::chrono::duration<double, std::milli>(first - *e.tr.kvDoneAt()).count();
      metrics.phases(*e.timings);
    }
    info.timings = e.timings ? e.timings : e.tr.timings();
    return info;
  }

  // Engine thread.
  void onUpdate(uint64_t tid, const engine::RequestUpdate& u) {
    PdUpdateCallback cb;
    PdInfo info;
    {
      absl::MutexLock lock(&mu);
      auto it = transfers.find(tid);
      if (it == transfers.end()) return;
      Entry& e = it->second;
      if (!u.kv_blocks.empty()) return onAdmitted(tid, e, u);
      if (u.import_abort_requested && e.local) {
        // Asked while computeImportLocally was on its way: end it as asked.
        loop.post([id = *e.id, why = u.finish_reason, msg = u.message](engine::Engine& eng) {
          if (!eng.abortImport(id, why, msg)) eng.cancel(id, why, msg);
        });
        return;
      }
      if (u.import_abort_requested) {
        // Ends as asked (e.g. cancelled: the client went away), not as an error.
        e.end_reason = u.finish_reason;
        return fail(tid, e, FailureReason::kCancelled,
                    strCat("the request was ended (", engine::finishReasonName(u.finish_reason), ")"));
      }
      // Served here without an import (direct-to-D, or refused): its P
      // computes nothing for it.
      if (!e.id) uncountPeer(e);
      cb = e.cb;
      info = infoFor(e, u);
      if (u.finished) {
        if (e.inflight_counted) metrics.inflight.decrement();
        uncountPeer(e);
        by_handle.erase(e.handle);
        transfers.erase(it);
      }
    }
    if (cb) cb(u, info);
  }
};

absl::StatusOr<std::unique_ptr<DecodeService>> DecodeService::start(const PdEnv& env, const PdOptions& options) {
  if (!options.prefill_peers || (!options.prefill_peers->dynamic() && options.prefill_peers->prefillPeers().empty()))
    return absl::InvalidArgumentError("decode role: no prefill peer configured (--prefill-peers HOST:PORT[,...])");
  auto impl = std::make_shared<Impl>(env, options);
  Impl* raw = impl.get();
  std::span<std::byte> region;
  env.loop.runOnLoop([&](engine::Engine& e) {
    raw->layout = e.kvRegionLayout();
    raw->model = {.fingerprint = options.model_fingerprint,
                  .hash_root = e.blockHashRoot(),
                  .tensor_parallel = options.tensor_parallel};
    region = e.kvRegion();
    raw->region_on_device = e.kvRegionOnDevice();
  });
  raw->region = region.data();
  transport::TransportCallbacks cb;
  cb.on_accept = [raw](ConnId c) { raw->onAccept(c); };
  cb.on_message = [raw](ConnId c, std::vector<uint8_t> b) { raw->onMessage(c, std::move(b)); };
  cb.on_disconnect = [raw](ConnId c, absl::Status s) { raw->onDisconnect(c, s); };
  TANDEM_RETURN_IF_ERROR(startKvTransport(env, options, region, std::move(cb),
                                          [raw](std::unique_ptr<transport::KvTransport> t) {
                                            absl::MutexLock lock(&raw->mu);
                                            raw->t = std::move(t);
                                          }));
  {
    absl::MutexLock lock(&raw->mu);
    for (size_t p = 0; p < raw->peers.size(); ++p) {
      // Discovery may already list prefill agents when this one starts:
      // they joined as much as those that come later.
      if (options.prefill_peers->dynamic()) raw->log.info("prefill agent joined the directory", {{"peer", raw->peers[p].name}});
      raw->metrics.peerState(raw->peers[p].name, PeerState::kHealthy);
      raw->ensureConnected(p);
    }
  }
  impl->watchdog = std::thread([raw] { raw->watch(); });
  return std::unique_ptr<DecodeService>(new DecodeService(std::move(impl)));
}

DecodeService::DecodeService(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

DecodeService::~DecodeService() {
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->stopping = true;
    // Cancels each transfer's gets and tells P (the transport still runs);
    // a request moved to local prefill is no transfer any more: just ended.
    for (auto& [tid, e] : impl_->transfers) {
      if (e.local) {
        impl_->loop.post([id = *e.id](engine::Engine& eng) {
          eng.cancel(id, engine::FinishReason::kCancelled, "the agent is shutting down");
        });
      } else {
        impl_->fail(tid, e, FailureReason::kCancelled, "the agent is shutting down");
      }
    }
    impl_->cv.SignalAll();
  }
  impl_->watchdog.join();
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->transport_closed = true;
  }
  // Shutting the transport down completes every outstanding get
  // (cancelled); their callbacks post the abortImports. Requests still live
  // after this end when the engine loop stops; their callbacks keep impl_ alive.
  impl_->t->shutdown();  // joins the transport's threads; `t` stays valid for callers until then
  impl_->t.reset();
}

uint64_t DecodeService::submit(engine::RequestSpec spec, PdUpdateCallback on_update, const RouteHint& hint) {
  return impl_->submit(std::move(spec), hint, std::move(on_update));
}

absl::Status DecodeService::checkPrefillPeer(std::string_view name) const {
  absl::MutexLock lock(&impl_->mu);
  if (impl_->peers.find(name)) return absl::OkStatus();
  // Discovery: the router may know a prefill agent a moment before this
  // agent does. The hint is then ignored (D picks one of its own members);
  // an address not in the directory is never connected to.
  if (impl_->options.prefill_peers->dynamic()) return absl::OkStatus();
  std::string known;
  for (size_t p = 0; p < impl_->peers.size(); ++p) known += strCat(p ? ", " : "", impl_->peers[p].name);
  return absl::InvalidArgumentError(
      strCat("prefill peer \"", name, "\" is not one of this decode agent's prefill peers (", known, ")"));
}

void DecodeService::cancel(uint64_t handle) { impl_->loop.cancel(handle); }

int DecodeService::port() const { return impl_->t->port(); }

}  // namespace tandem::agent
