#include "agent/pd_service.h"

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "src/common/log.h"
#include "src/common/strings.h"

namespace tandem::agent {
namespace {

using tandem::BlockId;
using kvproto::FailureReason;
using transport::ConnId;
using transport::GetId;

double secondsSince(MonoTime t) { return std::chrono::duration<double>(SystemClock::instance().now() - t).count(); }

// The transport registers the engine's KV pool: memory UCX allocated (the
// pool option, which the engine was given) or the engine's own allocation.
absl::StatusOr<transport::TransportOptions> transportFor(const PdOptions& options, std::span<std::byte> kv) {
  transport::TransportOptions to = options.transport;
  if (!to.pool) {
    to.region = kv;
  } else if (to.pool->bytes().data() != kv.data() || to.pool->bytes().size() < kv.size()) {
    return absl::InternalError("the engine's KV pool is not the transport's UCX region");
  }
  return to;
}

// Byte offset of (layer, block) in a KvStorage region with this shape.
uint64_t layerBlockOffset(uint32_t layer, uint32_t block, uint32_t num_blocks, uint64_t bytes_per_layer_block) {
  return (static_cast<uint64_t>(layer) * num_blocks + block) * bytes_per_layer_block;
}

kvproto::Hello helloFor(kvproto::PeerRole role, const engine::KvLayout& l, const transport::UcxTransport& t, std::string name) {
  return {.role = role,
          .num_layers = static_cast<uint16_t>(l.num_layers),
          .num_blocks = static_cast<uint32_t>(l.num_blocks),
          .block_size = static_cast<uint16_t>(l.block_size),
          .num_kv_heads = static_cast<uint16_t>(l.num_kv_heads),
          .head_dim = static_cast<uint16_t>(l.head_dim),
          .dtype = kvproto::KvDtype::kFloat32,
          .region_base = t.regionBase(),
          .rkey = t.packedRkey(),
          .peer_name = std::move(name)};
}

// Runs tasks at a due time on one thread (fault injection's delays). The
// destructor runs what is still pending at once: a held get completion
// must still be processed, or its transfer would never end.
class DelayedRunner {
 public:
  DelayedRunner() : thread_([this] { run(); }) {}
  ~DelayedRunner() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void at(MonoTime due, std::function<void()> fn) {
    {
      std::lock_guard lock(mu_);
      tasks_.emplace(due, std::move(fn));
    }
    cv_.notify_all();
  }

 private:
  void run() {
    std::unique_lock lock(mu_);
    while (!stop_) {
      if (tasks_.empty()) {
        cv_.wait(lock);
        continue;
      }
      auto first = tasks_.begin();
      if (cv_.wait_until(lock, first->first, [&] { return stop_; })) break;
      if (tasks_.empty() || tasks_.begin()->first > std::chrono::steady_clock::now()) continue;
      auto fn = std::move(tasks_.begin()->second);
      tasks_.erase(tasks_.begin());
      lock.unlock();
      fn();
      lock.lock();
    }
    while (!tasks_.empty()) {
      auto fn = std::move(tasks_.begin()->second);
      tasks_.erase(tasks_.begin());
      lock.unlock();
      fn();
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<MonoTime, std::function<void()>> tasks_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace

PdMetrics::PdMetrics(metrics::Registry& r, const metrics::Labels& labels)
    : bytes(metrics::buildCounter().name("tandem_kv_transfer_bytes_total").help("KV bytes pulled from prefill agents.")
                .labels(labels).registerOn(r).add({})),
      seconds(metrics::buildHistogram().name("tandem_kv_transfer_seconds").help("Per request: from the prefill request to the last KV byte landing.")
                  .labels(labels).buckets(metrics::exponentialBuckets(0.0005, 2, 16)).registerOn(r).add({})),
      inflight(metrics::buildGauge().name("tandem_kv_transfer_inflight").help("KV transfers in progress.").labels(labels).registerOn(r).add({})),
      leases(metrics::buildGauge().name("tandem_kv_leases_active").help("Prefill results pinned for a decode agent (prefill side).")
                 .labels(labels).registerOn(r).add({})),
      checksum_checked(metrics::buildCounter().name("tandem_kv_checksum_verified_total").help("Layer blocks whose checksum was verified after the pull.")
                           .labels(labels).registerOn(r).add({})),
      gets(metrics::buildCounter().name("tandem_kv_transfer_gets_total")
               .help("UCX gets (or copies from a peer pool mapped here) that KV pulls became after merging blocks "
                     "adjacent on both sides; one per layer and prefill chunk when both sides' blocks are one run.")
               .labels(labels).registerOn(r).add({})),
      failures_(metrics::buildCounter().name("tandem_kv_transfer_failures_total").help("Failed KV transfers by typed reason.")
                    .labels(labels).registerOn(r)),
      rejected_(metrics::buildCounter().name("tandem_kv_control_messages_rejected_total")
                    .help("P/D control messages refused, by reason: malformed, unknown_transfer, unexpected_type, after_end, unknown_peer.")
                    .labels(labels).registerOn(r)),
      phase_seconds_(metrics::buildHistogram().name("tandem_disagg_ttft_phase_seconds")
                         .help("TTFT of disaggregated requests by phase (decode side): prefill (P's queue and compute), "
                               "transfer_exposed (pull time after P's last layer), first_step (D's first token).")
                         .labels(labels).buckets(metrics::exponentialBuckets(0.0001, 2, 20)).registerOn(r)),
      transfer_busy_(metrics::buildCounter().name("tandem_kv_transfer_busy_seconds_total")
                         .help("Time during which a request had layer pulls in flight (decode side).")
                         .labels(labels).registerOn(r).add({})),
      transfer_hidden_(metrics::buildCounter().name("tandem_kv_transfer_hidden_seconds_total")
                           .help("The part of tandem_kv_transfer_busy_seconds_total overlapped with the prefill agent's compute.")
                           .labels(labels).registerOn(r).add({})) {
  for (auto reason : {FailureReason::kPrefillTimeout, FailureReason::kTransferFailed, FailureReason::kPeerUnhealthy,
                      FailureReason::kLeaseExpired, FailureReason::kCapacity, FailureReason::kChecksumMismatch,
                      FailureReason::kCancelled}) {
    failures_.add({{"reason", std::string(kvproto::failureReasonName(reason))}});
  }
  for (const char* reason : {"malformed", "unknown_transfer", "unexpected_type", "after_end", "unknown_peer"}) {
    rejected_.add({{"reason", reason}});
  }
}

void PdMetrics::rejected(std::string_view reason) { rejected_.add({{"reason", std::string(reason)}}).increment(); }

void PdMetrics::phases(const PdTimings& t) {
  phase_seconds_.add({{"phase", "prefill"}}).observe(t.prefill_ms / 1e3);
  phase_seconds_.add({{"phase", "transfer_exposed"}}).observe((t.transfer_ms - t.transfer_hidden_ms) / 1e3);
  phase_seconds_.add({{"phase", "first_step"}}).observe(t.first_step_ms / 1e3);
  transfer_busy_.increment(t.transfer_ms / 1e3);
  transfer_hidden_.increment(t.transfer_hidden_ms / 1e3);
}

void PdMetrics::failure(FailureReason reason) {
  failures_.add({{"reason", std::string(kvproto::failureReasonName(reason))}}).increment();
}

std::string_view pdPathName(PdPath path) {
  switch (path) {
    case PdPath::kDirect: return "direct";
    case PdPath::kDisagg: return "disagg";
    case PdPath::kFallback: return "fallback";
  }
  return "direct";
}

void PeerHealth::recordFailure(MonoTime now) {
  std::lock_guard lock(mu_);
  failures_.push_back(now);
  while (!failures_.empty() && now - failures_.front() > window_) failures_.pop_front();
  if (static_cast<int>(failures_.size()) >= threshold_) unhealthy_ = true;
}

void PeerHealth::recordProbeSuccess() {
  std::lock_guard lock(mu_);
  unhealthy_ = false;
  failures_.clear();
}

bool PeerHealth::healthy(MonoTime now) {
  std::lock_guard lock(mu_);
  while (!failures_.empty() && now - failures_.front() > window_) failures_.pop_front();
  return !unhealthy_;
}

// ---------------------------------------------------------------- prefill --

struct PrefillService::Impl : std::enable_shared_from_this<PrefillService::Impl> {
  engine::EngineLoop& loop;
  PdMetrics& metrics;
  PdOptions options;
  Logger log{"prefill"};
  engine::KvLayout layout;
  const engine::KvStorage* kv = nullptr;  // read on the engine thread only
  std::unique_ptr<transport::UcxTransport> t;

  struct Transfer {
    ConnId conn = 0;
    uint64_t transfer_id = 0;
    uint64_t lease_id = 0;
    uint64_t handle = 0;
    std::vector<BlockId> blocks;
    bool finished = false;  // the engine request ended
    bool leased = false;
    MonoTime lease_end;
    uint64_t request_id = 0;  // the engine's, once admitted (by_request's key)
  };
  using Key = std::pair<ConnId, uint64_t>;
  std::mutex mu;
  std::map<Key, Transfer> transfers;                           // guarded by mu
  // Transfers D ended (Release or Abort) that P does not hold: normally
  // ones already over here, but possibly an Abort that overtook its
  // PrefillRequest. Such a request is refused when it arrives rather than
  // computed and pinned for nobody until the lease runs out. Kept for one
  // lease TTL (a later request would be dropped by lease expiry anyway),
  // at most kMaxEnded (the oldest is forgotten first). Guarded by mu.
  static constexpr size_t kMaxEnded = 1 << 16;
  std::deque<std::pair<MonoTime, Key>> ended_order;
  std::set<Key> ended;
  std::unordered_map<uint64_t, Key> by_request;                // engine RequestId -> transfer; guarded by mu
  std::atomic<uint64_t> next_lease{1};
  std::atomic<int> injected_failures{0};
  std::unique_ptr<DelayedRunner> delayed;  // fault injection only
  std::function<void(const engine::RequestUpdate&)> on_finished;
  // The service is shutting down: nothing is sent any more (set under mu,
  // so an engine callback holding mu either sent before or sees it).
  std::atomic<bool> stopping{false};
  MonoTime last_sweep;  // guarded by mu

  Impl(engine::EngineLoop& l, PdMetrics& m, const PdOptions& o) : loop(l), metrics(m), options(o) {
    if (o.faults.layer_delay.count() > 0) delayed = std::make_unique<DelayedRunner>();
  }

  void send(ConnId conn, uint64_t tid, kvproto::Body body) {
    if (stopping.load()) return;
    t->send(conn, kvproto::encode({tid, std::move(body)}));
  }

  // Engine thread: layer `layer` of these prefills is in the cache.
  void onLayer(int layer, std::span<const engine::Engine::LayerReady> ready) {
    std::lock_guard lock(mu);
    for (const auto& r : ready) {
      auto k = by_request.find(r.id.value());
      if (k == by_request.end()) continue;
      kvproto::LayerReady msg;
      msg.layer = static_cast<uint16_t>(layer);
      msg.first_block = static_cast<uint32_t>(r.first_block);
      for (BlockId b : r.blocks) {
        const float* p = kv->layerBlock(layer, b);
        msg.checksums.push_back(kvproto::layerBlockChecksum(
            std::span<const std::byte>(reinterpret_cast<const std::byte*>(p), layout.bytesPerLayerBlock())));
      }
      if (delayed) {
        // Fault injection: the announcement leaves late (the KV is ready; D just learns late).
        delayed->at(SystemClock::instance().now() + options.faults.layer_delay,
                    [this, key = k->second, msg = std::move(msg)]() mutable { send(key.first, key.second, std::move(msg)); });
      } else {
        send(k->second.first, k->second.second, std::move(msg));
      }
    }
  }

  void onPrefillRequest(ConnId conn, uint64_t tid, kvproto::PrefillRequest req) {
    if (injected_failures.load() < options.faults.fail_first_transfers) {
      injected_failures.fetch_add(1);
      send(conn, tid, kvproto::Abort{FailureReason::kTransferFailed, "injected failure"});
      return;
    }
    engine::RequestSpec spec;
    spec.prompt.assign(req.tokens.begin(), req.tokens.end());
    spec.sampling.temperature = req.temperature;
    spec.sampling.top_p = req.top_p;
    spec.sampling.top_k = static_cast<int>(req.top_k);
    spec.sampling.seed = req.seed;
    spec.sampling.max_tokens = 1;
    spec.sampling.ignore_eos = true;  // P only samples the first token; D decides about EOS
    const auto now = SystemClock::instance().now();
    auto ttl = options.lease_ttl;
    if (req.lease_ms > 0) ttl = std::min(ttl, std::chrono::milliseconds(req.lease_ms));
    const uint64_t lease_id = next_lease.fetch_add(1);
    spec.lease = engine::LeaseSpec{lease_id, now + ttl};
    const MonoTime lease_end = now + ttl;
    if (req.deadline_ms > 0) spec.deadline = now + std::chrono::milliseconds(req.deadline_ms);
    const Key key{conn, tid};
    {
      std::lock_guard lock(mu);
      forgetExpiredEnds(now);
      if (ended.contains(key)) {
        log.warn("refused a prefill request that its decode agent already ended", {{"conn", conn}, {"transfer", tid}});
        metrics.rejected("after_end");
        return;
      }
      if (transfers.contains(key)) {
        send(conn, tid, kvproto::Abort{FailureReason::kTransferFailed, "duplicate transfer id"});
        return;
      }
      transfers[key] = Transfer{.conn = conn, .transfer_id = tid, .lease_id = lease_id, .lease_end = lease_end};
      sweepExpiredLeases(now);
    }
    uint64_t handle = loop.submit(std::move(spec), [self = shared_from_this(), key, lease_end](const engine::RequestUpdate& u) {
      self->onUpdate(key, lease_end, u);
    });
    std::lock_guard lock(mu);
    if (auto it = transfers.find(key); it != transfers.end()) it->second.handle = handle;
  }

  // Forgets, at most once a second, transfers whose lease ran out while D
  // neither released nor aborted them (a D that misbehaves): the engine
  // already unpinned their blocks. Requires mu.
  void sweepExpiredLeases(MonoTime now) {
    if (now - last_sweep < std::chrono::seconds(1)) return;
    last_sweep = now;
    std::erase_if(transfers, [&](const auto& entry) { return entry.second.leased && entry.second.lease_end <= now; });
  }

  // Requires mu.
  void forgetExpiredEnds(MonoTime now) {
    while (!ended_order.empty() && (ended_order.front().first <= now || ended_order.size() >= kMaxEnded)) {
      ended.erase(ended_order.front().second);
      ended_order.pop_front();
    }
  }

  // Engine thread: progress of the prefill of transfer `key`.
  void onUpdate(const Key& key, MonoTime lease_end, const engine::RequestUpdate& u) {
    std::lock_guard lock(mu);
    auto it = transfers.find(key);
    Transfer* tr = it == transfers.end() ? nullptr : &it->second;  // gone: D ended it already
    if (tr != nullptr && !u.kv_blocks.empty()) {
      tr->blocks = u.kv_blocks;
      tr->request_id = u.id.value();
      by_request[u.id.value()] = key;
      kvproto::PrefillAccepted a;
      // What is left of the lease (it started when the request arrived).
      a.lease_ms = static_cast<uint32_t>(std::max<int64_t>(
          0, std::chrono::duration_cast<std::chrono::milliseconds>(lease_end - SystemClock::instance().now()).count()));
      for (BlockId b : tr->blocks) a.block_ids.push_back(static_cast<uint32_t>(b.value()));
      send(key.first, key.second, std::move(a));
    }
    if (!u.finished) return;
    by_request.erase(u.id.value());
    if (on_finished) on_finished(u);
    if (tr == nullptr) return;
    tr->finished = true;
    const bool ok = (u.finish_reason == engine::FinishReason::kLength || u.finish_reason == engine::FinishReason::kEos) &&
                    !tr->blocks.empty() && !u.new_tokens.empty();
    if (ok) {
      tr->leased = true;
      send(key.first, key.second, kvproto::PrefillDone{static_cast<uint32_t>(u.new_tokens.back())});
      return;
    }
    FailureReason reason = u.finish_reason == engine::FinishReason::kTimeout ? FailureReason::kPrefillTimeout
                           : u.finish_reason == engine::FinishReason::kRejected && u.reject_reason != engine::RejectReason::kInvalid
                               ? FailureReason::kCapacity
                               : FailureReason::kTransferFailed;
    send(key.first, key.second,
         kvproto::Abort{reason, strCat("prefill ended: ", engine::finishReasonName(u.finish_reason), " ", u.message)});
    transfers.erase(it);
  }

  // D is done with (or gave up on) a transfer, or went away: unpin, or stop
  // the prefill. A Release or Abort for a transfer P does not hold is
  // counted and remembered as ended (see `ended`).
  void endTransfer(const Key& key, bool by_message) {
    std::lock_guard lock(mu);
    auto it = transfers.find(key);
    if (it == transfers.end()) {
      if (!by_message) return;
      const MonoTime now = SystemClock::instance().now();
      forgetExpiredEnds(now);
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
    auto m = kvproto::decode(bytes, {.max_tokens = 1u << 22, .num_blocks = static_cast<uint32_t>(layout.num_blocks),
                                     .num_layers = static_cast<uint16_t>(layout.num_layers)});
    if (!m.ok()) {
      log.warn("rejected a control message", {{"conn", conn}, {"error", toStd(m.status().message())}});
      metrics.rejected("malformed");
      return;
    }
    const uint64_t tid = m->transfer_id;
    if (std::holds_alternative<kvproto::Hello>(m->body)) {
      send(conn, 0, helloFor(kvproto::PeerRole::kPrefill, layout, *t, "prefill"));
    } else if (auto* req = std::get_if<kvproto::PrefillRequest>(&m->body)) {
      onPrefillRequest(conn, tid, std::move(*req));
    } else if (std::holds_alternative<kvproto::Release>(m->body) || std::holds_alternative<kvproto::Abort>(m->body)) {
      endTransfer({conn, tid}, /*by_message=*/true);
    } else if (std::holds_alternative<kvproto::Ping>(m->body)) {
      send(conn, tid, kvproto::Pong{});
    } else {
      log.warn("unexpected message for the prefill role", {{"conn", conn}, {"type", static_cast<int>(kvproto::typeOf(m->body))}});
      metrics.rejected("unexpected_type");
    }
  }

  void onDisconnect(ConnId conn) {
    std::vector<Key> keys;
    {
      std::lock_guard lock(mu);
      for (const auto& [k, tr] : transfers) {
        if (k.first == conn) keys.push_back(k);
      }
    }
    for (const Key& k : keys) endTransfer(k, /*by_message=*/false);
  }
};

absl::StatusOr<std::unique_ptr<PrefillService>> PrefillService::start(
    engine::EngineLoop& loop, const PdOptions& options, PdMetrics& metrics,
    std::function<void(const engine::RequestUpdate&)> on_finished) {
  auto impl = std::make_shared<Impl>(loop, metrics, options);
  impl->on_finished = std::move(on_finished);
  std::span<std::byte> region;
  Impl* raw = impl.get();
  loop.runOnLoop([&](engine::Engine& e) {
    raw->layout = e.kv().layout();
    raw->kv = &e.kv();
    region = e.kvRegion();
  });
  TANDEM_ASSIGN_OR_RETURN(transport::TransportOptions to, transportFor(options, region));
  // A peer may connect as soon as the listener exists, before `t` is set:
  // its messages wait for it.
  auto started = std::make_shared<std::promise<void>>();
  std::shared_future<void> t_set = started->get_future().share();
  transport::TransportCallbacks cb;
  cb.on_message = [raw, t_set](ConnId c, std::vector<uint8_t> b) {
    t_set.wait();
    raw->onMessage(c, std::move(b));
  };
  cb.on_disconnect = [raw, t_set](ConnId c, absl::Status) {
    t_set.wait();
    raw->onDisconnect(c);
  };
  auto t = transport::UcxTransport::start(to, std::move(cb));
  if (!t.ok()) {
    started->set_value();
    return t.status();
  }
  impl->t = std::move(*t);
  started->set_value();
  loop.runOnLoop([raw](engine::Engine& e) {
    e.setLayerObserver([raw](int layer, std::span<const engine::Engine::LayerReady> ready) { raw->onLayer(layer, ready); });
  });
  return std::unique_ptr<PrefillService>(new PrefillService(std::move(impl)));
}

PrefillService::PrefillService(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
PrefillService::~PrefillService() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;  // from here on nothing uses the transport
  }
  impl_->loop.runOnLoop([](engine::Engine& e) { e.setLayerObserver(nullptr); });  // onLayer may use `delayed`
  impl_->delayed.reset();
  impl_->t->shutdown();  // no transport callback after this; `t` stays valid until it returns
  impl_->t.reset();
}
int PrefillService::port() const { return impl_->t->port(); }

// ----------------------------------------------------------------- decode --

struct DecodeService::Impl : std::enable_shared_from_this<DecodeService::Impl> {
  engine::EngineLoop& loop;
  PdMetrics& metrics;
  PdOptions options;
  Logger log{"decode"};
  engine::KvLayout layout;
  std::byte* region = nullptr;
  std::unique_ptr<transport::UcxTransport> t;

  struct Transfer {
    uint64_t handle = 0;
    RequestId id{0};
    bool has_id = false;
    PdUpdateCallback cb;
    std::vector<TokenId> prompt;
    engine::SamplingParams sampling;
    ConnId conn = 0;
    std::vector<BlockId> d_blocks;
    std::vector<uint32_t> p_blocks;
    std::vector<uint64_t> checksums;               // [layer * blocks + block], as announced
    std::unordered_set<GetId> outstanding;
    size_t layer_blocks_done = 0;                  // pulled and verified
    std::vector<uint8_t> requested;                // [layer * blocks + block]: its pull was issued
    std::optional<uint32_t> first_token;
    bool verify = true;
    bool completed = false;
    bool failed = false;
    bool abort_posted = false;
    FailureReason reason = FailureReason::kTransferFailed;
    std::string message;
    // How the request ends when the transfer failed: error, unless the
    // engine was asked to end it (a cancel: the requested reason).
    engine::FinishReason end_reason = engine::FinishReason::kError;
    MonoTime started;
    std::optional<MonoTime> deadline;
    std::optional<MonoTime> lease_deadline;  // from PrefillAccepted: P unpins after this
    bool accepted = false;                   // PrefillAccepted arrived
    // Layer announcements that overtook PrefillAccepted or P's Hello: UCX
    // may deliver messages out of order while an endpoint switches lanes
    // (e.g. from tcp to shared memory after wire-up). Bounded by the number
    // of layer blocks.
    std::vector<kvproto::LayerReady> early_layers;
    // Phase times (PdTimings).
    std::optional<MonoTime> last_layer_at;              // the latest layer announcement arrived
    std::vector<std::pair<MonoTime, MonoTime>> pulls;   // [issued, completed] of finished layer pulls
    std::optional<MonoTime> kv_done_at;
    std::optional<PdTimings> timings;
    bool first_token_out = false;
    bool inflight_counted = false;  // counted in tandem_kv_transfer_inflight
  };
  std::mutex mu;
  std::condition_variable cv;
  std::unordered_map<uint64_t, Transfer> transfers;  // by transfer id; guarded by mu
  std::unordered_map<uint64_t, uint64_t> by_handle;  // guarded by mu
  std::atomic<uint64_t> next_tid{1};
  ConnId conn = 0;                                   // guarded by mu; 0 = not connected
  std::optional<kvproto::Hello> peer;                // guarded by mu
  // Why the prefill peer cannot serve this agent (its Hello showed another
  // KV layout); transfers fail at once instead of waiting for a deadline.
  std::optional<std::string> peer_incompatible;      // guarded by mu
  std::mt19937_64 rng{std::random_device{}()};       // guarded by mu
  uint64_t gets_counted = 0;                         // guarded by mu; transport gets already in the metric
  std::thread watchdog;
  bool stopping = false;                             // guarded by mu
  // The transport is being destroyed: nothing is sent or pulled any more
  // (set under mu; every send and get is issued under mu).
  std::atomic<bool> transport_closed{false};
  PeerHealth health;
  MonoTime last_probe;                               // guarded by mu
  std::unique_ptr<DelayedRunner> delayed;            // fault injection only

  Impl(engine::EngineLoop& l, PdMetrics& m, const PdOptions& o)
      : loop(l), metrics(m), options(o), health(o.unhealthy_failures, o.failure_window) {
    if (o.faults.get_delay.count() > 0 || o.faults.get_complete_delay.count() > 0) {
      delayed = std::make_unique<DelayedRunner>();
    }
  }

  void send(ConnId c, uint64_t tid, kvproto::Body body) {
    if (transport_closed.load()) return;
    t->send(c, kvproto::encode({tid, std::move(body)}));
  }

  // Connects (again) if needed. Requires mu.
  ConnId ensureConnected() {
    if (transport_closed.load()) return 0;
    if (conn == 0) {
      conn = t->connect(options.peer_host, options.peer_port);
      peer.reset();
      peer_incompatible.reset();
      send(conn, 0, helloFor(kvproto::PeerRole::kDecode, layout, *t, "decode"));
    }
    return conn;
  }

  // Marks a transfer failed: cancels its own gets, tells P, and ends the
  // request once no get is outstanding. Requires mu.
  void fail(uint64_t tid, Transfer& tr, FailureReason reason, std::string message, bool tell_peer = true) {
    if (tr.failed) return maybeEnd(tid, tr);
    if (tr.completed) return;
    tr.failed = true;
    tr.reason = reason;
    tr.message = strCat("kv transfer failed (", kvproto::failureReasonName(reason), "): ", message);
    metrics.failure(reason);
    // Failures that say something about the peer feed its health window.
    if (reason != FailureReason::kCancelled && reason != FailureReason::kCapacity) {
      health.recordFailure(SystemClock::instance().now());
    }
    log.warn("kv transfer failed", {{"transfer", tid}, {"reason", kvproto::failureReasonName(reason)}, {"detail", message}});
    for (GetId g : tr.outstanding) t->cancelGet(g);
    if (tell_peer && tr.conn != 0 && reason != FailureReason::kPeerUnhealthy) send(tr.conn, tid, kvproto::Abort{reason, message});
    maybeEnd(tid, tr);
  }

  // The only place a failed import is ended: after the last get completed.
  void maybeEnd(uint64_t tid, Transfer& tr) {
    if (!tr.failed || !tr.outstanding.empty() || tr.abort_posted) return;
    tr.abort_posted = true;
    if (tr.has_id) {
      loop.post([id = tr.id, msg = tr.message, why = tr.end_reason](engine::Engine& e) {
        if (!e.abortImport(id, why, msg)) e.cancel(id, why, msg);
      });
    } else {
      loop.cancel(tr.handle, tr.end_reason);  // still queued in the engine
    }
    (void)tid;
  }

  void maybeComplete(uint64_t tid, Transfer& tr) {
    const size_t total = tr.d_blocks.size() * static_cast<size_t>(layout.num_layers);
    if (tr.failed || tr.completed || !tr.first_token || tr.layer_blocks_done < total || !tr.outstanding.empty()) return;
    tr.completed = true;
    tr.kv_done_at = SystemClock::instance().now();
    tr.timings = phaseTimings(tr);
    metrics.bytes.increment(static_cast<double>(total * layout.bytesPerLayerBlock()));
    metrics.seconds.observe(secondsSince(tr.started));
    metrics.inflight.decrement();
    tr.inflight_counted = false;
    send(tr.conn, tid, kvproto::Release{});
    loop.post([id = tr.id, tok = *tr.first_token](engine::Engine& e) { e.completeImport(id, static_cast<TokenId>(tok)); });
  }

  // PdTimings of a transfer whose KV is all in, but for first_step_ms.
  static PdTimings phaseTimings(const Transfer& tr) {
    auto ms = [](Duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
    PdTimings t;
    const MonoTime p_done = tr.last_layer_at.value_or(tr.started);
    t.prefill_ms = ms(p_done - tr.started);
    // The union of the layer pulls' intervals, and its part before P's last announcement.
    std::vector<std::pair<MonoTime, MonoTime>> pulls = tr.pulls;
    std::sort(pulls.begin(), pulls.end());
    std::optional<std::pair<MonoTime, MonoTime>> run;
    auto add = [&](MonoTime a, MonoTime b) {
      t.transfer_ms += ms(b - a);
      if (a < p_done) t.transfer_hidden_ms += ms(std::min(b, p_done) - a);
    };
    for (const auto& [a, b] : pulls) {
      if (run && a <= run->second) {
        run->second = std::max(run->second, b);
      } else {
        if (run) add(run->first, run->second);
        run = {a, b};
      }
    }
    if (run) add(run->first, run->second);
    return t;
  }

  // A block range of one layer arrived (or failed): verify its blocks.
  // `id` is read only under mu: the issuer stores it there after getv() returns.
  struct Pull {
    uint32_t layer = 0;
    size_t first = 0, count = 0;
    MonoTime issued;
  };
  // Brings tandem_kv_transfer_gets_total up to the transport's count (only
  // pulls issue gets on this transport). Requires mu.
  void countUcxGets() {
    const uint64_t issued = t->ucxGetsIssued();
    metrics.gets.increment(static_cast<double>(issued - gets_counted));
    gets_counted = issued;
  }

  void onGetDone(uint64_t tid, const std::shared_ptr<GetId>& id, const Pull& pull, absl::Status s) {
    std::lock_guard lock(mu);
    countUcxGets();
    const GetId g = *id;
    auto it = transfers.find(tid);
    if (it == transfers.end()) return;
    Transfer& tr = it->second;
    tr.outstanding.erase(g);
    if (tr.failed) {
      maybeEnd(tid, tr);  // its last get may just have completed
      return;
    }
    if (!s.ok()) {
      fail(tid, tr, FailureReason::kTransferFailed, toStd(s.message()).data());
      return;
    }
    const MonoTime now = SystemClock::instance().now();
    if (tr.lease_deadline && now > *tr.lease_deadline) {
      // The read may have overlapped P unpinning the blocks: not trusted.
      fail(tid, tr, FailureReason::kLeaseExpired, "a layer pull finished after the prefill peer's lease (with margin) ended");
      return;
    }
    tr.layer_blocks_done += pull.count;
    tr.pulls.emplace_back(pull.issued, now);
    const size_t n = tr.d_blocks.size();
    for (size_t i = pull.first; tr.verify && !tr.failed && i < pull.first + pull.count; ++i) {
      const std::byte* p = region + layerBlockOffset(pull.layer, static_cast<uint32_t>(tr.d_blocks[i].value()),
                                                     static_cast<uint32_t>(layout.num_blocks), layout.bytesPerLayerBlock());
      uint64_t got = kvproto::layerBlockChecksum(std::span<const std::byte>(p, layout.bytesPerLayerBlock()));
      metrics.checksum_checked.increment();
      if (got != tr.checksums[pull.layer * n + i]) {
        fail(tid, tr, FailureReason::kChecksumMismatch, strCat("layer ", pull.layer, " block ", i, " checksum differs"));
        return;
      }
    }
    maybeEnd(tid, tr);
    maybeComplete(tid, tr);
  }

  void onLayerReady(uint64_t tid, Transfer& tr, const kvproto::LayerReady& l) {
    if (tr.failed || transport_closed.load()) return;
    const size_t n = tr.d_blocks.size();
    if (tr.p_blocks.size() != n || !peer || static_cast<uint64_t>(l.first_block) + l.checksums.size() > n) {
      fail(tid, tr, FailureReason::kTransferFailed,
           strCat("layer announcement (blocks [", l.first_block, ", ", static_cast<uint64_t>(l.first_block) + l.checksums.size(),
                  ")) does not match the ", n, " accepted blocks"));
      return;
    }
    if (tr.lease_deadline && SystemClock::instance().now() >= *tr.lease_deadline) {
      fail(tid, tr, FailureReason::kLeaseExpired, "a layer was announced too close to the end of the prefill peer's lease");
      return;
    }
    for (size_t i = l.first_block; i < l.first_block + l.checksums.size(); ++i) {
      // PrefillAccepted may have arrived before P's Hello, unchecked then.
      if (tr.p_blocks[i] >= peer->num_blocks) {
        fail(tid, tr, FailureReason::kTransferFailed,
             strCat("accepted block ", i, " is block ", tr.p_blocks[i], ", outside the prefill peer's ", peer->num_blocks));
        return;
      }
    }
    if (l.checksums.empty()) return;
    for (size_t i = l.first_block; i < l.first_block + l.checksums.size(); ++i) {
      if (tr.requested[l.layer * n + i]) {
        fail(tid, tr, FailureReason::kTransferFailed, strCat("layer ", l.layer, " block ", i, " was announced twice"));
        return;
      }
    }
    for (size_t i = 0; i < l.checksums.size(); ++i) {
      tr.requested[l.layer * n + l.first_block + i] = 1;
      tr.checksums[l.layer * n + l.first_block + i] = l.checksums[i];
    }
    // The range is one logical get; the transport merges blocks that are
    // contiguous on both sides into one UCX get.
    const uint64_t bytes = layout.bytesPerLayerBlock();
    std::vector<transport::UcxTransport::Segment> segments;
    segments.reserve(l.checksums.size());
    for (size_t i = l.first_block; i < l.first_block + l.checksums.size(); ++i) {
      std::byte* local = region + layerBlockOffset(l.layer, static_cast<uint32_t>(tr.d_blocks[i].value()),
                                                   static_cast<uint32_t>(layout.num_blocks), bytes);
      segments.push_back({.local = local, .remote_offset = layerBlockOffset(l.layer, tr.p_blocks[i], peer->num_blocks, bytes),
                          .length = bytes});
    }
    const Pull pull{.layer = l.layer, .first = l.first_block, .count = l.checksums.size(), .issued = SystemClock::instance().now()};
    // The id is known only after getv() returns; the completion may not
    // run before we record it because it needs mu, which we hold.
    auto holder = std::make_shared<GetId>(0);
    GetId g = t->getv(tr.conn, std::move(segments), [this, tid, holder, pull](absl::Status s) {
      if (options.faults.get_complete_delay.count() > 0) {
        // Fault injection: the completion is held, so the get stays
        // outstanding (its blocks must not be freed meanwhile).
        delayed->at(SystemClock::instance().now() + options.faults.get_complete_delay,
                    [this, tid, holder, pull, s = std::move(s)]() mutable { onGetDone(tid, holder, pull, std::move(s)); });
        return;
      }
      onGetDone(tid, holder, pull, std::move(s));
    });
    *holder = g;
    tr.outstanding.insert(g);
  }

  // Starts pulling an announced layer (late, under fault injection).
  void startLayer(uint64_t tid, Transfer& tr, const kvproto::LayerReady& l) {
    if (!delayed) return onLayerReady(tid, tr, l);
    // Fault injection: the gets start late (slow reader).
    delayed->at(SystemClock::instance().now() + options.faults.get_delay, [this, tid, layer = l] {
      std::lock_guard lock(mu);
      if (auto it = transfers.find(tid); it != transfers.end()) onLayerReady(tid, it->second, layer);
    });
  }

  // Layers announced before the request was accepted (or before P's Hello)
  // start once both arrived. Requires mu.
  void drainEarlyLayers(uint64_t tid, Transfer& tr) {
    if (!tr.accepted || !peer || tr.failed) return;
    std::vector<kvproto::LayerReady> early = std::move(tr.early_layers);
    tr.early_layers.clear();
    for (const kvproto::LayerReady& l : early) startLayer(tid, tr, l);
  }

  void onMessage(ConnId c, std::vector<uint8_t> bytes) {
    std::lock_guard lock(mu);
    if (transport_closed.load()) return;
    const uint32_t peer_blocks = peer ? peer->num_blocks : UINT32_MAX;
    auto m = kvproto::decode(bytes, {.num_blocks = peer_blocks, .num_layers = static_cast<uint16_t>(layout.num_layers)});
    if (!m.ok()) {
      log.warn("rejected a control message", {{"error", toStd(m.status().message())}});
      metrics.rejected("malformed");
      return;
    }
    if (c != conn) {
      // Only the connection this agent opened to its prefill peer speaks
      // for P; anyone may connect to the KV listener.
      log.warn("dropped a control message from a connection that is not to the prefill peer",
               {{"conn", c}, {"type", static_cast<int>(kvproto::typeOf(m->body))}});
      metrics.rejected("unknown_peer");
      return;
    }
    if (std::holds_alternative<kvproto::Pong>(m->body)) {
      if (!health.healthy(SystemClock::instance().now())) log.info("prefill peer answers probes again; using it");
      health.recordProbeSuccess();
      return;
    }
    if (auto* h = std::get_if<kvproto::Hello>(&m->body)) {
      if (h->role != kvproto::PeerRole::kPrefill) {
        log.error("the prefill peer's Hello names another role", {{"peer", h->peer_name}, {"role", kvproto::peerRoleName(h->role)}});
        metrics.rejected("unexpected_type");
        return;
      }
      if (h->num_layers != layout.num_layers || h->block_size != layout.block_size || h->num_kv_heads != layout.num_kv_heads ||
          h->head_dim != layout.head_dim || h->dtype != kvproto::KvDtype::kFloat32) {
        peer_incompatible = strCat("the prefill peer ", h->peer_name, " has a different KV layout (", h->num_layers, " layers, block size ",
                                   h->block_size, ", ", h->num_kv_heads, " kv heads, head_dim ", h->head_dim, ", dtype ", static_cast<uint16_t>(h->dtype),
                                   ") than this agent (", layout.num_layers, ", ", layout.block_size, ", ", layout.num_kv_heads,
                                   ", ", layout.head_dim, ", 1): do both serve the same model?");
        log.error("no transfer can work", {{"detail", *peer_incompatible}});
        for (auto& [tid, tr] : transfers) {
          if (tr.conn == c) fail(tid, tr, FailureReason::kTransferFailed, *peer_incompatible);
        }
        return;
      }
      peer_incompatible.reset();
      peer = *h;
      t->setRemoteRegion(c, h->region_base,
                         static_cast<uint64_t>(h->num_blocks) * static_cast<uint64_t>(h->num_layers) * layout.bytesPerLayerBlock(),
                         h->rkey);
      for (auto& [tid, tr] : transfers) {
        if (tr.conn == c) drainEarlyLayers(tid, tr);
      }
      return;
    }
    const bool for_a_transfer = std::holds_alternative<kvproto::PrefillAccepted>(m->body) ||
                                std::holds_alternative<kvproto::LayerReady>(m->body) ||
                                std::holds_alternative<kvproto::PrefillDone>(m->body) ||
                                std::holds_alternative<kvproto::Abort>(m->body);
    if (!for_a_transfer) {
      log.warn("unexpected message for the decode role", {{"type", static_cast<int>(kvproto::typeOf(m->body))}});
      metrics.rejected("unexpected_type");
      return;
    }
    auto it = transfers.find(m->transfer_id);
    if (it == transfers.end() || it->second.conn != c) {
      // Also P's messages that crossed this side's abort of the transfer.
      log.debug("message for an unknown transfer", {{"transfer", m->transfer_id}});
      metrics.rejected("unknown_transfer");
      return;
    }
    Transfer& tr = it->second;
    const uint64_t tid = it->first;
    if (auto* a = std::get_if<kvproto::PrefillAccepted>(&m->body)) {
      if (tr.accepted) {
        fail(tid, tr, FailureReason::kTransferFailed, "the prefill peer accepted the request twice");
        return;
      }
      tr.accepted = true;
      tr.p_blocks = a->block_ids;
      // Never read P's blocks after its lease ends: finish (or fail) with a
      // margin before it, whatever our own deadline says.
      const auto lease_end = SystemClock::instance().now() + std::chrono::milliseconds(static_cast<int64_t>(a->lease_ms) * 9 / 10);
      if (!tr.lease_deadline || lease_end < *tr.lease_deadline) tr.lease_deadline = lease_end;
      if (tr.p_blocks.size() != tr.d_blocks.size()) {
        fail(tid, tr, FailureReason::kTransferFailed,
             strCat("prefill holds ", tr.p_blocks.size(), " blocks, this request has ", tr.d_blocks.size()));
        return;
      }
      drainEarlyLayers(tid, tr);
    } else if (auto* l = std::get_if<kvproto::LayerReady>(&m->body)) {
      tr.last_layer_at = SystemClock::instance().now();
      if (!tr.accepted || !peer) {
        // Every announcement names at least one block of one layer.
        if (tr.early_layers.size() >= static_cast<size_t>(layout.num_layers) * std::max<size_t>(tr.d_blocks.size(), 1)) {
          fail(tid, tr, FailureReason::kTransferFailed, "more layer announcements than layer blocks before the request was accepted");
        } else {
          tr.early_layers.push_back(std::move(*l));
        }
      } else {
        startLayer(tid, tr, *l);
      }
    } else if (auto* d = std::get_if<kvproto::PrefillDone>(&m->body)) {
      tr.first_token = d->first_token;
      maybeComplete(tid, tr);
    } else if (auto* ab = std::get_if<kvproto::Abort>(&m->body)) {
      fail(tid, tr, ab->reason, ab->message, /*tell_peer=*/false);  // P ended it already
    }
  }

  void onDisconnect(ConnId c, const absl::Status& why) {
    std::lock_guard lock(mu);
    if (c == conn) conn = 0;
    for (auto& [tid, tr] : transfers) {
      if (tr.conn == c) fail(tid, tr, FailureReason::kPeerUnhealthy, strCat("prefill peer disconnected: ", toStd(why.message())));
    }
  }

  void watch() {
    std::unique_lock lock(mu);
    while (!stopping) {
      cv.wait_for(lock, std::chrono::milliseconds(10));
      const auto now = SystemClock::instance().now();
      if (!health.healthy(now) && now - last_probe >= options.probe_interval) {
        // Probe an unhealthy peer (reconnecting if needed) so it can come back.
        last_probe = now;
        send(ensureConnected(), 0, kvproto::Ping{});
      }
      for (auto& [tid, tr] : transfers) {
        if (tr.completed || tr.failed) continue;
        if (tr.deadline && *tr.deadline <= now) {
          fail(tid, tr, FailureReason::kPrefillTimeout, "the prefill peer did not deliver the KV in time");
        } else if (tr.lease_deadline && *tr.lease_deadline <= now) {
          fail(tid, tr, FailureReason::kLeaseExpired, "the prefill peer's lease on the KV ran out before the pull finished");
        }
      }
    }
  }

  uint64_t submit(engine::RequestSpec spec, PdUpdateCallback cb) {
    const uint64_t tid = next_tid.fetch_add(1);
    const bool fallback = !health.healthy(SystemClock::instance().now());
    if (fallback) {
      // The prefill peer is unhealthy: compute the prompt here rather than fail.
      return loop.submit(std::move(spec), [cb = std::move(cb)](const engine::RequestUpdate& u) {
        cb(u, PdInfo{.path = PdPath::kFallback});
      });
    }
    spec.import_kv = true;
    spec.direct_max_suffix_tokens = options.direct_max_suffix_tokens;
    {
      std::lock_guard lock(mu);
      Transfer& tr = transfers[tid];
      tr.cb = std::move(cb);
      tr.prompt = spec.prompt;
      tr.sampling = spec.sampling;
      tr.verify = std::uniform_real_distribution<double>(0, 1)(rng) < options.checksum_rate;
    }
    uint64_t handle =
        loop.submit(std::move(spec), [self = shared_from_this(), tid](const engine::RequestUpdate& u) { self->onUpdate(tid, u); });
    std::lock_guard lock(mu);
    if (auto it = transfers.find(tid); it != transfers.end()) it->second.handle = handle;
    by_handle[handle] = tid;
    return handle;
  }

  // Engine thread.
  void onUpdate(uint64_t tid, const engine::RequestUpdate& u) {
    PdUpdateCallback cb;
    PdInfo info;
    {
      std::lock_guard lock(mu);
      auto it = transfers.find(tid);
      if (it == transfers.end()) return;
      Transfer& tr = it->second;
      if (!u.kv_blocks.empty()) {
        tr.id = u.id;
        tr.has_id = true;
        tr.d_blocks = u.kv_blocks;
        tr.checksums.assign(tr.d_blocks.size() * static_cast<size_t>(layout.num_layers), 0);
        tr.requested.assign(tr.d_blocks.size() * static_cast<size_t>(layout.num_layers), 0);
        if (tr.failed) {
          // It failed while still queued here: the cancel posted then may
          // have come too late (it only flags an importing request), so
          // end the import now that it has an id.
          tr.abort_posted = false;
          maybeEnd(tid, tr);
          return;
        }
        tr.conn = ensureConnected();
        if (peer_incompatible) {
          fail(tid, tr, FailureReason::kTransferFailed, *peer_incompatible, /*tell_peer=*/false);  // P never saw it
          return;
        }
        tr.started = SystemClock::instance().now();
        tr.deadline = tr.started + options.prefill_timeout;
        metrics.inflight.increment();
        tr.inflight_counted = true;
        kvproto::PrefillRequest req;
        req.deadline_ms = static_cast<uint32_t>(options.prefill_timeout.count());
        req.lease_ms = static_cast<uint32_t>(options.lease_ttl.count());
        req.tokens.assign(tr.prompt.begin(), tr.prompt.end());
        req.temperature = tr.sampling.temperature;
        req.top_p = tr.sampling.top_p;
        req.top_k = static_cast<uint32_t>(tr.sampling.top_k);
        req.seed = tr.sampling.seed;
        send(tr.conn, tid, std::move(req));
        return;
      }
      if (u.import_abort_requested) {
        // Ends as asked (e.g. cancelled: the client went away), not as an error.
        tr.end_reason = u.finish_reason;
        fail(tid, tr, FailureReason::kCancelled,
             strCat("the request was ended (", engine::finishReasonName(u.finish_reason), ")"));
        return;
      }
      cb = tr.cb;
      if (tr.failed) info.failure = tr.reason;
      info.path = tr.has_id ? PdPath::kDisagg : PdPath::kDirect;
      if (tr.timings && tr.kv_done_at) {
        if (!tr.first_token_out && !u.new_tokens.empty()) {
          tr.first_token_out = true;
          tr.timings->first_step_ms =
              std::chrono::duration<double, std::milli>(SystemClock::instance().now() - *tr.kv_done_at).count();
          metrics.phases(*tr.timings);
        }
        info.timings = tr.timings;
      }
      if (u.finished) {
        if (tr.inflight_counted) metrics.inflight.decrement();
        by_handle.erase(tr.handle);
        transfers.erase(it);
      }
    }
    if (cb) cb(u, info);
  }
};

absl::StatusOr<std::unique_ptr<DecodeService>> DecodeService::start(engine::EngineLoop& loop, const PdOptions& options,
                                                                    PdMetrics& metrics) {
  if (options.peer_host.empty()) return absl::InvalidArgumentError("decode role: no prefill peer configured (--prefill-peer HOST:PORT)");
  auto impl = std::make_shared<Impl>(loop, metrics, options);
  Impl* raw = impl.get();
  std::span<std::byte> region;
  loop.runOnLoop([&](engine::Engine& e) {
    raw->layout = e.kv().layout();
    region = e.kvRegion();
  });
  raw->region = region.data();
  TANDEM_ASSIGN_OR_RETURN(transport::TransportOptions to, transportFor(options, region));
  transport::TransportCallbacks cb;
  cb.on_message = [raw](ConnId c, std::vector<uint8_t> b) { raw->onMessage(c, std::move(b)); };
  cb.on_disconnect = [raw](ConnId c, absl::Status s) { raw->onDisconnect(c, s); };
  TANDEM_ASSIGN_OR_RETURN(impl->t, transport::UcxTransport::start(to, std::move(cb)));
  {
    std::lock_guard lock(raw->mu);
    raw->ensureConnected();
  }
  impl->watchdog = std::thread([raw] { raw->watch(); });
  return std::unique_ptr<DecodeService>(new DecodeService(std::move(impl)));
}

DecodeService::DecodeService(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

DecodeService::~DecodeService() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
    // Cancels each transfer's gets and tells P (the transport still runs).
    for (auto& [tid, tr] : impl_->transfers) impl_->fail(tid, tr, FailureReason::kCancelled, "the agent is shutting down");
  }
  impl_->cv.notify_all();
  impl_->watchdog.join();
  {
    std::lock_guard lock(impl_->mu);
    impl_->transport_closed = true;
  }
  // Destroying the transport completes every outstanding get (cancelled);
  // their callbacks (held back by fault injection until `delayed` goes)
  // post the abortImports. Requests still live after this end when the
  // engine loop stops; their callbacks keep impl_ alive.
  impl_->t->shutdown();  // joins the transport's thread; `t` stays valid for callers until then
  impl_->delayed.reset();
  impl_->t.reset();
}

uint64_t DecodeService::submit(engine::RequestSpec spec, PdUpdateCallback on_update) {
  return impl_->submit(std::move(spec), std::move(on_update));
}

void DecodeService::cancel(uint64_t handle) { impl_->loop.cancel(handle); }
int DecodeService::port() const { return impl_->t->port(); }

}  // namespace tandem::agent
