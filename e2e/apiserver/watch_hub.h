#pragma once
// The open watches: each replays history from its resourceVersion, then
// receives the store's changes as they happen (Store::addWatcher), as
// newline-delimited JSON events on its stream. K8S_API_NOTES.md, "Watch and
// versions":
//  - resourceVersion unset or "0" (or sendInitialEvents=true): ADDED for
//    what exists now, then changes; otherwise only changes after it;
//  - history no longer reaching back: an ERROR event with a 410 Expired
//    Status, then the stream ends;
//  - sendInitialEvents: the initial ADDEDs end with a BOOKMARK annotated
//    k8s.io/initial-events-end;
//  - BOOKMARKs (the store's current resourceVersion) only to watches that
//    asked, every bookmarkInterval;
//  - objects that start or stop matching the selectors arrive as ADDED / DELETED;
//  - a watch ends cleanly at its deadline (timeoutSeconds, or the server's
//    maximum, or the watch-drop fault).
//
// Time: deadlines and bookmarks are read from the injected clock. The hub
// does not wait itself: its owner calls tick(now) when nextDeadline() comes,
// or when `wake` was notified (a client went away, a stream broke, a watch
// opened), and waits with clock.waitUntil in between.
//
// Not thread-safe: every call runs under the Router's mutex (store events
// too). Only `wake` is touched from other threads.

#include <map>
#include <memory>
#include <string>

#include "e2e/apiserver/resource_types.h"
#include "e2e/apiserver/selectors.h"
#include "e2e/apiserver/store.h"
#include "e2e/apiserver/wakeup.h"
#include "src/common/clock.h"

namespace tandem::http {
class SseWriter;
}

namespace tandem::apiserver {

// What one watch asked for.
struct WatchSpec {
  ResourceType type;
  std::string ns;  // "" = all namespaces
  Selector labels;
  Selector fields;
  bool table = false;         // each event's object is a one-row Table
  std::string includeObject;  // the Table rows' object: "Object" or metadata only
  bool bookmarks = false;
  Duration limit = std::chrono::minutes(30);  // ends this long after it opened
  std::string resourceVersion;
  bool sendInitialEvents = false;
};

class WatchHub {
 public:
  // Neither `store` nor `clock` is owned; both outlive the hub.
  WatchHub(Store& store, const Clock& clock, Duration bookmarkInterval, std::shared_ptr<Wakeup> wake)
      : store_(store), clock_(clock), bookmarkInterval_(bookmarkInterval), wake_(std::move(wake)) {}
  ~WatchHub() { closeAll(); }
  WatchHub(const WatchHub&) = delete;
  WatchHub& operator=(const WatchHub&) = delete;

  // Starts a watch on `writer` (the stream of an accepted request).
  void open(WatchSpec spec, std::shared_ptr<http::SseWriter> writer);
  // Ends watches past their deadline, whose client left or whose stream
  // broke; sends the bookmarks that are due.
  void tick(MonoTime now);
  // When tick() has work next; MonoTime::max() when none.
  MonoTime nextDeadline() const;
  // Every open watch ends by `deadline` at the latest.
  void limitAll(MonoTime deadline);
  // Ends every watch; watches opened later end at once. Idempotent.
  void closeAll();
  size_t numOpen() const { return sessions_.size(); }

 private:
  struct Session;
  void replay(Session& s);

  Store& store_;
  const Clock& clock_;
  const Duration bookmarkInterval_;
  const std::shared_ptr<Wakeup> wake_;
  std::map<Store::WatcherId, std::shared_ptr<Session>> sessions_;
  bool closed_ = false;
};

}  // namespace tandem::apiserver
