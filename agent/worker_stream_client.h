#pragma once
// A router's subscription to one worker's state stream (GET
// /internal/v1/events, docs/routing.md "Worker state stream"): connects,
// decodes (worker_events_json.h), and hands the snapshot and then each delta,
// in order, to callbacks. The view is kept exact or given up:
//
// - a delta whose seq is not the previous + 1, or of another epoch (the
//   worker restarted), or a heartbeat that says the stream skipped a delta:
//   the connection is dropped and a fresh one starts at once with a new
//   snapshot (recovery costs one snapshot, never a replay);
// - nothing at all (no delta, no heartbeat) for stale_after, on the injected
//   clock: the worker is taken for dead and the connection dropped;
// - a failed connection is retried with exponential backoff on the clock
//   (backoff_initial doubling to backoff_max; back to the start after a
//   snapshot).
//
// While there is no live stream the view is stale: on_stale(true) once per
// outage (logged once, not per retry), on_stale(false) right after the
// snapshot that ends it. When the outage is the worker's silence rather
// than a resync, on_unresponsive says so (the router's liveness view). Before the first snapshot nothing is reported
// unless the first attempt fails.
//
// Threads: a reader thread (blocking HTTP reads) and a watchdog (silence),
// both the client's. Callbacks run on the reader thread, one at a time, and
// must not destroy the client. The destructor stops both; no callback runs
// after it returns (an open in progress may hold it up to io_timeout).

#include <functional>
#include <memory>
#include <string>

#include "src/common/clock.h"
#include "src/routing/worker_state.h"

namespace tandem::agent {

struct WorkerStreamOptions {
  std::string url;  // the worker's base URL, "http://host:port"
  // No message (delta or heartbeat) this long: the stream is taken for dead.
  // Keep it a few times the workers' heartbeat (events.heartbeat, 5 s).
  Duration stale_after = std::chrono::seconds(15);
  Duration backoff_initial = std::chrono::milliseconds(100);
  Duration backoff_max = std::chrono::seconds(5);
  // The HTTP library's own limit (real time) on connecting and on silence:
  // a backstop behind stale_after.
  Duration io_timeout = std::chrono::seconds(30);
  // Not owned; must outlive the client. Null: SystemClock::instance().
  const Clock* clock = nullptr;
  // The Authorization header each connection sends (the pool's token,
  // agent/internal_auth.h), asked again per connection so a rotated key is
  // picked up; unset or "": none.
  std::function<std::string()> authorization;
};

struct WorkerStreamCallbacks {
  // A fresh view: replaces everything known of the worker.
  std::function<void(const routing::WorkerSnapshot&)> on_snapshot;
  // The next delta after the last snapshot or delta (same epoch, seq + 1).
  std::function<void(const routing::WorkerDelta&)> on_delta;
  // true: the view stopped being kept current; false: it is again.
  std::function<void(bool stale)> on_stale;
  // true (after on_stale(true)): the worker does not answer: its stream went
  // silent for stale_after, or a new one could not be opened (refused,
  // timed out, an HTTP error); once per outage. false: right before the
  // on_stale(false) of the snapshot that ends it. A stream dropped only to
  // resynchronise (a gap, another epoch) says nothing of the worker.
  std::function<void(bool unresponsive)> on_unresponsive;
};

class WorkerStreamClient {
 public:
  // Starts connecting at once.
  static std::unique_ptr<WorkerStreamClient> start(WorkerStreamOptions options, WorkerStreamCallbacks callbacks);
  ~WorkerStreamClient();
  WorkerStreamClient(const WorkerStreamClient&) = delete;
  WorkerStreamClient& operator=(const WorkerStreamClient&) = delete;

  class Impl;

 private:
  explicit WorkerStreamClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::agent
