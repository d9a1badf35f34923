#include "agent/worker_events.h"

#include <deque>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "agent/worker_events_json.h"
#include "src/common/check.h"
#include "src/common/thread_name.h"

namespace tandem::agent {
namespace {

using routing::WorkerDelta;
using routing::WorkerDeltaBody;
using routing::WorkerLoad;

uint64_t randomEpoch() {
  std::random_device rd;
  std::mt19937_64 rng((static_cast<uint64_t>(rd()) << 32) ^ rd());
  uint64_t e = 0;
  while (e == 0) e = rng();
  return e;
}

// One subscriber. `sink` and `id` are fixed; the rest is the pump thread's.
struct Subscriber {
  uint64_t id = 0;
  std::shared_ptr<WorkerEventSink> sink;
  uint64_t next_seq = 0;  // the next delta it is owed
  MonoTime last_sent;     // when it last got a message
};

// An encoded delta in the pump's buffer.
struct Entry {
  uint64_t seq;
  std::string wire;
};

}  // namespace

routing::WorkerLoad workerLoad(const engine::StepStats& s, bool draining) {
  return {.free_blocks = s.num_free_blocks,
          .total_blocks = s.num_total_blocks,
          .running = s.num_running,
          .waiting = s.num_waiting,
          .waiting_prompt_tokens = s.queue_tokens,
          .draining = draining};
}

class WorkerEventsPublisher::Impl {
 public:
  Impl(WorkerEventsOptions options, metrics::Registry& r, const metrics::Labels& labels)
      : options_(std::move(options)),
        clock_(options_.clock ? *options_.clock : SystemClock::instance()),
        epoch_(options_.epoch != 0 ? options_.epoch : randomEpoch()),
        subscribers_(metrics::buildGauge()
                         .name("tandem_events_subscribers")
                         .help("Subscribers of the worker-state stream (/internal/v1/events) connected now.")
                         .labels(labels)
                         .registerOn(r)
                         .add({})),
        deltas_sent_(metrics::buildCounter()
                         .name("tandem_events_deltas_sent_total")
                         .help("Worker-state deltas written to subscribers (one per subscriber and delta).")
                         .labels(labels)
                         .registerOn(r)
                         .add({})),
        snapshots_sent_(metrics::buildCounter()
                            .name("tandem_events_snapshots_sent_total")
                            .help("Worker-state snapshots written to subscribers (one per connection).")
                            .labels(labels)
                            .registerOn(r)
                            .add({})),
        dropped_(metrics::buildCounter()
                     .name("tandem_events_subscribers_dropped_total")
                     .help("Subscribers closed because they fell behind the buffered deltas (they resnapshot).")
                     .labels(labels)
                     .registerOn(r)
                     .add({})) {
    sent_load_ = options_.initial_load;
    idle_ = sent_load_.running == 0 && sent_load_.waiting == 0;
    load_sent_at_ = MonoTime::min();  // the first change goes out at once
    pump_ = std::thread([this] {
      nameThisThread("events-pump");
      run();
    });
  }

  ~Impl() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    cv_.SignalAll();
    pump_.join();
  }

  uint64_t epoch() const { return epoch_; }

  void onEngineStep(engine::RoutableChanges changes, const engine::StepStats& stats) {
    absl::MutexLock lock(&mu_);
    const size_t before = incoming_.size();
    applyBlocks(changes.blocks);
    for (engine::SessionResidency& r : changes.sessions) applySession(std::move(r));
    idle_ = stats.num_running == 0 && stats.num_waiting == 0;
    observeLoad(workerLoad(stats, draining_));
    if (incoming_.size() != before || pending_load_ || (draining_ && idle_)) cv_.SignalAll();
  }

  void setKvAddress(std::string address) {
    absl::MutexLock lock(&mu_);
    kv_address_ = std::move(address);
  }

  void setDraining(bool draining) {
    absl::MutexLock lock(&mu_);
    draining_ = draining;
    WorkerLoad l = pending_load_.value_or(sent_load_);
    l.draining = draining;
    observeLoad(l);
    cv_.SignalAll();
  }

  uint64_t subscribe(std::shared_ptr<WorkerEventSink> sink) {
    absl::MutexLock lock(&mu_);
    auto sub = std::make_shared<Subscriber>();
    sub->id = next_id_++;
    sub->sink = std::move(sink);
    joining_.push_back(sub);
    cv_.SignalAll();
    return sub->id;
  }

  void unsubscribe(uint64_t id) {
    absl::MutexLock lock(&mu_);
    leaving_.insert(id);
    cv_.SignalAll();
  }

 private:
  // What the pump takes from the engine's side in one go.
  struct Work {
    std::vector<WorkerDelta> deltas;
    std::vector<std::pair<std::shared_ptr<Subscriber>, routing::WorkerSnapshot>> joining;
    absl::flat_hash_set<uint64_t> leaving;
    bool close_all = false;  // draining and idle: end every stream
  };

  void push(WorkerDeltaBody body) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    incoming_.push_back(WorkerDelta{.epoch = epoch_, .seq = ++seq_, .body = std::move(body)});
  }

  // One message per run of stored (or removed) hashes, so order is kept.
  void applyBlocks(const std::vector<engine::KvEvent>& events) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<BlockHash> run;
    for (size_t i = 0; i < events.size(); ++i) {
      const engine::KvEvent& e = events[i];
      if (i > 0 && events[i - 1].kind != e.kind) pushRun(events[i - 1].kind, run);
      const bool changed =
          e.kind == engine::KvEvent::Kind::kStored ? cached_.insert(e.hash).second : cached_.erase(e.hash) > 0;
      if (changed) run.push_back(e.hash);
    }
    if (!events.empty()) pushRun(events.back().kind, run);
  }

  void pushRun(engine::KvEvent::Kind kind, std::vector<BlockHash>& run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (run.empty()) return;
    if (kind == engine::KvEvent::Kind::kStored) {
      push(routing::BlocksStored{std::move(run)});
    } else {
      push(routing::BlocksRemoved{std::move(run)});
    }
    run.clear();
  }

  // A session stored again with the same blocks (the scheduler takes and
  // puts back a session it protects from eviction) is no change.
  void applySession(engine::SessionResidency r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = sessions_.find(r.id);
    if (!r.resident) {
      if (it == sessions_.end()) return;
      sessions_.erase(it);
      push(routing::SessionRemoved{std::move(r.id)});
      return;
    }
    if (it != sessions_.end() && it->second.hashes == r.hashes && it->second.num_tokens == r.num_tokens) return;
    routing::ResidentSessionBlocks s{.session = r.id, .hashes = std::move(r.hashes), .num_tokens = r.num_tokens};
    sessions_[r.id] = s;
    push(routing::SessionStored{std::move(s)});
  }

  // Sends `l` now if it differs from the last load sent and load_interval
  // has passed (or draining changed); otherwise keeps it for the pump.
  void observeLoad(const WorkerLoad& l) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (l == sent_load_) {
      pending_load_.reset();
      return;
    }
    const MonoTime now = clock_.now();
    if (l.draining != sent_load_.draining || now >= load_sent_at_ + options_.load_interval) {
      sendLoad(l, now);
    } else {
      pending_load_ = l;
    }
  }

  void sendLoad(const WorkerLoad& l, MonoTime now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    sent_load_ = l;
    load_sent_at_ = now;
    pending_load_.reset();
    push(l);
  }

  routing::WorkerSnapshot snapshot() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    routing::WorkerSnapshot s{.epoch = epoch_,
                              .seq = seq_,
                              .worker = options_.worker,
                              .kv_address = kv_address_,
                              .role = options_.role,
                              .block_size = options_.block_size,
                              .hash_root = options_.hash_root,
                              .max_context_tokens = options_.max_context_tokens,
                              .load = sent_load_};
    s.cached.assign(cached_.begin(), cached_.end());
    s.sessions.reserve(sessions_.size());
    for (const auto& [id, r] : sessions_) s.sessions.push_back(r);
    return s;
  }

  // Waits until there is something to do or `deadline` (the pump's next
  // heartbeat or retry), then takes it.
  bool takeWork(MonoTime deadline, Work* w) {
    absl::MutexLock lock(&mu_);
    for (;;) {
      if (stop_) return false;
      const MonoTime now = clock_.now();
      // Due, or the last word before the streams end for the drain.
      if (pending_load_ && (now >= load_sent_at_ + options_.load_interval || (draining_ && idle_))) {
        sendLoad(*pending_load_, now);
      }
      const bool drain_due = draining_ && idle_ && !drain_closed_;
      if (!incoming_.empty() || !joining_.empty() || !leaving_.empty() || drain_due || now >= deadline) break;
      MonoTime wake = deadline;
      if (pending_load_) wake = std::min(wake, load_sent_at_ + options_.load_interval);
      clock_.waitUntil(cv_, mu_, wake);
    }
    w->deltas.swap(incoming_);
    for (auto& sub : joining_) w->joining.emplace_back(std::move(sub), snapshot());
    joining_.clear();
    w->leaving.swap(leaving_);
    w->close_all = draining_ && idle_;
    drain_closed_ = w->close_all;
    return true;
  }

  void run() {
    MonoTime deadline = MonoTime::max();
    Work w;
    while (takeWork(deadline, &w)) {
      buffer(std::move(w.deltas));
      for (auto& [sub, snap] : w.joining) {
        sub->next_seq = snap.seq + 1;
        sub->last_sent = clock_.now();
        if (sub->sink->send(encodeWorkerSnapshot(snap))) {
          snapshots_sent_.increment();
          subs_.push_back(std::move(sub));
        }
      }
      if (!w.leaving.empty()) {
        std::erase_if(subs_, [&](const auto& s) { return w.leaving.contains(s->id); });
      }
      deadline = serveAll();
      trim();
      if (w.close_all) closeAll();
      subscribers_.set(static_cast<double>(subs_.size()));
      w = Work{};
    }
    closeAll();
    subscribers_.set(0);
  }

  // Encodes new deltas into the buffer. With no subscriber nobody needs
  // them: the next one starts from a snapshot that holds them.
  void buffer(std::vector<WorkerDelta> deltas) {
    if (subs_.empty()) {
      ring_.clear();
      return;
    }
    for (const WorkerDelta& d : deltas) ring_.push_back({d.seq, encodeWorkerDelta(d)});
  }

  // Keeps the last max_buffered_deltas deltas (after serving, so a burst
  // larger than the buffer still reaches the subscribers that keep up);
  // a subscriber that still needs one that leaves is dropped.
  void trim() {
    if (ring_.size() <= options_.max_buffered_deltas) return;
    ring_.erase(ring_.begin(), ring_.end() - static_cast<ptrdiff_t>(options_.max_buffered_deltas));
    std::erase_if(subs_, [&](const std::shared_ptr<Subscriber>& s) {
      if (s->next_seq >= ring_.front().seq) return false;
      dropped_.increment();
      s->sink->close();
      return true;
    });
  }

  // Sends each subscriber what it is owed (or a heartbeat). Returns when the
  // pump is next due: a subscriber's heartbeat, or a retry for one held back
  // by its backlog (also retried whenever new deltas come).
  MonoTime serveAll() {
    const MonoTime now = clock_.now();
    MonoTime next = MonoTime::max();
    std::erase_if(subs_, [&](const std::shared_ptr<Subscriber>& s) {
      std::optional<MonoTime> due = serve(*s, now);
      if (due) next = std::min(next, *due);
      return !due;
    });
    return next;
  }

  // When the subscriber is next due (MonoTime::max(): only on new deltas);
  // nothing when it is gone.
  std::optional<MonoTime> serve(Subscriber& s, MonoTime now) {
    TANDEM_CHECK(ring_.empty() || s.next_seq >= ring_.front().seq, "a subscriber behind the buffer was not dropped");
    const Duration heartbeat = options_.heartbeat_interval;
    const uint64_t last = ring_.empty() ? s.next_seq - 1 : ring_.back().seq;
    while (s.next_seq <= last) {
      if (s.sink->numUnsentBytes() > options_.max_unsent_bytes) return now + options_.held_back_retry;
      if (!s.sink->send(ring_[s.next_seq - ring_.front().seq].wire)) return std::nullopt;
      deltas_sent_.increment();
      ++s.next_seq;
      s.last_sent = now;
    }
    if (heartbeat <= Duration::zero()) return MonoTime::max();
    if (now >= s.last_sent + heartbeat) {
      if (!s.sink->send(encodeWorkerHeartbeat({.epoch = epoch_, .seq = s.next_seq - 1}))) return std::nullopt;
      s.last_sent = now;
    }
    return s.last_sent + heartbeat;
  }

  void closeAll() {
    for (const auto& s : subs_) s->sink->close();
    subs_.clear();
  }

  const WorkerEventsOptions options_;
  std::string kv_address_ ABSL_GUARDED_BY(mu_);  // setKvAddress
  const Clock& clock_;
  const uint64_t epoch_;
  metrics::Gauge& subscribers_;
  metrics::Counter& deltas_sent_;
  metrics::Counter& snapshots_sent_;
  metrics::Counter& dropped_;

  absl::Mutex mu_;
  absl::CondVar cv_;
  // The state a snapshot holds: every delta up to seq_ applied.
  absl::flat_hash_set<BlockHash> cached_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<SessionId, routing::ResidentSessionBlocks> sessions_ ABSL_GUARDED_BY(mu_);
  WorkerLoad sent_load_ ABSL_GUARDED_BY(mu_);
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  // A newer load than sent_load_, due at load_sent_at_ + load_interval.
  std::optional<WorkerLoad> pending_load_ ABSL_GUARDED_BY(mu_);
  MonoTime load_sent_at_ ABSL_GUARDED_BY(mu_);
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool idle_ ABSL_GUARDED_BY(mu_) = false;          // nothing running or waiting at the last step
  bool drain_closed_ ABSL_GUARDED_BY(mu_) = false;  // the streams were ended for the drain
  // Handed from the other threads to the pump.
  std::vector<WorkerDelta> incoming_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Subscriber>> joining_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint64_t> leaving_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  // The pump thread's: encoded deltas [ring_.front().seq, ring_.back().seq], and the subscribers.
  std::deque<Entry> ring_;
  std::vector<std::shared_ptr<Subscriber>> subs_;
  std::thread pump_;
};

std::unique_ptr<WorkerEventsPublisher> WorkerEventsPublisher::start(WorkerEventsOptions options,
                                                                    metrics::Registry& registry,
                                                                    const metrics::Labels& labels) {
  return std::unique_ptr<WorkerEventsPublisher>(
      new WorkerEventsPublisher(std::make_unique<Impl>(std::move(options), registry, labels)));
}

WorkerEventsPublisher::WorkerEventsPublisher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
WorkerEventsPublisher::~WorkerEventsPublisher() = default;

void WorkerEventsPublisher::onEngineStep(engine::RoutableChanges changes, const engine::StepStats& stats) {
  impl_->onEngineStep(std::move(changes), stats);
}
void WorkerEventsPublisher::setDraining(bool draining) { impl_->setDraining(draining); }
void WorkerEventsPublisher::setKvAddress(std::string address) { impl_->setKvAddress(std::move(address)); }
uint64_t WorkerEventsPublisher::subscribe(std::shared_ptr<WorkerEventSink> sink) {
  return impl_->subscribe(std::move(sink));
}
void WorkerEventsPublisher::unsubscribe(uint64_t id) { impl_->unsubscribe(id); }
uint64_t WorkerEventsPublisher::epoch() const { return impl_->epoch(); }

}  // namespace tandem::agent
