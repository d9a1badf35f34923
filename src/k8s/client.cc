#include "src/k8s/client.h"

#include "src/common/status.h"
#include "src/common/strings.h"
#include "src/k8s/errors.h"

namespace tandem::k8s {

namespace {

// A watch longer than this without any byte (not even a bookmark) is
// treated as a broken connection.
constexpr Duration kWatchSilence = std::chrono::minutes(5);

absl::StatusOr<nlohmann::json> parseBody(const HttpResponse& response, std::string_view what) {
  if (response.body.empty()) return nlohmann::json::object();
  try {
    return nlohmann::json::parse(response.body);
  } catch (const nlohmann::json::exception& e) {
    return absl::InternalError(strCat(what, ": response is not JSON: ", e.what()));
  }
}

void addCommon(QueryParams& q, std::string_view fieldManager, bool dryRun) {
  if (!fieldManager.empty()) q.emplace_back("fieldManager", std::string(fieldManager));
  if (dryRun) q.emplace_back("dryRun", "All");
}

}  // namespace

std::string watchEventTypeName(WatchEventType type) {
  switch (type) {
    case WatchEventType::kAdded:
      return "ADDED";
    case WatchEventType::kModified:
      return "MODIFIED";
    case WatchEventType::kDeleted:
      return "DELETED";
    case WatchEventType::kBookmark:
      return "BOOKMARK";
    case WatchEventType::kError:
      return "ERROR";
  }
  return "";
}

absl::StatusOr<WatchEvent> parseWatchEvent(std::string_view line) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(strCat("watch event is not JSON: ", e.what()));
  }
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string() || !j.contains("object")) {
    return absl::InvalidArgumentError(strCat("not a watch event: ", line.substr(0, 200)));
  }
  std::string type = j["type"].get<std::string>();
  WatchEvent event;
  if (type == "ADDED")
    event.type = WatchEventType::kAdded;
  else if (type == "MODIFIED")
    event.type = WatchEventType::kModified;
  else if (type == "DELETED")
    event.type = WatchEventType::kDeleted;
  else if (type == "BOOKMARK")
    event.type = WatchEventType::kBookmark;
  else if (type == "ERROR")
    event.type = WatchEventType::kError;
  else
    return absl::InvalidArgumentError(strCat("unknown watch event type '", type, "'"));
  event.object = std::move(j["object"]);
  return event;
}

absl::StatusOr<std::optional<WatchEvent>> Watch::next() {
  TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> line, lines_->nextLine());
  if (!line) return std::optional<WatchEvent>();
  TANDEM_ASSIGN_OR_RETURN(WatchEvent event, parseWatchEvent(*line));
  return std::optional<WatchEvent>(std::move(event));
}

std::string_view patchContentType(PatchType type) {
  switch (type) {
    case PatchType::kMerge:
      return "application/merge-patch+json";
    case PatchType::kJson:
      return "application/json-patch+json";
    case PatchType::kStrategicMerge:
      return "application/strategic-merge-patch+json";
  }
  return "";
}

nlohmann::json deleteOptionsBody(const DeleteOptions& options) {
  nlohmann::json body = {{"kind", "DeleteOptions"}, {"apiVersion", "v1"}};
  switch (options.propagationPolicy) {
    case PropagationPolicy::kDefault:
      break;
    case PropagationPolicy::kBackground:
      body["propagationPolicy"] = "Background";
      break;
    case PropagationPolicy::kForeground:
      body["propagationPolicy"] = "Foreground";
      break;
    case PropagationPolicy::kOrphan:
      body["propagationPolicy"] = "Orphan";
      break;
  }
  if (options.gracePeriodSeconds) body["gracePeriodSeconds"] = *options.gracePeriodSeconds;
  if (!options.preconditionUid.empty()) body["preconditions"]["uid"] = options.preconditionUid;
  if (!options.preconditionResourceVersion.empty()) {
    body["preconditions"]["resourceVersion"] = options.preconditionResourceVersion;
  }
  if (options.dryRun) body["dryRun"] = nlohmann::json::array({"All"});
  return body;
}

absl::StatusOr<std::unique_ptr<Client>> Client::create(const ClusterConfig& config, ClientOptions options) {
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Transport> transport, makeHttpTransport(config));
  return createWithTransport(std::move(transport), config.defaultNamespace, options);
}

std::unique_ptr<Client> Client::createWithTransport(std::unique_ptr<Transport> transport, std::string defaultNamespace,
                                                    ClientOptions options) {
  return std::unique_ptr<Client>(new Client(std::move(transport), std::move(defaultNamespace), options));
}

Client::Client(std::unique_ptr<Transport> transport, std::string defaultNamespace, ClientOptions options)
    : transport_(std::move(transport)), defaultNamespace_(std::move(defaultNamespace)), options_(options) {}

Client::~Client() = default;

std::string Client::resolveNamespace(const ResourceRef& ref, std::string_view ns) const {
  if (!ref.namespaced) return "";
  return ns.empty() ? defaultNamespace_ : std::string(ns);
}

absl::StatusOr<nlohmann::json> Client::send(const HttpRequest& request) {
  std::string what = strCat(request.method, " ", request.path);
  TANDEM_ASSIGN_OR_RETURN(HttpResponse response, transport_->send(request));
  if (response.status < 200 || response.status >= 300) return statusFromResponse(response.status, response.body, what);
  return parseBody(response, what);
}

absl::StatusOr<nlohmann::json> Client::get(const ResourceRef& ref, std::string_view ns, std::string_view name,
                                           const GetOptions& options) {
  QueryParams q;
  if (!options.resourceVersion.empty()) q.emplace_back("resourceVersion", options.resourceVersion);
  return send({.method = "GET",
               .path = objectPath(ref, resolveNamespace(ref, ns), name, options.subresource) + encodeQuery(q),
               .timeout = options_.requestTimeout});
}

absl::StatusOr<ObjectList> Client::list(const ResourceRef& ref, std::string_view ns, const ListOptions& options) {
  ObjectList out;
  std::string continueToken;
  do {
    QueryParams q;
    if (!options.labelSelector.empty()) q.emplace_back("labelSelector", options.labelSelector);
    if (!options.fieldSelector.empty()) q.emplace_back("fieldSelector", options.fieldSelector);
    if (!options.resourceVersion.empty() && continueToken.empty()) {
      q.emplace_back("resourceVersion", options.resourceVersion);
    }
    if (options.limit > 0) q.emplace_back("limit", strCat(options.limit));
    if (!continueToken.empty()) q.emplace_back("continue", continueToken);
    TANDEM_ASSIGN_OR_RETURN(
        nlohmann::json page,
        send({.method = "GET", .path = collectionPath(ref, ns) + encodeQuery(q), .timeout = options_.requestTimeout}));
    if (!page.is_object() || !page.contains("items")) {
      return absl::InternalError(strCat("list ", collectionPath(ref, ns), ": response has no items"));
    }
    if (page["items"].is_array()) {
      for (nlohmann::json& item : page["items"]) out.items.push_back(std::move(item));
    }
    const nlohmann::json& meta = page.value("metadata", nlohmann::json::object());
    out.resourceVersion = meta.value("resourceVersion", "");
    continueToken = meta.value("continue", "");
  } while (!continueToken.empty());
  return out;
}

absl::StatusOr<std::unique_ptr<Watch>> Client::watch(const ResourceRef& ref, std::string_view ns,
                                                     const WatchOptions& options) {
  QueryParams q = {{"watch", "true"}};
  if (!options.resourceVersion.empty()) q.emplace_back("resourceVersion", options.resourceVersion);
  if (options.allowBookmarks) q.emplace_back("allowWatchBookmarks", "true");
  if (options.timeoutSeconds > 0) q.emplace_back("timeoutSeconds", strCat(options.timeoutSeconds));
  if (!options.labelSelector.empty()) q.emplace_back("labelSelector", options.labelSelector);
  if (!options.fieldSelector.empty()) q.emplace_back("fieldSelector", options.fieldSelector);
  Duration silence = kWatchSilence;
  if (options.timeoutSeconds > 0) silence = std::chrono::seconds(options.timeoutSeconds) + std::chrono::seconds(30);
  HttpRequest request{.method = "GET", .path = collectionPath(ref, ns) + encodeQuery(q), .timeout = silence};
  TANDEM_ASSIGN_OR_RETURN(StreamResponse response, transport_->stream(request));
  if (response.status < 200 || response.status >= 300) {
    return statusFromResponse(response.status, response.errorBody, strCat("GET ", request.path));
  }
  return std::make_unique<Watch>(std::move(response.lines));
}

absl::StatusOr<nlohmann::json> Client::create(const ResourceRef& ref, std::string_view ns, const nlohmann::json& object,
                                              const WriteOptions& options) {
  QueryParams q;
  addCommon(q, options.fieldManager, options.dryRun);
  return send({.method = "POST",
               .path = collectionPath(ref, resolveNamespace(ref, ns)) + encodeQuery(q),
               .contentType = "application/json",
               .body = object.dump(),
               .timeout = options_.requestTimeout});
}

absl::StatusOr<nlohmann::json> Client::update(const ResourceRef& ref, std::string_view ns, const nlohmann::json& object,
                                              const WriteOptions& options) {
  std::string name = objectName(object);
  if (name.empty()) return absl::InvalidArgumentError("update: object has no metadata.name");
  QueryParams q;
  addCommon(q, options.fieldManager, options.dryRun);
  return send({.method = "PUT",
               .path = objectPath(ref, resolveNamespace(ref, ns), name) + encodeQuery(q),
               .contentType = "application/json",
               .body = object.dump(),
               .timeout = options_.requestTimeout});
}

absl::StatusOr<nlohmann::json> Client::updateStatus(const ResourceRef& ref, std::string_view ns,
                                                    const nlohmann::json& object, const WriteOptions& options) {
  std::string name = objectName(object);
  if (name.empty()) return absl::InvalidArgumentError("updateStatus: object has no metadata.name");
  QueryParams q;
  addCommon(q, options.fieldManager, options.dryRun);
  return send({.method = "PUT",
               .path = objectPath(ref, resolveNamespace(ref, ns), name, "status") + encodeQuery(q),
               .contentType = "application/json",
               .body = object.dump(),
               .timeout = options_.requestTimeout});
}

absl::StatusOr<nlohmann::json> Client::patch(const ResourceRef& ref, std::string_view ns, std::string_view name,
                                             PatchType type, const nlohmann::json& patch, const PatchOptions& options) {
  QueryParams q;
  addCommon(q, options.fieldManager, options.dryRun);
  return send({.method = "PATCH",
               .path = objectPath(ref, resolveNamespace(ref, ns), name, options.subresource) + encodeQuery(q),
               .contentType = std::string(patchContentType(type)),
               .body = patch.dump(),
               .timeout = options_.requestTimeout});
}

absl::StatusOr<nlohmann::json> Client::apply(const ResourceRef& ref, std::string_view ns, const nlohmann::json& object,
                                             const ApplyOptions& options) {
  std::string name = objectName(object);
  if (name.empty()) return absl::InvalidArgumentError("apply: object has no metadata.name");
  if (options.fieldManager.empty()) return absl::InvalidArgumentError("apply: fieldManager is required");
  QueryParams q;
  addCommon(q, options.fieldManager, options.dryRun);
  if (options.force) q.emplace_back("force", "true");
  // YAML is a superset of JSON: the apply body may be JSON.
  return send({.method = "PATCH",
               .path = objectPath(ref, resolveNamespace(ref, ns), name, options.subresource) + encodeQuery(q),
               .contentType = "application/apply-patch+yaml",
               .body = object.dump(),
               .timeout = options_.requestTimeout});
}

absl::StatusOr<nlohmann::json> Client::remove(const ResourceRef& ref, std::string_view ns, std::string_view name,
                                              const DeleteOptions& options) {
  return send({.method = "DELETE",
               .path = objectPath(ref, resolveNamespace(ref, ns), name),
               .contentType = "application/json",
               .body = deleteOptionsBody(options).dump(),
               .timeout = options_.requestTimeout});
}

}  // namespace tandem::k8s
