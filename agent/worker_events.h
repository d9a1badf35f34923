#pragma once
// The worker-state stream's source (GET /internal/v1/events, docs/routing.md
// "Worker state stream"): what this worker's engine holds (prefix-cache
// block hashes, resident sessions) and its load, as one snapshot per
// subscriber followed by every delta after it, in order.
//
//   engine thread ──onEngineStep──▶ state + numbered deltas ──▶ pump thread ──▶ sinks
//                     (cheap, never waits on a subscriber)       (encodes, sends)
//
// Invariants:
// - seq numbers the deltas from 1 (per epoch, chosen at random at start);
//   a snapshot with seq S holds every delta <= S and none after; a
//   subscriber gets its snapshot, then deltas S+1, S+2, ... with no gap.
// - The last max_buffered_deltas deltas are kept. A subscriber that falls
//   further behind (its sink still holds more than max_unsent_bytes when its
//   next delta leaves the buffer) is closed and counted: it reconnects and
//   resnapshots. Nothing a subscriber does makes the engine thread wait.
// - Block events are batched per engine step (one message per run of
//   stored or removed hashes, order kept); load is sent when it changes, at
//   most once per load_interval (the latest value then), a change of
//   `draining` at once.
// - A subscriber that got nothing for heartbeat_interval gets a heartbeat
//   (the seq it has), so a router notices a dead worker by silence.
// - Draining: once draining and the engine has nothing running or waiting,
//   every stream is ended after what it was owed, so the HTTP drain does not
//   wait out its grace period for event streams.
//
// Thread-safe: every public method may be called from any thread.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "engine/engine.h"
#include "src/common/clock.h"
#include "src/metrics/metrics.h"
#include "src/routing/worker_state.h"

namespace tandem::agent {

// Where one subscriber's messages go (the HTTP stream; a test's recorder).
// Methods are called from the publisher's pump thread only.
class WorkerEventSink {
 public:
  virtual ~WorkerEventSink() = default;
  // Sends one message (a JSON object). False once the subscriber is gone.
  virtual bool send(std::string_view message) = 0;
  // Bytes sent and not yet delivered: how far behind the subscriber reads.
  virtual size_t numUnsentBytes() const = 0;
  // Ends the stream after what was sent.
  virtual void close() = 0;
};

struct WorkerEventsOptions {
  std::string worker;  // the worker's name (its pod name)
  routing::WorkerRole role = routing::WorkerRole::kBoth;
  int block_size = 16;
  BlockHash hash_root{0};
  int64_t max_context_tokens = 0;
  routing::WorkerLoad initial_load;  // the engine's load before its first step
  // A load delta at most this often (the latest value is sent); 0: every change.
  Duration load_interval = std::chrono::milliseconds(50);
  // A stream that carried nothing this long gets a heartbeat; 0: none.
  Duration heartbeat_interval = std::chrono::seconds(5);
  // Deltas kept for subscribers that read slowly.
  size_t max_buffered_deltas = 4096;
  // A subscriber whose sink holds more than this gets nothing more until it
  // drains; it is retried this often (and whenever new deltas come).
  size_t max_unsent_bytes = 4u << 20;
  Duration held_back_retry = std::chrono::milliseconds(20);
  uint64_t epoch = 0;  // 0: random
  // Not owned; must outlive the publisher. Null: SystemClock::instance().
  const Clock* clock = nullptr;
};

class WorkerEventsPublisher {
 public:
  // Starts the pump thread. Metrics (tandem_events_*) register on `registry`
  // with `labels` (pool, role).
  static std::unique_ptr<WorkerEventsPublisher> start(WorkerEventsOptions options, metrics::Registry& registry,
                                                      const metrics::Labels& labels);
  // Ends every stream and joins the pump thread.
  ~WorkerEventsPublisher();
  WorkerEventsPublisher(const WorkerEventsPublisher&) = delete;
  WorkerEventsPublisher& operator=(const WorkerEventsPublisher&) = delete;

  // The engine thread, after every step (EngineLoop's observer): applies
  // what changed and the load now. Never waits for a subscriber.
  void onEngineStep(engine::RoutableChanges changes, const engine::StepStats& stats);
  // The KV listener's address as peers reach it ("HOST:PORT"), once the
  // P/D service bound it; later snapshots carry it (routers name a prefill
  // agent to D by it). Set before the HTTP server starts serving.
  void setKvAddress(std::string address);
  // The agent started (or stopped) draining; sent at once.
  void setDraining(bool draining);

  // Adds a subscriber: it gets a snapshot, then every delta after it.
  // Returns an id for unsubscribe().
  uint64_t subscribe(std::shared_ptr<WorkerEventSink> sink);
  // Forgets a subscriber (its client went away). Unknown ids are ignored.
  void unsubscribe(uint64_t id);

  uint64_t epoch() const;

  class Impl;

 private:
  explicit WorkerEventsPublisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The load a step reports, as routers see it (draining is the agent's).
routing::WorkerLoad workerLoad(const engine::StepStats& stats, bool draining);

}  // namespace tandem::agent
