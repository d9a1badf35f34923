#include "agent/router/worker_feeds.h"

#include <algorithm>

#include "agent/worker_stream_client.h"
#include "src/common/strings.h"

namespace tandem::agent {

struct WorkerFeeds::Feed {
  std::string url;
  routing::WorkerRole expected;
  std::string name;  // from its first snapshot; guarded by the client's callback order (one thread)
  std::unique_ptr<WorkerStreamClient> client;
};

WorkerFeeds::WorkerFeeds(RouterCore& core, const Clock& clock, Logger& log, Duration stale_after,
                         LivenessCallback on_liveness, std::function<std::string()> authorization)
    : core_(core),
      clock_(clock),
      log_(log),
      stale_after_(stale_after),
      on_liveness_(std::move(on_liveness)),
      authorization_(std::move(authorization)) {}

WorkerFeeds::~WorkerFeeds() {
  absl::MutexLock lock(&mu_);
  for (auto& f : feeds_) f->client.reset();  // no callback runs after this
}

void WorkerFeeds::add(const HostPort& address, routing::WorkerRole role) {
  absl::MutexLock lock(&mu_);
  addLocked(address, role);
}

void WorkerFeeds::sync(routing::WorkerRole role, const std::vector<HostPort>& addresses) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> wanted;
  for (const HostPort& a : addresses) wanted.push_back(strCat("http://", a.host, ":", a.port));
  for (auto it = feeds_.begin(); it != feeds_.end();) {
    Feed& f = **it;
    if (f.expected != role || std::find(wanted.begin(), wanted.end(), f.url) != wanted.end()) {
      ++it;
      continue;
    }
    f.client.reset();  // its callbacks have returned and none runs again
    if (!f.name.empty()) core_.removeWorker(f.name);
    log_.info("worker left the router's set", {{"worker", f.name}, {"url", f.url}});
    it = feeds_.erase(it);
  }
  for (size_t i = 0; i < addresses.size(); ++i) {
    const bool have = std::any_of(feeds_.begin(), feeds_.end(),
                                  [&](const std::unique_ptr<Feed>& f) { return f->url == wanted[i]; });
    if (!have) {
      log_.info("worker joined the router's set", {{"url", wanted[i]}});
      addLocked(addresses[i], role);
    }
  }
}

void WorkerFeeds::addLocked(const HostPort& address, routing::WorkerRole role) {
  auto feed = std::make_unique<Feed>();
  Feed* f = feed.get();
  f->url = strCat("http://", address.host, ":", address.port);
  f->expected = role;
  WorkerStreamCallbacks callbacks;
  callbacks.on_snapshot = [this, f](const routing::WorkerSnapshot& s) {
    if (s.role != f->expected && s.role != routing::WorkerRole::kBoth) {
      log_.warn("worker's role differs from its place in the router's configuration",
                {{"url", f->url}, {"worker", s.worker}});
    }
    f->name = s.worker;
    absl::Status st = core_.applySnapshot(s, f->url, s.kv_address);
    if (!st.ok()) log_.warn("worker snapshot refused", {{"url", f->url}, {"error", toStd(st.message())}});
  };
  callbacks.on_delta = [this, f](const routing::WorkerDelta& d) {
    // A delta the state refuses (out of step) leaves the worker stale; the
    // stream client checks sequence numbers itself, so this is a backstop.
    absl::Status st = core_.applyDelta(f->name, d);
    if (!st.ok()) log_.warn("worker delta refused", {{"worker", f->name}, {"error", toStd(st.message())}});
  };
  callbacks.on_stale = [this, f](bool stale) {
    if (stale && !f->name.empty()) core_.markStale(f->name);
  };
  callbacks.on_unresponsive = [this, f](bool unresponsive) {
    if (f->name.empty()) return;  // never reported: the router does not route to it
    core_.setResponsive(f->name, !unresponsive);
    if (unresponsive) {
      log_.warn("worker does not answer; it gets no new requests and those it has not started move",
                {{"worker", f->name}, {"url", f->url}});
    } else {
      log_.info("worker answers again", {{"worker", f->name}});
    }
    if (on_liveness_) on_liveness_(f->name, unresponsive);
  };
  f->client = WorkerStreamClient::start(
      {.url = f->url, .stale_after = stale_after_, .clock = &clock_, .authorization = authorization_},
      std::move(callbacks));
  feeds_.push_back(std::move(feed));
}

}  // namespace tandem::agent
