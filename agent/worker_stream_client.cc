#include "agent/worker_stream_client.h"

#include <algorithm>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "agent/worker_events_json.h"
#include "src/common/log.h"
#include "src/common/strings.h"
#include "src/http/client.h"
#include "src/common/thread_name.h"

namespace tandem::agent {
namespace {

// How one connection ended.
struct StreamEnd {
  absl::Status why;
  bool resync = false;  // a gap or another epoch: reconnect at once for a fresh snapshot
  // The worker does not answer: the stream went silent, or none could be
  // opened (refused, timed out, an HTTP error).
  bool unresponsive = false;
};

}  // namespace

class WorkerStreamClient::Impl {
 public:
  Impl(WorkerStreamOptions options, WorkerStreamCallbacks callbacks)
      : options_(std::move(options)),
        callbacks_(std::move(callbacks)),
        clock_(options_.clock ? *options_.clock : SystemClock::instance()) {
    reader_ = std::thread([this] {
      nameThisThread("stream-reader");
      readLoop();
    });
    watchdog_ = std::thread([this] {
      nameThisThread("stream-watch");
      watchLoop();
    });
  }

  ~Impl() {
    std::shared_ptr<http::SseClient> current;
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      current = current_;
    }
    cv_.SignalAll();
    if (current) current->stop();
    reader_.join();
    watchdog_.join();
  }

 private:
  void readLoop() {
    Duration backoff = options_.backoff_initial;
    for (;;) {
      bool got_snapshot = false;
      StreamEnd end = readOnce(&got_snapshot);
      if (stopped()) return;
      if (got_snapshot) backoff = options_.backoff_initial;
      markStale(end.why);
      if (end.unresponsive) markUnresponsive();
      if (end.resync) continue;
      if (!waitBackoff(backoff)) return;
      backoff = std::min(backoff * 2, options_.backoff_max);
    }
  }

  // One connection: open, then read until it ends.
  StreamEnd readOnce(bool* got_snapshot) {
    // A worker that stalled accepts the connection and answers nothing: an
    // open waits no longer than a stream may be silent.
    http::ClientRequest request{.method = "GET",
                                .url = options_.url + "/internal/v1/events",
                                .timeout = std::min(options_.io_timeout, options_.stale_after)};
    if (options_.authorization) {
      if (std::string a = options_.authorization(); !a.empty()) request.headers["Authorization"] = std::move(a);
    }
    auto opened = http::SseClient::open(request);
    if (!opened.ok()) return {.why = opened.status(), .unresponsive = true};
    std::shared_ptr<http::SseClient> stream = std::move(*opened);
    if (stream->status() != 200) {
      auto body = stream->readBody();
      return {.why = absl::UnavailableError(strCat("HTTP ", stream->status(), ": ", body.ok() ? *body : "")),
              .unresponsive = true};
    }
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return {absl::CancelledError("stopping")};
      current_ = stream;
      last_message_ = clock_.now();
      silent_ = false;
    }
    cv_.SignalAll();
    View view;
    StreamEnd end;
    absl::Status read = stream->readEvents([&](const http::SseEvent& e) {
      {
        absl::MutexLock lock(&mu_);
        last_message_ = clock_.now();
      }
      end = onMessage(e.data, view, got_snapshot);
      return end.why.ok();
    });
    bool silent = false;
    {
      absl::MutexLock lock(&mu_);
      current_ = nullptr;
      // Cut by the watchdog, or by the HTTP library's own timeout (the same
      // length) just before it.
      silent = silent_ || (!read.ok() && clock_.now() >= last_message_ + options_.stale_after);
    }
    if (!end.why.ok()) return end;
    if (silent) {
      return {.why = absl::DeadlineExceededError(
                  strCat("no message for ", std::chrono::duration<double>(options_.stale_after).count(), " s")),
              .unresponsive = true};
    }
    if (read.ok()) return {absl::UnavailableError("the worker ended the stream")};
    return {read};
  }

  // What this connection has seen.
  struct View {
    bool have = false;  // a snapshot arrived
    uint64_t epoch = 0;
    uint64_t seq = 0;  // the last delta applied
  };

  // OK to go on reading; otherwise why the connection ends.
  StreamEnd onMessage(const std::string& data, View& view, bool* got_snapshot) {
    auto event = decodeWorkerEvent(data);
    if (!event.ok()) return {event.status()};
    if (auto* s = std::get_if<routing::WorkerSnapshot>(&*event)) {
      view = {.have = true, .epoch = s->epoch, .seq = s->seq};
      *got_snapshot = true;
      if (callbacks_.on_snapshot) callbacks_.on_snapshot(*s);
      markFresh();
      return {};
    }
    if (!view.have) return {absl::InvalidArgumentError("a message before the snapshot")};
    if (auto* h = std::get_if<WorkerHeartbeat>(&*event)) {
      if (h->epoch != view.epoch || h->seq != view.seq) {
        return {absl::DataLossError(strCat("heartbeat at seq ", h->seq, " after delta ", view.seq)), true};
      }
      return {};
    }
    const auto& d = std::get<routing::WorkerDelta>(*event);
    if (d.epoch != view.epoch) return {absl::DataLossError("the worker's epoch changed"), true};
    if (d.seq != view.seq + 1) {
      return {absl::DataLossError(strCat("delta ", d.seq, " after delta ", view.seq)), true};
    }
    view.seq = d.seq;
    if (callbacks_.on_delta) callbacks_.on_delta(d);
    return {};
  }

  // Once per outage: the callback and a warning; each retry only at debug.
  void markStale(const absl::Status& why) {
    if (stale_reported_) {
      log_.debug("worker state stream still down", {{"worker", options_.url}, {"error", toStd(why.message())}});
      return;
    }
    stale_reported_ = true;
    log_.warn("worker state stream down; its cache view is stale until it reconnects",
              {{"worker", options_.url}, {"error", toStd(why.message())}});
    if (callbacks_.on_stale) callbacks_.on_stale(true);
  }

  // Once per outage, after markStale.
  void markUnresponsive() {
    if (unresponsive_reported_) return;
    unresponsive_reported_ = true;
    if (callbacks_.on_unresponsive) callbacks_.on_unresponsive(true);
  }

  void markFresh() {
    if (unresponsive_reported_) {
      unresponsive_reported_ = false;
      if (callbacks_.on_unresponsive) callbacks_.on_unresponsive(false);
    }
    if (!stale_reported_) return;
    stale_reported_ = false;
    log_.info("worker state stream restored", {{"worker", options_.url}});
    if (callbacks_.on_stale) callbacks_.on_stale(false);
  }

  // False when stopping.
  bool waitBackoff(Duration backoff) {
    absl::MutexLock lock(&mu_);
    const MonoTime until = clock_.now() + backoff;
    while (!stopping_) {
      if (clock_.waitUntil(cv_, mu_, until)) break;
    }
    return !stopping_;
  }

  bool stopped() {
    absl::MutexLock lock(&mu_);
    return stopping_;
  }

  // Cuts a stream that stayed silent for stale_after.
  void watchLoop() {
    while (std::shared_ptr<http::SseClient> silent = waitForSilence()) silent->stop();
  }

  // The open stream once it has been silent for stale_after (each stream
  // once); null when stopping.
  std::shared_ptr<http::SseClient> waitForSilence() {
    absl::MutexLock lock(&mu_);
    while (!stopping_) {
      if (!current_ || silent_) {
        clock_.waitUntil(cv_, mu_, MonoTime::max());
        continue;
      }
      if (clock_.waitUntil(cv_, mu_, last_message_ + options_.stale_after) && current_ && !silent_ &&
          clock_.now() >= last_message_ + options_.stale_after) {
        silent_ = true;
        return current_;
      }
    }
    return nullptr;
  }

  const WorkerStreamOptions options_;
  const WorkerStreamCallbacks callbacks_;
  const Clock& clock_;
  Logger log_{"events"};
  bool stale_reported_ = false;         // reader thread only
  bool unresponsive_reported_ = false;  // reader thread only

  absl::Mutex mu_;
  absl::CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<http::SseClient> current_ ABSL_GUARDED_BY(mu_);  // the open stream
  MonoTime last_message_ ABSL_GUARDED_BY(mu_);
  bool silent_ ABSL_GUARDED_BY(mu_) = false;  // the watchdog cut current_

  std::thread reader_;
  std::thread watchdog_;
};

std::unique_ptr<WorkerStreamClient> WorkerStreamClient::start(WorkerStreamOptions options,
                                                              WorkerStreamCallbacks callbacks) {
  return std::unique_ptr<WorkerStreamClient>(
      new WorkerStreamClient(std::make_unique<Impl>(std::move(options), std::move(callbacks))));
}

WorkerStreamClient::WorkerStreamClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
WorkerStreamClient::~WorkerStreamClient() = default;

}  // namespace tandem::agent
