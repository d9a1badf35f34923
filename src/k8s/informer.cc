#include "src/k8s/informer.h"

#include "absl/time/time.h"
#include "src/common/log.h"
#include "src/common/strings.h"
#include "src/k8s/errors.h"

namespace tandem::k8s {

namespace {
const Logger kLog("k8s");
// A clean watch end with no event sooner than this after opening backs off.
constexpr Duration kShortWatch = std::chrono::seconds(1);
}  // namespace

Informer::Informer(Client& client, InformerOptions options, InformerHandlers handlers)
    : client_(client),
      options_(std::move(options)),
      handlers_(std::move(handlers)),
      retryDelay_(options_.minRetryDelay) {}

Informer::~Informer() { stop(); }

void Informer::start() {
  thread_ = std::thread([this] { run(); });
  if (options_.resyncPeriod > Duration::zero()) resyncThread_ = std::thread([this] { runResync(); });
}

void Informer::stop() {
  if (!stopping_.HasBeenNotified()) stopping_.Notify();
  {
    absl::MutexLock lock(&mu_);
    if (watch_) watch_->stop();
  }
  if (thread_.joinable()) thread_.join();
  if (resyncThread_.joinable()) resyncThread_.join();
}

bool Informer::waitForSync(Duration timeout) const {
  return synced_.WaitForNotificationWithTimeout(absl::FromChrono(timeout));
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
  stopping_.WaitForNotificationWithTimeout(absl::FromChrono(retryDelay_));
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
  {
    absl::MutexLock lock(&mu_);
    resourceVersion_ = list->resourceVersion;
    ++stats_.numLists;
  }
  if (!synced_.HasBeenNotified()) synced_.Notify();
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
  if (stopping_.HasBeenNotified()) (*watch)->stop();
  bool mustRelist = false;
  bool failed = false;
  int64_t numEvents = 0;
  auto openedAt = std::chrono::steady_clock::now();
  while (true) {
    absl::StatusOr<std::optional<WatchEvent>> event = (*watch)->next();
    if (!event.ok()) {
      if (!stopping_.HasBeenNotified()) {
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
  if (!failed && numEvents == 0 && std::chrono::steady_clock::now() - openedAt < kShortWatch) return Next::kRetryLater;
  return failed ? Next::kRetryLater : Next::kWatch;
}

void Informer::run() {
  Next next = Next::kRelist;
  while (!stopping_.HasBeenNotified()) {
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
  while (!stopping_.WaitForNotificationWithTimeout(absl::FromChrono(options_.resyncPeriod))) {
    if (!hasSynced()) continue;
    for (const nlohmann::json& obj : cache_.list()) {
      absl::MutexLock lock(&dispatchMu_);
      if (handlers_.onUpdate) handlers_.onUpdate(obj, obj);
    }
  }
}

}  // namespace tandem::k8s
