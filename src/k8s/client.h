#pragma once
// A typed Kubernetes REST client. Objects are nlohmann::json.
//
//   TANDEM_ASSIGN_OR_RETURN(auto config, k8s::loadDefaultConfig());
//   TANDEM_ASSIGN_OR_RETURN(auto client, k8s::Client::create(config));
//   auto pod = client->get(k8s::podsResource(), "default", "p0");
//   if (k8s::isNotFound(pod.status())) ...
//
// Every call is one HTTP request. Errors: the API server's metav1.Status
// becomes an absl::Status carrying a K8sError (errors.h); transport failures
// are Unavailable / DeadlineExceeded with no K8sError; a 2xx body that is not
// JSON is Internal.
//
// Namespaces: for a namespaced resource, an empty `ns` means the client's
// default namespace for single-object calls, and all namespaces for list and
// watch. Cluster-scoped resources ignore `ns`.
//
// Thread-safety: a Client may be used from any number of threads. A Watch is
// read by one thread; its stop() may be called from any thread.

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "src/k8s/config.h"
#include "src/k8s/resource.h"
#include "src/k8s/transport.h"

namespace tandem::k8s {

struct ClientOptions {
  Duration requestTimeout = std::chrono::seconds(30);
};

struct GetOptions {
  std::string subresource;  // "status", "scale"
  std::string resourceVersion;
};

struct ListOptions {
  std::string labelSelector;    // formatLabelSelector() or any selector string
  std::string fieldSelector;    // "metadata.name=x"
  std::string resourceVersion;  // "" = most recent (a consistent read)
  int64_t limit = 0;            // 0 = no limit; list() follows continue tokens itself
};

struct ObjectList {
  std::vector<nlohmann::json> items;
  std::string resourceVersion;  // the list's metadata.resourceVersion: watch from here
};

struct WatchOptions {
  std::string labelSelector;
  std::string fieldSelector;
  std::string resourceVersion;  // "" or "0": start with ADDED for what exists
  bool allowBookmarks = true;
  int timeoutSeconds = 0;  // 0: the server's default; the server ends the watch cleanly then
};

enum class WatchEventType { kAdded, kModified, kDeleted, kBookmark, kError };

struct WatchEvent {
  WatchEventType type = WatchEventType::kAdded;
  nlohmann::json object;  // for kError: a metav1.Status (see parseStatusObject)
};

// One watch connection. next() blocks for the next event.
class Watch {
 public:
  explicit Watch(std::unique_ptr<LineStream> lines) : lines_(std::move(lines)) {}
  // The next event; nullopt when the server ended the watch (timeoutSeconds
  // or a clean close: re-watch from the last resourceVersion seen).
  // Cancelled after stop(); Unavailable when the connection broke;
  // InvalidArgument for a line that is not a watch event.
  absl::StatusOr<std::optional<WatchEvent>> next();
  // Closes the connection; thread-safe, idempotent.
  void stop() { lines_->stop(); }

 private:
  std::unique_ptr<LineStream> lines_;
};

struct WriteOptions {
  std::string fieldManager;
  bool dryRun = false;
};

enum class PatchType { kMerge, kJson, kStrategicMerge };

struct PatchOptions {
  std::string fieldManager;
  std::string subresource;  // "status", "scale"
  bool dryRun = false;
};

// Server-side apply. `fieldManager` is required by the API server.
struct ApplyOptions {
  std::string fieldManager;
  bool force = false;  // take over fields other managers own
  std::string subresource;
  bool dryRun = false;
};

enum class PropagationPolicy { kDefault, kBackground, kForeground, kOrphan };

struct DeleteOptions {
  PropagationPolicy propagationPolicy = PropagationPolicy::kDefault;
  std::optional<int64_t> gracePeriodSeconds;
  // Preconditions: delete only this exact object.
  std::string preconditionUid;
  std::string preconditionResourceVersion;
  bool dryRun = false;
};

class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> create(const ClusterConfig& config, ClientOptions options = {});
  // The seam for tests and for other transports.
  static std::unique_ptr<Client> createWithTransport(std::unique_ptr<Transport> transport,
                                                     std::string defaultNamespace = "default",
                                                     ClientOptions options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const std::string& defaultNamespace() const { return defaultNamespace_; }

  absl::StatusOr<nlohmann::json> get(const ResourceRef& ref, std::string_view ns, std::string_view name,
                                     const GetOptions& options = {});
  absl::StatusOr<ObjectList> list(const ResourceRef& ref, std::string_view ns, const ListOptions& options = {});
  absl::StatusOr<std::unique_ptr<Watch>> watch(const ResourceRef& ref, std::string_view ns,
                                               const WatchOptions& options = {});
  absl::StatusOr<nlohmann::json> create(const ResourceRef& ref, std::string_view ns, const nlohmann::json& object,
                                        const WriteOptions& options = {});
  // PUT of the whole object; its metadata.name names it and its
  // metadata.resourceVersion is checked by the server (409 Conflict if stale).
  absl::StatusOr<nlohmann::json> update(const ResourceRef& ref, std::string_view ns, const nlohmann::json& object,
                                        const WriteOptions& options = {});
  // PUT of the /status subresource: only status changes.
  absl::StatusOr<nlohmann::json> updateStatus(const ResourceRef& ref, std::string_view ns, const nlohmann::json& object,
                                              const WriteOptions& options = {});
  absl::StatusOr<nlohmann::json> patch(const ResourceRef& ref, std::string_view ns, std::string_view name,
                                       PatchType type, const nlohmann::json& patch, const PatchOptions& options = {});
  // JSON merge patch (RFC 7386: null deletes).
  absl::StatusOr<nlohmann::json> mergePatch(const ResourceRef& ref, std::string_view ns, std::string_view name,
                                            const nlohmann::json& patch, const PatchOptions& options = {}) {
    return this->patch(ref, ns, name, PatchType::kMerge, patch, options);
  }
  absl::StatusOr<nlohmann::json> mergePatchStatus(const ResourceRef& ref, std::string_view ns, std::string_view name,
                                                  const nlohmann::json& patch, PatchOptions options = {}) {
    options.subresource = "status";
    return this->patch(ref, ns, name, PatchType::kMerge, patch, options);
  }
  // Server-side apply of `object` (its apiVersion, kind and metadata.name
  // must be set): PATCH application/apply-patch+yaml; creates if missing.
  absl::StatusOr<nlohmann::json> apply(const ResourceRef& ref, std::string_view ns, const nlohmann::json& object,
                                       const ApplyOptions& options);
  // The deleted object (or, while finalizers hold it, the object with its
  // deletionTimestamp set), or a Status{status: Success}.
  absl::StatusOr<nlohmann::json> remove(const ResourceRef& ref, std::string_view ns, std::string_view name,
                                        const DeleteOptions& options = {});

  // Escape hatch: sends `request` as is; non-2xx become statuses as above.
  absl::StatusOr<nlohmann::json> send(const HttpRequest& request);

 private:
  Client(std::unique_ptr<Transport> transport, std::string defaultNamespace, ClientOptions options);
  std::string resolveNamespace(const ResourceRef& ref, std::string_view ns) const;

  std::unique_ptr<Transport> transport_;
  const std::string defaultNamespace_;
  const ClientOptions options_;
};

// The HTTP requests the client sends; pure, exposed for tests.
std::string watchEventTypeName(WatchEventType type);
absl::StatusOr<WatchEvent> parseWatchEvent(std::string_view line);
std::string_view patchContentType(PatchType type);
nlohmann::json deleteOptionsBody(const DeleteOptions& options);

}  // namespace tandem::k8s
