#include "agent/prefill_service.h"

#include <atomic>
#include <deque>
#include <map>
#include <set>
#include <unordered_map>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/pd_metrics.h"
#include "src/auth/kv_handshake.h"
#include "src/common/log.h"
#include "src/common/strings.h"

namespace tandem::agent {

using kvproto::FailureReason;
using transport::ConnId;

struct PrefillService::Impl : std::enable_shared_from_this<PrefillService::Impl> {
  // A transfer is named by D's connection and D's transfer id.
  using Key = std::pair<ConnId, uint64_t>;
  struct Transfer {
    uint64_t lease_id = 0;
    uint64_t handle = 0;  // the engine loop's
    std::vector<BlockId> blocks;
    bool finished = false;  // the engine request ended
    bool leased = false;    // finished well: its KV is pinned until Release, Abort or lease_end
    MonoTime lease_end;
    uint64_t request_id = 0;  // the engine's, once admitted (by_request's key)
  };
  // Transfers D ended (Release or Abort) that P does not hold: normally
  // ones already over here, but possibly an Abort that overtook its
  // PrefillRequest. Such a request is refused when it arrives rather than
  // computed and pinned for nobody until the lease runs out. Kept for one
  // lease TTL (a later request would be dropped by lease expiry anyway), at
  // most kMaxEnded (the oldest is forgotten first).
  static constexpr size_t kMaxEnded = 1 << 16;

  engine::EngineLoop& loop;
  PdMetrics& metrics;
  const Clock& clock;
  const PdOptions options;
  Logger log{"prefill"};
  engine::KvLayout layout;  // the region's (Engine::kvRegionLayout)
  ModelIdentity model;      // set at start, before the transport exists
  std::unique_ptr<transport::KvTransport> t;
  std::function<void(const engine::RequestUpdate&)> on_finished;
  std::atomic<uint64_t> next_lease{1};
  // The service is shutting down: nothing is sent any more (set under mu,
  // so an engine callback holding mu either sent before or sees it).
  std::atomic<bool> stopping{false};

  absl::Mutex mu;
  std::map<Key, Transfer> transfers ABSL_GUARDED_BY(mu);
  std::unordered_map<uint64_t, Key> by_request ABSL_GUARDED_BY(mu);  // engine RequestId -> transfer
  // Leased transfers by the end of their lease, so the ones D neither
  // released nor aborted are forgotten once it passed.
  std::multimap<MonoTime, Key> lease_ends ABSL_GUARDED_BY(mu);
  std::deque<std::pair<MonoTime, Key>> ended_order ABSL_GUARDED_BY(mu);  // (forget after, transfer)
  std::set<Key> ended ABSL_GUARDED_BY(mu);
  // Decode agents whose Hello this side refused (another protocol version,
  // model, hash root or tensor-parallel shard), with why: their prefill
  // requests are aborted.
  std::unordered_map<ConnId, std::string> refused ABSL_GUARDED_BY(mu);
  // Each connection's handshake (src/auth/kv_handshake.h): nothing but the
  // handshake is taken from a connection until its acceptor authenticated().
  std::unordered_map<ConnId, auth::KvAuthAcceptor> handshakes ABSL_GUARDED_BY(mu);
  AuthFailureLog auth_failures{metrics, "prefill"};
  // Accepted connections not yet authenticated, with when they were
  // accepted (ConnIds grow: the oldest first). One that has not finished
  // the handshake kHandshakeTimeout after it was accepted is closed, and at
  // most kMaxUnauthenticated wait at once (then the oldest goes): a peer
  // cannot hold endpoints by connecting and saying nothing. Swept at each
  // accept and each message (decode agents' heartbeats arrive every few
  // seconds).
  static constexpr Duration kHandshakeTimeout = std::chrono::seconds(10);
  static constexpr size_t kMaxUnauthenticated = 1024;
  std::map<ConnId, MonoTime> unauthenticated ABSL_GUARDED_BY(mu);
  // Connections this side closed (close() reports no disconnect): what they
  // sent before the close took effect is dropped, not taken as a new
  // handshake. The oldest are forgotten beyond kMaxClosed.
  static constexpr size_t kMaxClosed = 1 << 14;
  std::set<ConnId> closed ABSL_GUARDED_BY(mu);

  Impl(const PdEnv& env, const PdOptions& o) : loop(env.loop), metrics(env.metrics), clock(env.clock), options(o) {}

  void send(ConnId conn, uint64_t tid, kvproto::Body body) {
    if (stopping.load()) return;
    t->send(conn, kvproto::encode({tid, std::move(body)}));
  }

  // Engine thread: layer `layer` of these prefills is in the cache.
  void onLayer(int layer, std::span<const engine::Engine::LayerReady> ready) {
    absl::MutexLock lock(&mu);
    for (const auto& r : ready) {
      auto k = by_request.find(r.id.value());
      if (k == by_request.end()) continue;
      // Built in place: the checksums are not copied again on the way out.
      kvproto::Message out{.transfer_id = k->second.second};
      auto& msg = out.body.emplace<kvproto::LayerReady>();
      msg.layer = static_cast<uint16_t>(layer);
      msg.first_block = static_cast<uint32_t>(r.first_block);
      // The engine's checksums of what decode agents read (computed on the
      // device for a pool UCX reads there).
      msg.checksums.assign(r.checksums.begin(), r.checksums.end());
      if (!stopping.load()) t->send(k->second.first, kvproto::encode(out));
    }
  }

  static engine::RequestSpec prefillSpec(const kvproto::PrefillRequest& req) {
    engine::RequestSpec spec;
    spec.prompt.assign(req.tokens.begin(), req.tokens.end());
    spec.sampling.temperature = req.temperature;
    spec.sampling.top_p = req.top_p;
    spec.sampling.top_k = static_cast<int>(req.top_k);
    spec.sampling.seed = req.seed;
    spec.sampling.max_tokens = 1;
    spec.sampling.ignore_eos = true;  // P only samples the first token; D decides about EOS
    return spec;
  }

  void onPrefillRequest(ConnId conn, uint64_t tid, const kvproto::PrefillRequest& req) {
    engine::RequestSpec spec = prefillSpec(req);
    const MonoTime now = clock.now();
    auto ttl = options.lease_ttl;
    if (req.lease_ms > 0) ttl = std::min(ttl, std::chrono::milliseconds(req.lease_ms));
    const uint64_t lease_id = next_lease.fetch_add(1);
    const MonoTime lease_end = now + ttl;
    spec.lease = engine::LeaseSpec{lease_id, lease_end};
    if (req.deadline_ms > 0) spec.deadline = now + std::chrono::milliseconds(req.deadline_ms);
    const Key key{conn, tid};
    {
      absl::MutexLock lock(&mu);
      forgetExpired(now);
      if (ended.contains(key)) {
        log.warn("refused a prefill request that its decode agent already ended", {{"conn", conn}, {"transfer", tid}});
        metrics.rejected("after_end");
        return;
      }
      if (transfers.contains(key)) {
        send(conn, tid, kvproto::Abort{FailureReason::kTransferFailed, "duplicate transfer id"});
        return;
      }
      transfers[key] = Transfer{.lease_id = lease_id, .lease_end = lease_end};
    }
    uint64_t handle =
        loop.submit(std::move(spec), [self = shared_from_this(), key, lease_end](const engine::RequestUpdate& u) {
          self->onUpdate(key, lease_end, u);
        });
    absl::MutexLock lock(&mu);
    if (auto it = transfers.find(key); it != transfers.end()) it->second.handle = handle;
  }

  // Forgets transfers whose lease ran out while D neither released nor
  // aborted them (a D that misbehaves; the engine already unpinned their
  // blocks), and ended transfers remembered long enough.
  void forgetExpired(MonoTime now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (auto it = lease_ends.begin(); it != lease_ends.end() && it->first <= now; it = lease_ends.erase(it)) {
      auto tr = transfers.find(it->second);
      if (tr != transfers.end() && tr->second.leased && tr->second.lease_end <= now) transfers.erase(tr);
    }
    while (!ended_order.empty() && (ended_order.front().first <= now || ended_order.size() >= kMaxEnded)) {
      ended.erase(ended_order.front().second);
      ended_order.pop_front();
    }
  }

  // Engine thread: the engine admitted the prefill of `tr` with its blocks.
  void onAdmitted(const Key& key, Transfer& tr, MonoTime lease_end, const engine::RequestUpdate& u)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    tr.blocks = u.kv_blocks;
    tr.request_id = u.id.value();
    by_request[u.id.value()] = key;
    kvproto::PrefillAccepted a;
    // What it had cached: D measures this agent's rate on what it computes.
    a.num_cached_tokens = static_cast<uint32_t>(std::max(0, u.num_cached_tokens));
    // What is left of the lease (it started when the request arrived).
    a.lease_ms = static_cast<uint32_t>(
        std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(lease_end - clock.now()).count()));
    for (BlockId b : tr.blocks) a.block_ids.push_back(static_cast<uint32_t>(b.value()));
    send(key.first, key.second, std::move(a));
  }

  // Engine thread: progress of the prefill of transfer `key`.
  void onUpdate(const Key& key, MonoTime lease_end, const engine::RequestUpdate& u) {
    absl::MutexLock lock(&mu);
    auto it = transfers.find(key);
    Transfer* tr = it == transfers.end() ? nullptr : &it->second;  // gone: D ended it already
    if (tr != nullptr && !u.kv_blocks.empty()) onAdmitted(key, *tr, lease_end, u);
    if (!u.finished) return;
    by_request.erase(u.id.value());
    if (on_finished) on_finished(u);
    if (tr == nullptr) return;
    tr->finished = true;
    const bool ok =
        (u.finish_reason == engine::FinishReason::kLength || u.finish_reason == engine::FinishReason::kEos) &&
        !tr->blocks.empty() && !u.new_tokens.empty();
    if (ok) {
      tr->leased = true;
      lease_ends.emplace(tr->lease_end, key);
      send(key.first, key.second, kvproto::PrefillDone{static_cast<uint32_t>(u.new_tokens.back())});
      return;
    }
    FailureReason reason =
        u.finish_reason == engine::FinishReason::kTimeout ? FailureReason::kPrefillTimeout
        : u.finish_reason == engine::FinishReason::kRejected && u.reject_reason != engine::RejectReason::kInvalid
            ? FailureReason::kCapacity
            : FailureReason::kTransferFailed;
    send(key.first, key.second,
         kvproto::Abort{reason, strCat("prefill ended: ", engine::finishReasonName(u.finish_reason), " ", u.message)});
    transfers.erase(it);
  }

  // D is done with (or gave up on) a transfer, or went away: unpin, or stop
  // the prefill. A Release or Abort for a transfer P does not hold is
  // counted and remembered as ended (see kMaxEnded).
  void endTransfer(const Key& key, bool by_message) {
    absl::MutexLock lock(&mu);
    auto it = transfers.find(key);
    if (it == transfers.end()) {
      if (!by_message) return;
      const MonoTime now = clock.now();
      forgetExpired(now);
      if (ended.insert(key).second) ended_order.emplace_back(now + options.lease_ttl, key);
      metrics.rejected("unknown_transfer");
      return;
    }
    Transfer tr = std::move(it->second);
    transfers.erase(it);
    if (tr.request_id != 0) by_request.erase(tr.request_id);  // no more announcements for it
    if (tr.leased) loop.post([id = tr.lease_id](engine::Engine& e) { e.releaseLease(id); });
    if (!tr.finished) {
      loop.cancel(tr.handle);
      // If it still finishes normally, its lease is released on expiry; cut that short:
      loop.post([id = tr.lease_id](engine::Engine& e) { e.releaseLease(id); });
    }
  }

  void onMessage(ConnId conn, std::vector<uint8_t> bytes) {
    // Heartbeats keep messages coming from every decode agent: the sweep
    // of late handshakes runs on them as well as on accepts.
    closeLateHandshakes();
    {
      // A connection closed here may still deliver what it already sent.
      absl::MutexLock lock(&mu);
      if (closed.contains(conn)) return;
    }
    auto m = kvproto::decode(bytes, {.max_tokens = 1u << 22,
                                     .num_blocks = static_cast<uint32_t>(layout.num_blocks),
                                     .num_layers = static_cast<uint16_t>(layout.num_layers)});
    std::optional<auth::KvIdentity> peer = authenticatedPeer(conn);
    if (!m.ok()) {
      if (!peer) return authFailed(conn, {"malformed", std::string(m.status().message())});
      log.warn("rejected a control message", {{"conn", conn}, {"error", toStd(m.status().message())}});
      metrics.rejected("malformed");
      return;
    }
    const uint64_t tid = m->transfer_id;
    if (auto* ah = std::get_if<kvproto::AuthHello>(&m->body)) return onAuthHello(conn, *ah);
    if (auto* ap = std::get_if<kvproto::AuthProof>(&m->body)) return onAuthProof(conn, *ap);
    if (!peer) {
      return authFailed(conn, {"unauthenticated", strCat("message type ", static_cast<int>(kvproto::typeOf(m->body)),
                                                         " before the authentication handshake (kvproto v4)")});
    }
    if (auto* h = std::get_if<kvproto::Hello>(&m->body)) {
      onHello(conn, *h);
    } else if (auto* req = std::get_if<kvproto::PrefillRequest>(&m->body)) {
      if (peer->role != kvproto::PeerRole::kDecode) {
        return authFailed(conn, {"wrong_role", strCat("the ", kvproto::peerRoleName(peer->role), " agent ",
                                                      peer->name, " sent a PrefillRequest: only decode agents may "
                                                      "ask a prefill agent for KV")});
      }
      if (auto why = refusal(conn)) return send(conn, tid, kvproto::Abort{FailureReason::kTransferFailed, *why});
      onPrefillRequest(conn, tid, *req);
    } else if (std::holds_alternative<kvproto::Release>(m->body) || std::holds_alternative<kvproto::Abort>(m->body)) {
      endTransfer({conn, tid}, /*by_message=*/true);
    } else if (std::holds_alternative<kvproto::Ping>(m->body)) {
      send(conn, tid, kvproto::Pong{});
    } else {
      log.warn("unexpected message for the prefill role",
               {{"conn", conn}, {"type", static_cast<int>(kvproto::typeOf(m->body))}});
      metrics.rejected("unexpected_type");
    }
  }

  // The connection's peer once its handshake succeeded.
  std::optional<auth::KvIdentity> authenticatedPeer(ConnId conn) {
    absl::MutexLock lock(&mu);
    auto it = handshakes.find(conn);
    if (it == handshakes.end() || !it->second.authenticated()) return std::nullopt;
    return it->second.peer();
  }

  void onAuthHello(ConnId conn, const kvproto::AuthHello& h) {
    auth::KvAuthAcceptor acceptor(currentPoolKeys(options), {kvproto::PeerRole::kPrefill, "prefill"});
    auto r = acceptor.onHello(h);
    if (auto* f = std::get_if<auth::AuthFailure>(&r)) return authFailed(conn, *f);
    bool second = false;
    {
      absl::MutexLock lock(&mu);
      second = !handshakes.try_emplace(conn, std::move(acceptor)).second;
    }
    if (second) return authFailed(conn, {"unauthenticated", "a second AuthHello on one connection"});
    send(conn, 0, std::move(std::get<kvproto::AuthChallenge>(r)));
  }

  void onAuthProof(ConnId conn, const kvproto::AuthProof& p) {
    std::optional<auth::AuthFailure> f;
    {
      absl::MutexLock lock(&mu);
      auto it = handshakes.find(conn);
      if (it == handshakes.end()) {
        f = auth::AuthFailure{"unauthenticated", "an AuthProof before an AuthHello"};
      } else {
        f = it->second.onProof(p);
        if (!f) unauthenticated.erase(conn);
      }
    }
    if (f) authFailed(conn, *f);
  }

  // A peer connected: closes those that did not authenticate in time.
  void onAccept(ConnId conn) {
    {
      absl::MutexLock lock(&mu);
      unauthenticated[conn] = clock.now();
    }
    closeLateHandshakes();
  }

  void closeLateHandshakes() {
    std::vector<ConnId> late;
    {
      absl::MutexLock lock(&mu);
      const MonoTime now = clock.now();
      while (!unauthenticated.empty() && (unauthenticated.size() > kMaxUnauthenticated ||
                                           unauthenticated.begin()->second + kHandshakeTimeout <= now)) {
        late.push_back(unauthenticated.begin()->first);
        unauthenticated.erase(unauthenticated.begin());
      }
    }
    for (ConnId c : late) {
      authFailed(c, {"handshake_timeout", strCat("no authentication within ", absl::FormatDuration(absl::FromChrono(
                                                                                   kHandshakeTimeout)),
                                                 " of connecting")});
    }
  }

  // Tells the peer why (its operator needs to know), closes the connection
  // and forgets it.
  void authFailed(ConnId conn, const auth::AuthFailure& f) {
    {
      absl::MutexLock lock(&mu);
      if (!closed.insert(conn).second) return;  // closed already
      if (closed.size() > kMaxClosed) closed.erase(closed.begin());  // long gone from the transport
    }
    auth_failures.report(t->peerAddress(conn), f.reason, f.message);
    send(conn, 0, kvproto::Abort{FailureReason::kTransferFailed, strCat("authentication failed: ", f.message)});
    if (!stopping.load()) t->close(conn);
    onDisconnect(conn);  // close() reports nothing back
  }

  // Answers with this side's Hello in any case, so a refused decode agent
  // can name both sides' values too.
  void onHello(ConnId conn, const kvproto::Hello& h) {
    if (auto no = refusePeer(model, layout, h)) {
      log.error("refused a decode agent", {{"conn", conn}, {"reason", no->reason}, {"detail", no->message}});
      metrics.rejected(no->reason);
      absl::MutexLock lock(&mu);
      refused[conn] = no->message;
    }
    send(conn, 0, helloFor(kvproto::PeerRole::kPrefill, model, layout, *t, "prefill"));
  }

  std::optional<std::string> refusal(ConnId conn) {
    absl::MutexLock lock(&mu);
    auto it = refused.find(conn);
    if (it == refused.end()) return std::nullopt;
    return it->second;
  }

  void onDisconnect(ConnId conn) {
    std::vector<Key> keys;
    {
      absl::MutexLock lock(&mu);
      refused.erase(conn);
      handshakes.erase(conn);
      unauthenticated.erase(conn);
      for (const auto& [k, tr] : transfers) {
        if (k.first == conn) keys.push_back(k);
      }
    }
    for (const Key& k : keys) endTransfer(k, /*by_message=*/false);
  }
};

absl::StatusOr<std::unique_ptr<PrefillService>> PrefillService::start(
    const PdEnv& env, const PdOptions& options, std::function<void(const engine::RequestUpdate&)> on_finished) {
  auto impl = std::make_shared<Impl>(env, options);
  impl->on_finished = std::move(on_finished);
  std::span<std::byte> region;
  Impl* raw = impl.get();
  env.loop.runOnLoop([&](engine::Engine& e) {
    raw->layout = e.kvRegionLayout();
    raw->model = {.fingerprint = options.model_fingerprint,
                  .hash_root = e.blockHashRoot(),
                  .tensor_parallel = options.tensor_parallel};
    region = e.kvRegion();
  });
  transport::TransportCallbacks cb;
  cb.on_accept = [raw](ConnId c) { raw->onAccept(c); };
  cb.on_message = [raw](ConnId c, std::vector<uint8_t> b) { raw->onMessage(c, std::move(b)); };
  cb.on_disconnect = [raw](ConnId c, absl::Status) { raw->onDisconnect(c); };
  TANDEM_RETURN_IF_ERROR(startKvTransport(env, options, region, std::move(cb),
                                          [raw](std::unique_ptr<transport::KvTransport> t) { raw->t = std::move(t); }));
  env.loop.runOnLoop([raw](engine::Engine& e) {
    e.setLayerObserver(
        [raw](int layer, std::span<const engine::Engine::LayerReady> ready) { raw->onLayer(layer, ready); });
  });
  return std::unique_ptr<PrefillService>(new PrefillService(std::move(impl)));
}

PrefillService::PrefillService(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

PrefillService::~PrefillService() {
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->stopping = true;  // from here on nothing uses the transport
  }
  impl_->loop.runOnLoop([](engine::Engine& e) { e.setLayerObserver(nullptr); });
  impl_->t->shutdown();  // no transport callback after this; `t` stays valid until it returns
  impl_->t.reset();
}

int PrefillService::port() const { return impl_->t->port(); }

}  // namespace tandem::agent
