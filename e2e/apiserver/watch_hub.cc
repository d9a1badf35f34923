#include "e2e/apiserver/watch_hub.h"

#include <nlohmann/json.hpp>

#include "e2e/apiserver/api_error.h"
#include "e2e/apiserver/discovery.h"
#include "e2e/apiserver/object_meta.h"
#include "src/common/strings.h"
#include "src/http/server.h"

namespace tandem::apiserver {

using nlohmann::json;

// One open watch.
struct WatchHub::Session {
  WatchSpec spec;
  std::shared_ptr<http::SseWriter> writer;
  const Clock* clock = nullptr;
  Wakeup* wake = nullptr;
  MonoTime deadline;
  MonoTime nextBookmark;
  Store::WatcherId id = 0;
  bool broken = false;  // a send failed: the client is gone

  bool matches(const json& o) const {
    return (spec.ns.empty() || nsOf(o) == spec.ns) && spec.labels.matches(o) && spec.fields.matches(o);
  }

  json viewOf(const json& o) const {
    json v = view(spec.type, o);
    if (!spec.table) return v;
    return tableDoc(spec.type, {v}, resourceVersionOf(v), spec.includeObject, false, clock->wallNow());
  }

  void send(const std::string& type, const json& object) {
    if (broken) return;
    json e = {{"type", type}, {"object", object}};
    if (!writer->sendRaw(e.dump(-1, ' ', false, json::error_handler_t::replace) + "\n")) {
      broken = true;
      wake->notify();
    }
  }

  // A change of the store, as this watch should see it: objects that start
  // or stop matching the selectors arrive as ADDED / DELETED.
  void deliver(const StoreEvent& e) {
    bool deleted = e.type == EventType::kDeleted;
    bool now = !deleted && matches(e.object);
    bool before = deleted ? matches(e.object) : (!e.oldObject.is_null() && matches(e.oldObject));
    if (deleted) {
      if (before) send("DELETED", viewOf(e.object));
    } else if (now && before) {
      send("MODIFIED", viewOf(e.object));
    } else if (now) {
      send("ADDED", viewOf(e.object));
    } else if (before) {
      send("DELETED", viewOf(e.object));
    }
  }

  void bookmark(uint64_t rv, bool initialEventsEnd) {
    json m = {{"resourceVersion", std::to_string(rv)}};
    if (initialEventsEnd) m["annotations"] = {{"k8s.io/initial-events-end", "true"}};
    send("BOOKMARK", {{"kind", spec.type.kind}, {"apiVersion", spec.type.apiVersion()}, {"metadata", m}});
  }

  bool finished(MonoTime now) const { return broken || now >= deadline || writer->cancelled(); }
};

void WatchHub::open(WatchSpec spec, std::shared_ptr<http::SseWriter> writer) {
  if (closed_) {
    writer->close();
    return;
  }
  auto s = std::make_shared<Session>();
  s->spec = std::move(spec);
  s->writer = std::move(writer);
  s->clock = &clock_;
  s->wake = wake_.get();
  MonoTime now = clock_.now();
  s->deadline = now + s->spec.limit;
  s->nextBookmark = now + bookmarkInterval_;
  // A client that goes away is noticed by the server (a failed write); the
  // timer thread then ends the watch. The callback must not take the
  // Router's mutex, so it only wakes that thread.
  s->writer->context().onCancel([wake = wake_] { wake->notify(); });
  replay(*s);
  if (s->writer == nullptr) return;  // expired: already ended
  Session* raw = s.get();
  s->id = store_.addWatcher(s->spec.type.storageKey(), [raw](const StoreEvent& e) { raw->deliver(e); });
  sessions_[s->id] = std::move(s);
  wake_->notify();  // its deadline may be the earliest now
}

// What the watch sees before live changes: everything (rv unset or "0",
// sendInitialEvents) or the history after its resourceVersion.
void WatchHub::replay(Session& s) {
  const std::string& rv = s.spec.resourceVersion;
  const std::string key = s.spec.type.storageKey();
  if (rv.empty() || rv == "0" || s.spec.sendInitialEvents) {
    for (const json* o : store_.list(key, s.spec.ns)) {
      if (s.matches(*o)) s.send("ADDED", s.viewOf(*o));
    }
    if (s.spec.sendInitialEvents) s.bookmark(store_.currentRv(), true);
    return;
  }
  auto events = store_.eventsAfter(key, std::stoull(rv));
  if (!events) {
    ApiError e = expired(strCat("too old resource version: ", rv, " (", store_.compactedRv() + 1, ")"));
    s.send("ERROR", e.toStatus());
    s.writer->close();
    s.writer = nullptr;
    return;
  }
  for (const StoreEvent* e : *events) s.deliver(*e);
}

void WatchHub::tick(MonoTime now) {
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    Session& s = *it->second;
    if (s.finished(now)) {
      store_.removeWatcher(it->first);
      s.writer->close();
      it = sessions_.erase(it);
      continue;
    }
    if (s.spec.bookmarks && now >= s.nextBookmark) {
      s.bookmark(store_.currentRv(), false);
      s.nextBookmark = now + bookmarkInterval_;
    }
    ++it;
  }
}

MonoTime WatchHub::nextDeadline() const {
  MonoTime next = MonoTime::max();
  for (const auto& [id, s] : sessions_) {
    if (s->broken || s->writer->cancelled()) return MonoTime::min();
    next = std::min(next, s->deadline);
    if (s->spec.bookmarks) next = std::min(next, s->nextBookmark);
  }
  return next;
}

void WatchHub::limitAll(MonoTime deadline) {
  for (auto& [id, s] : sessions_) s->deadline = std::min(s->deadline, deadline);
  wake_->notify();
}

void WatchHub::closeAll() {
  closed_ = true;
  for (auto& [id, s] : sessions_) {
    store_.removeWatcher(id);
    s->writer->close();
  }
  sessions_.clear();
}

}  // namespace tandem::apiserver
