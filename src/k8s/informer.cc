#include "src/k8s/informer.h"

#include "src/common/log.h"
#include "src/common/strings.h"
#include "src/k8s/errors.h"

namespace tandem::k8s {

namespace {
const Logger kLog("k8s");
// A clean watch end with no event sooner than this after opening backs off.
constexpr Duration kShortWatch = std::chrono::seconds(1);
}  // namespace

Informer::Informer(Client& client, const Clock& clock, InformerOptions options, InformerHandlers handlers)
    : client_(client),
      clock_(clock),
      options_(std::move(options)),
      handlers_(std::move(handlers)),
      retryDelay_(options_.minRetryDelay) {}

Informer::~Informer() { stop(); }

void Informer::start() {
  thread_ = std::thread([this] { run(); });
  if (options_.resyncPeriod > Duration::zero()) resyncThread_ = std::thread([this] { runResync(); });
}

void Informer::stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    changed_.SignalAll();
    if (watch_) watch_->stop();
  }
  if (thread_.joinable()) thread_.join();
  if (resyncThread_.joinable()) resyncThread_.join();
}

bool Informer::hasSynced() const {
  absl::MutexLock lock(&mu_);
  return synced_;
}

bool Informer::waitForSync(Duration timeout) const {
  absl::MutexLock lock(&mu_);
  MonoTime deadline = clock_.now() + timeout;
  while (!synced_ && !clock_.waitUntil(changed_, mu_, deadline)) {
  }
  return synced_;
}

bool Informer::stopping() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

bool Informer::waitStopOrUntil(MonoTime deadline) const {
  absl::MutexLock lock(&mu_);
  while (!stopping_ && !clock_.waitUntil(changed_, mu_, deadline)) {
  }
  return stopping_;
}

InformerStats Informer::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

std::string Informer::lastResourceVersion() const {
  absl::MutexLock lock(&mu_);
  return resourceVersion_;
}

void Informer::setResourceVersion(const nlohmann::json& obj) {
  std::string rv = objectResourceVersion(obj);
  if (rv.empty()) return;
  absl::MutexLock lock(&mu_);
  resourceVersion_ = std::move(rv);
}

void Informer::dispatch(const Delta& delta) {
  absl::MutexLock lock(&dispatchMu_);
  switch (delta.type) {
    case Delta::Type::kAdded:
      if (handlers_.onAdd) handlers_.onAdd(delta.object);
      break;
    case Delta::Type::kUpdated:
      if (handlers_.onUpdate) handlers_.onUpdate(delta.old, delta.object);
      break;
    case Delta::Type::kDeleted:
      if (handlers_.onDelete) handlers_.onDelete(delta.object);
      break;
  }
}

void Informer::backoff() {
  waitStopOrUntil(clock_.now() + retryDelay_);
  retryDelay_ = std::min(retryDelay_ * 2, options_.maxRetryDelay);
}

bool Informer::relist() {
  ListOptions listOptions{.labelSelector = options_.labelSelector, .fieldSelector = options_.fieldSelector};
  absl::StatusOr<ObjectList> list = client_.list(options_.resource, options_.ns, listOptions);
  if (!list.ok()) {
    kLog.warn("list failed", {{"resource", options_.resource.resource}, {"error", toStd(list.status().message())}});
    return false;
  }
  for (const Delta& delta : cache_.replace(std::move(list->items))) dispatch(delta);
  absl::MutexLock lock(&mu_);
  resourceVersion_ = list->resourceVersion;
  ++stats_.numLists;
  synced_ = true;
  changed_.SignalAll();
  return true;
}

Informer::Next Informer::watchOnce() {
  WatchOptions watchOptions{.labelSelector = options_.labelSelector,
                            .fieldSelector = options_.fieldSelector,
                            .resourceVersion = lastResourceVersion(),
                            .allowBookmarks = true,
                            .timeoutSeconds = options_.watchTimeoutSeconds};
  absl::StatusOr<std::unique_ptr<Watch>> watch = client_.watch(options_.resource, options_.ns, watchOptions);
  if (!watch.ok()) {
    absl::MutexLock lock(&mu_);
    if (isResourceExpired(watch.status())) {
      ++stats_.numExpired;
      return Next::kRelist;
    }
    ++stats_.numWatchErrors;
    return Next::kRetryLater;
  }
  {
    absl::MutexLock lock(&mu_);
    ++stats_.numWatches;
    watch_ = watch->get();
  }
  // stop() may have run before watch_ was set.
  if (stopping()) (*watch)->stop();
  bool mustRelist = false;
  bool failed = false;
  int64_t numEvents = 0;
  MonoTime openedAt = clock_.now();
  while (true) {
    absl::StatusOr<std::optional<WatchEvent>> event = (*watch)->next();
    if (!event.ok()) {
      if (!stopping()) {
        kLog.info("watch broke",
                  {{"resource", options_.resource.resource}, {"error", toStd(event.status().message())}});
        failed = true;
      }
      break;
    }
    if (!event->has_value()) break;  // ended cleanly: re-watch from the last RV
    WatchEvent& e = **event;
    ++numEvents;
    retryDelay_ = options_.minRetryDelay;
    switch (e.type) {
      case WatchEventType::kBookmark:
        setResourceVersion(e.object);
        break;
      case WatchEventType::kAdded:
      case WatchEventType::kModified:
        setResourceVersion(e.object);
        if (auto delta = cache_.upsert(std::move(e.object))) dispatch(*delta);
        break;
      case WatchEventType::kDeleted:
        setResourceVersion(e.object);
        if (auto delta = cache_.erase(e.object)) dispatch(*delta);
        break;
      case WatchEventType::kError: {
        K8sError error = parseStatusObject(e.object);
        if (error.code == 410 || error.reason == K8sErrorReason::kExpired || error.reason == K8sErrorReason::kGone) {
          mustRelist = true;
        } else {
          kLog.warn("watch error event", {{"resource", options_.resource.resource}, {"message", error.message}});
          failed = true;
        }
        break;
      }
    }
    if (mustRelist || failed) break;
  }
  (*watch)->stop();
  {
    absl::MutexLock lock(&mu_);
    watch_ = nullptr;
    if (mustRelist) ++stats_.numExpired;
    if (failed) ++stats_.numWatchErrors;
  }
  if (mustRelist) return Next::kRelist;
  // A watch the server closes at once, empty, again and again (a proxy, an
  // overloaded server) must not turn into a busy loop.
  if (!failed && numEvents == 0 && clock_.now() - openedAt < kShortWatch) return Next::kRetryLater;
  return failed ? Next::kRetryLater : Next::kWatch;
}

void Informer::run() {
  Next next = Next::kRelist;
  while (!stopping()) {
    if (next == Next::kRelist) {
      if (!relist()) {
        backoff();
        continue;
      }
      retryDelay_ = options_.minRetryDelay;
    }
    next = watchOnce();
    if (next == Next::kRetryLater) backoff();
  }
}

void Informer::runResync() {
  while (!waitStopOrUntil(clock_.now() + options_.resyncPeriod)) {
    if (!hasSynced()) continue;
    for (const nlohmann::json& obj : cache_.list()) {
      absl::MutexLock lock(&dispatchMu_);
      if (handlers_.onUpdate) handlers_.onUpdate(obj, obj);
    }
  }
}

}  // namespace tandem::k8s
