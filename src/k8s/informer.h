#pragma once
// An informer: keeps a local cache of one resource in sync with the API
// server and tells handlers what changed.
//
//   Informer informer(client, clock, {.resource = podsResource(), .ns = "default"},
//                     {.onAdd = [&](const json& o) { queue.add(objectKey(o)); }, ...});
//   informer.start();
//   if (!informer.waitForSync(10s)) ...
//   auto pod = informer.cache().get("default", "p0");
//
// Protocol (client-go's Reflector): LIST, then WATCH from the list's
// resourceVersion with allowWatchBookmarks and timeoutSeconds. A watch that
// ends cleanly is re-opened from the last resourceVersion seen (events and
// bookmarks advance it). HTTP 410 or an ERROR event with code 410 (history
// too old) → relist from "" (a consistent read); the cache diffs the fresh
// list against what it holds, so objects deleted meanwhile get onDelete and
// nothing is reported twice. Other failures retry with exponential backoff.
//
// Time: retry backoff, the resync period, the short-watch check and
// waitForSync() read the injected clock and wait with clock.waitUntil, so
// a FakeClock drives them (FakeClock::numWaiters() shows the informer parked
// in a backoff or between resyncs).
//
// Handlers run on the informer's thread, one at a time (resync included);
// they should be quick (enqueue a key) and must not call stop(). Being
// level-triggered, consumers should read the cache rather than depend on
// seeing every intermediate state.
//
// Thread-safety: start() and stop() from one owner thread; cache(),
// hasSynced() and waitForSync() from any thread.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "src/common/clock.h"
#include "src/k8s/client.h"
#include "src/k8s/object_cache.h"

namespace tandem::k8s {

struct InformerOptions {
  ResourceRef resource;
  std::string ns;  // "" = all namespaces
  std::string labelSelector;
  std::string fieldSelector;
  // > 0: every period, onUpdate(obj, obj) for every cached object, so
  // controllers re-check state they might have dropped.
  Duration resyncPeriod = Duration::zero();
  // Asked of the server per watch; it then ends the watch cleanly and the
  // informer re-watches.
  int watchTimeoutSeconds = 300;
  Duration minRetryDelay = std::chrono::milliseconds(100);
  Duration maxRetryDelay = std::chrono::seconds(30);
};

struct InformerHandlers {
  std::function<void(const nlohmann::json& obj)> onAdd;
  std::function<void(const nlohmann::json& old, const nlohmann::json& obj)> onUpdate;
  std::function<void(const nlohmann::json& lastKnown)> onDelete;

  // One handler for every change, given the object as it now is (or was
  // last known): what a level-triggered controller that only enqueues needs.
  static InformerHandlers onAnyChange(std::function<void(const nlohmann::json& obj)> f) {
    return {.onAdd = f, .onUpdate = [f](const nlohmann::json&, const nlohmann::json& o) { f(o); }, .onDelete = f};
  }
};

// Counters, for logs and tests.
struct InformerStats {
  int64_t numLists = 0;
  int64_t numWatches = 0;
  int64_t numExpired = 0;      // 410s seen (each caused a relist)
  int64_t numWatchErrors = 0;  // broken connections and non-410 failures
};

class Informer {
 public:
  // `client` and `clock` are not owned and must outlive the informer.
  Informer(Client& client, const Clock& clock, InformerOptions options, InformerHandlers handlers);
  ~Informer();  // stop()s
  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  void start();
  // Ends the watch and joins the threads. Idempotent.
  void stop();

  // True once the first list landed in the cache.
  bool hasSynced() const;
  // Waits until hasSynced() or `timeout` passed on the clock; returns hasSynced().
  bool waitForSync(Duration timeout) const;
  const ObjectCache& cache() const { return cache_; }
  InformerStats stats() const;
  std::string lastResourceVersion() const;

 private:
  void run();
  void runResync();
  // One LIST into the cache; false on failure.
  bool relist();
  enum class Next { kWatch, kRelist, kRetryLater };
  // One WATCH until it ends; says what to do next.
  Next watchOnce();
  void dispatch(const Delta& delta);
  void backoff();
  // Waits until stop() or `deadline`; true when stopping.
  bool waitStopOrUntil(MonoTime deadline) const;
  bool stopping() const;
  void setResourceVersion(const nlohmann::json& obj);

  Client& client_;
  const Clock& clock_;
  const InformerOptions options_;
  const InformerHandlers handlers_;
  ObjectCache cache_;
  std::thread thread_;
  std::thread resyncThread_;
  Duration retryDelay_;  // informer thread only

  absl::Mutex dispatchMu_;  // handlers run one at a time

  mutable absl::Mutex mu_;
  // Signalled when synced_ or stopping_ turns true.
  mutable absl::CondVar changed_;
  bool synced_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string resourceVersion_ ABSL_GUARDED_BY(mu_);
  Watch* watch_ ABSL_GUARDED_BY(mu_) = nullptr;  // the open watch, for stop()
  InformerStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::k8s
