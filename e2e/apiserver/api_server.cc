#include "e2e/apiserver/api_server.h"

#include <algorithm>
#include <map>
#include <random>
#include <regex>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/synchronization/mutex.h"
#include "e2e/apiserver/api_error.h"
#include "e2e/apiserver/discovery.h"
#include "e2e/apiserver/field_manager.h"
#include "e2e/apiserver/json_util.h"
#include "e2e/apiserver/patch.h"
#include "e2e/apiserver/resource_types.h"
#include "e2e/apiserver/schema.h"
#include "e2e/apiserver/selectors.h"
#include "e2e/apiserver/store.h"
#include "src/common/log.h"
#include "src/common/strings.h"
#include "src/http/server.h"

namespace tandem::apiserver {

using http::Request;
using http::Response;
using nlohmann::json;

namespace {

// A resource URL taken apart: /apis/<group>/<version>/namespaces/<ns>/<plural>/<name>/<sub>.
struct Target {
  const ResourceType* type = nullptr;
  std::string ns;
  std::string name;
  std::string sub;  // "", "status" or "scale"
};

// Per-request state that deep code adds to: the Warning headers.
struct Call {
  std::vector<std::string> warnings;
  std::string fieldValidation = "Warn";  // ?fieldValidation=Strict|Warn|Ignore
};

std::vector<std::string> splitPath(const std::string& path) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    if (j > i) out.push_back(path.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

// The media type without parameters, lowercased ("application/json").
std::string mediaType(const Request& req) {
  std::string ct = req.header("Content-Type").value_or("");
  ct = ct.substr(0, ct.find(';'));
  ct.erase(std::remove(ct.begin(), ct.end(), ' '), ct.end());
  std::transform(ct.begin(), ct.end(), ct.begin(), [](unsigned char c) { return std::tolower(c); });
  return ct;
}

// The emulator runs on real time; nothing here needs a fake clock.
MonoTime monoNow() { return std::chrono::steady_clock::now(); }

bool wantsTable(const Request& req) { return req.header("Accept").value_or("").find("as=Table") != std::string::npos; }

const std::regex kDnsSubdomain(R"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)");
const std::regex kDnsLabel(R"([a-z0-9]([-a-z0-9]*[a-z0-9])?)");

const json& meta(const json& o) {
  static const json kEmpty = json::object();
  auto it = o.find("metadata");
  return it != o.end() && it->is_object() ? *it : kEmpty;
}
std::string nameOf(const json& o) { return meta(o).value("name", ""); }
std::string nsOf(const json& o) { return meta(o).value("namespace", ""); }
std::string uidOf(const json& o) { return meta(o).value("uid", ""); }
bool deleting(const json& o) {
  return meta(o).contains("deletionTimestamp") && !meta(o)["deletionTimestamp"].is_null();
}
std::vector<std::string> finalizersOf(const json& o) {
  std::vector<std::string> out;
  for (const auto& f : meta(o).value("finalizers", json::array())) {
    if (f.is_string()) out.push_back(f.get<std::string>());
  }
  return out;
}
void setFinalizers(json& o, const std::vector<std::string>& f) {
  if (f.empty()) {
    o["metadata"].erase("finalizers");
  } else {
    o["metadata"]["finalizers"] = f;
  }
}

// An object without the parts that do not count for metadata.generation.
json specPart(json o) {
  o.erase("metadata");
  o.erase("status");
  o.erase("apiVersion");
  o.erase("kind");
  return o;
}

// One open watch. Guarded by the server's mutex (all fields).
struct WatchSession {
  ResourceType type;
  std::string ns;
  Selector labels;
  Selector fields;
  bool table = false;
  std::string includeObject;
  bool bookmarks = false;
  MonoTime deadline;
  MonoTime nextBookmark;
  std::shared_ptr<http::SseWriter> writer;
  Store::WatcherId id = 0;
  bool broken = false;

  bool matches(const json& o) const { return (ns.empty() || nsOf(o) == ns) && labels.matches(o) && fields.matches(o); }

  json view(json o) const {
    o["apiVersion"] = type.apiVersion();
    o["kind"] = type.kind;
    if (table) return tableDoc(type, {o}, meta(o).value("resourceVersion", ""), includeObject, false);
    return o;
  }

  void send(const std::string& type, const json& object) {
    if (broken || !writer) return;
    json e = {{"type", type}, {"object", object}};
    if (!writer->sendRaw(e.dump(-1, ' ', false, json::error_handler_t::replace) + "\n")) broken = true;
  }

  // A change of the store, turned into what this watch should see: objects
  // that start or stop matching the selectors arrive as ADDED / DELETED.
  void deliver(const StoreEvent& e) {
    bool now = e.type != EventType::kDeleted && matches(e.object);
    bool before = e.type == EventType::kDeleted ? matches(e.object) : (!e.oldObject.is_null() && matches(e.oldObject));
    if (e.type == EventType::kDeleted) {
      if (before) send("DELETED", view(e.object));
    } else if (now && before) {
      send("MODIFIED", view(e.object));
    } else if (now) {
      send("ADDED", view(e.object));
    } else if (before) {
      send("DELETED", view(e.object));
    }
  }

  void bookmark(uint64_t rv, bool initialEventsEnd) {
    json m = {{"resourceVersion", std::to_string(rv)}};
    if (initialEventsEnd) m["annotations"] = {{"k8s.io/initial-events-end", "true"}};
    send("BOOKMARK", {{"kind", type.kind}, {"apiVersion", type.apiVersion()}, {"metadata", m}});
  }
};

}  // namespace

class ApiServer::Impl {
 public:
  explicit Impl(ApiServerOptions options)
      : options_(std::move(options)),
        store_(options_.watchHistory),
        faults_(options_.faults),
        rng_(std::random_device{}()) {}

  absl::Status start();
  void shutdown();
  int port() const { return http_->port(); }
  std::string baseUrl() const { return http_->baseUrl(); }

 private:
  Response serve(Request& req);
  Response route(Request& req, Call& call);
  Response control(Request& req);
  Response discovery(Request& req, const std::string& group, const std::string& version);
  Response openapi(Request& req);
  Response resource(Request& req, const Target& target, Call& call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Target parseTarget(const std::vector<std::string>& segs, size_t start, const std::string& group,
                     const std::string& version) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Reads.
  Response list(Request& req, const Target& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Response watch(Request& req, const Target& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void openWatch(const std::shared_ptr<WatchSession>& s, std::shared_ptr<http::SseWriter> writer, std::string rv,
                 bool sendInitial);
  json view(const ResourceType& t, json o) const;

  // Writes.
  json parseBody(const Request& req, const ResourceType& t) const;
  void checkKind(const ResourceType& t, const json& obj, bool scale = false) const;
  json create(const ResourceType& t, const std::string& ns, json obj, Call& call, const std::string& manager)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  json update(const ResourceType& t, const json& current, json updated, const std::string& sub, bool requireRv,
              Call& call, const std::string& manager) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Response patch(Request& req, const Target& t, Call& call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Response apply(Request& req, const Target& t, const json* current, Call& call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Response remove(Request& req, const Target& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts deleting `obj` with a propagation policy; true when it is gone
  // (no finalizers), false when it waits for finalizers.
  bool removeObject(const ResourceType& t, const json& obj, const std::string& policy)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void eraseObject(const std::string& storageKey, const json& obj) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void validateObject(const ResourceType& t, json& obj, const std::string& fieldValidation, Call& call)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void typeDefaults(const ResourceType& t, json& obj, const json* current) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void afterWrite(const ResourceType& t, const json& stored) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void collectGarbage() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  json scaleOf(const ResourceType& t, const json& obj) const;

  std::vector<const ResourceType*> types() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const ResourceType* typeFor(const std::string& storageKey) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const ResourceType& builtinType(const std::string& plural) const;

  void pumpLoop();

  const ApiServerOptions options_;
  const Logger log_{"apiserver"};
  std::vector<ResourceType> builtins_ = builtinResourceTypes();
  std::unique_ptr<http::Server> http_;
  std::thread pump_;

  mutable absl::Mutex mu_;
  Store store_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<ResourceType>> crdTypes_ ABSL_GUARDED_BY(mu_);  // CRD name -> served versions
  FieldManager fieldManager_ ABSL_GUARDED_BY(mu_);
  std::map<Store::WatcherId, std::shared_ptr<WatchSession>> watches_ ABSL_GUARDED_BY(mu_);
  FaultOptions faults_ ABSL_GUARDED_BY(mu_);
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool inGc_ ABSL_GUARDED_BY(mu_) = false;
};

// ---------------------------------------------------------------------------
// Lifecycle

absl::Status ApiServer::Impl::start() {
  {
    absl::MutexLock lock(&mu_);
    Call call;
    for (const char* ns : {"default", "kube-system", "kube-public", "kube-node-lease"}) {
      create(builtinType("namespaces"), "", {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}},
             call, "tandem-apiserver");
    }
  }
  http::Routes routes;
  for (const char* method : {"GET", "POST", "PUT", "PATCH", "DELETE"}) {
    routes.handlePrefix(method, "/", [this](Request& req) { return serve(req); });
  }
  // Watches are newline-delimited JSON on the SSE stream machinery: no
  // keepalive comments. Long requests are only watches.
  auto server = http::Server::start({.host = options_.host,
                                     .port = options_.port,
                                     .maxBodyBytes = 8 << 20,
                                     .requestTimeout = std::chrono::seconds(60),
                                     .sseKeepalive = Duration::zero(),
                                     .requireUtf8Body = false,
                                     .tlsCertFile = options_.tlsCertFile,
                                     .tlsKeyFile = options_.tlsKeyFile,
                                     .tlsClientCaFile = options_.tlsClientCaFile},
                                    std::move(routes));
  if (!server.ok()) return server.status();
  http_ = std::move(*server);
  pump_ = std::thread([this] { pumpLoop(); });
  return absl::OkStatus();
}

void ApiServer::Impl::shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    for (auto& [id, s] : watches_) {
      store_.removeWatcher(id);
      if (s->writer) s->writer->close();
    }
    watches_.clear();
  }
  if (pump_.joinable()) pump_.join();
  if (http_) http_->shutdown(std::chrono::seconds(1));
}

// Ends watches past their deadline or whose client left, and sends bookmarks.
void ApiServer::Impl::pumpLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(50));
    MonoTime t = monoNow();
    for (auto it = watches_.begin(); it != watches_.end();) {
      auto& s = it->second;
      if (s->broken || t >= s->deadline || s->writer->cancelled()) {
        store_.removeWatcher(it->first);
        s->writer->close();
        it = watches_.erase(it);
        continue;
      }
      if (s->bookmarks && t >= s->nextBookmark) {
        s->bookmark(store_.currentRv(), false);
        s->nextBookmark = t + options_.bookmarkInterval;
      }
      ++it;
    }
  }
}

// ---------------------------------------------------------------------------
// Routing

Response ApiServer::Impl::serve(Request& req) {
  Call call;
  Response r;
  try {
    r = route(req, call);
  } catch (const ApiError& e) {
    r = Response::json(e.code(), e.toStatus());
  } catch (const json::exception& e) {
    r = Response::json(400, badRequest(e.what()).toStatus());
  }
  for (const auto& w : call.warnings) r.setHeader("Warning", strCat("299 - \"", w, "\""));
  return r;
}

Response ApiServer::Impl::route(Request& req, Call& call) {
  const std::string& path = req.path();
  auto segs = splitPath(path);
  const bool get = req.method() == "GET";
  if (path == "/version" && get) {
    return Response::json(200, {{"major", "1"},
                                {"minor", "32"},
                                {"gitVersion", "v1.32.0-tandem"},
                                {"gitCommit", "0000000000000000000000000000000000000000"},
                                {"gitTreeState", "clean"},
                                {"buildDate", "2024-01-01T00:00:00Z"},
                                {"goVersion", "go1.23"},
                                {"compiler", "gc"},
                                {"platform", "linux/amd64"}});
  }
  if ((path == "/healthz" || path == "/readyz" || path == "/livez") && get) return Response::text(200, "ok");
  if (!segs.empty() && segs[0] == "tandem") return control(req);
  if (!segs.empty() && segs[0] == "openapi") return openapi(req);
  if (segs.empty() || (segs[0] != "api" && segs[0] != "apis")) throw pathNotFound();

  // Discovery documents.
  bool core = segs[0] == "api";
  size_t rest = core ? 2 : 3;
  if (segs.size() < rest) {
    if (!get) throw methodNotAllowed();
    return discovery(req, core ? "" : (segs.size() > 1 ? segs[1] : ""), core && segs.size() > 1 ? segs[1] : "");
  }
  std::string group = core ? "" : segs[1];
  std::string version = core ? segs[1] : segs[2];
  if (segs.size() == rest) {
    if (!get) throw methodNotAllowed();
    return discovery(req, group, version);
  }

  // Resources.
  Response slow;
  Duration delay = Duration::zero();
  absl::MutexLock lock(&mu_);
  Target target = parseTarget(segs, rest, group, version);
  std::uniform_real_distribution<double> coin(0, 1);
  if (faults_.errorRate > 0 && coin(rng_) < faults_.errorRate) throw internalError("injected fault (tandem-apiserver)");
  if ((req.method() == "PUT" || req.method() == "PATCH") && faults_.conflictRate > 0 &&
      coin(rng_) < faults_.conflictRate) {
    throw staleConflict(target.type->plural, target.type->group, target.name);
  }
  bool isWatch = req.query("watch").value_or("") == "true" || req.query("watch").value_or("") == "1";
  if (!isWatch && faults_.slowRate > 0 && coin(rng_) < faults_.slowRate) delay = faults_.slowDelay;
  Response r = resource(req, target, call);
  if (delay <= Duration::zero()) return r;
  return Response::deferred([r, delay](std::shared_ptr<http::Responder> responder) {
    std::thread([r, delay, responder] {
      std::this_thread::sleep_for(delay);
      responder->respond(r);
    }).detach();
  });
}

Target ApiServer::Impl::parseTarget(const std::vector<std::string>& segs, size_t start, const std::string& group,
                                    const std::string& version) {
  std::vector<std::string> rest(segs.begin() + static_cast<long>(start), segs.end());
  auto find = [&](const std::string& plural) -> const ResourceType* {
    for (const auto* t : types()) {
      if (t->group == group && t->version == version && t->plural == plural) return t;
    }
    return nullptr;
  };
  Target target;
  if (rest.size() >= 3 && rest[0] == "namespaces") {
    const ResourceType* t = find(rest[2]);
    if (t != nullptr && t->namespaced) {
      target.type = t;
      target.ns = rest[1];
      rest.erase(rest.begin(), rest.begin() + 2);
    }
  }
  if (target.type == nullptr) target.type = find(rest[0]);
  if (target.type == nullptr || rest.size() > 3) throw pathNotFound();
  if (rest.size() >= 2) target.name = rest[1];
  if (rest.size() == 3) {
    target.sub = rest[2];
    if (!(target.sub == "status" && target.type->hasStatus) && !(target.sub == "scale" && target.type->scale)) {
      throw pathNotFound();
    }
  }
  if (!target.type->namespaced && !target.ns.empty()) throw pathNotFound();
  if (target.type->namespaced && target.ns.empty() && !target.name.empty()) throw pathNotFound();
  return target;
}

Response ApiServer::Impl::control(Request& req) {
  absl::MutexLock lock(&mu_);
  auto toJson = [](const FaultOptions& f) {
    return json{{"conflictRate", f.conflictRate},
                {"errorRate", f.errorRate},
                {"slowRate", f.slowRate},
                {"slowDelayMs", std::chrono::duration_cast<std::chrono::milliseconds>(f.slowDelay).count()},
                {"watchDropAfterMs", std::chrono::duration_cast<std::chrono::milliseconds>(f.watchDropAfter).count()}};
  };
  if (req.path() == "/tandem/faults" && req.method() == "GET") return Response::json(200, toJson(faults_));
  if (req.path() == "/tandem/faults" && req.method() == "PUT") {
    json b = json::parse(req.body());
    FaultOptions f;
    f.conflictRate = b.value("conflictRate", 0.0);
    f.errorRate = b.value("errorRate", 0.0);
    f.slowRate = b.value("slowRate", 0.0);
    f.slowDelay = std::chrono::milliseconds(b.value("slowDelayMs", 0));
    f.watchDropAfter = std::chrono::milliseconds(b.value("watchDropAfterMs", 0));
    faults_ = f;
    MonoTime t = monoNow();
    if (f.watchDropAfter > Duration::zero()) {
      for (auto& [id, s] : watches_) s->deadline = std::min(s->deadline, t + f.watchDropAfter);
    }
    return Response::json(200, toJson(faults_));
  }
  if (req.path() == "/tandem/compact" && req.method() == "POST") {
    store_.compact();
    return Response::json(200, {{"compactedResourceVersion", std::to_string(store_.compactedRv())}});
  }
  throw pathNotFound();
}

Response ApiServer::Impl::discovery(Request& req, const std::string& group, const std::string& version) {
  absl::MutexLock lock(&mu_);
  auto all = types();
  json doc;
  if (req.path() == "/api") {
    doc = apiVersionsDoc(strCat(options_.host, ":", http_ ? http_->port() : 0));
  } else if (req.path() == "/apis") {
    doc = apiGroupListDoc(all);
  } else if (version.empty()) {
    doc = apiGroupDoc(all, group);
  } else {
    doc = apiResourceListDoc(all, group, version);
  }
  if (doc.is_null()) throw pathNotFound();
  return Response::json(200, doc);
}

Response ApiServer::Impl::openapi(Request& req) {
  absl::MutexLock lock(&mu_);
  if (req.method() != "GET") throw methodNotAllowed();
  if (req.path() == "/openapi/v3") return Response::json(200, openapiV3Index(types()));
  const std::string prefix = "/openapi/v3/";
  if (req.path().starts_with(prefix)) {
    json doc = openapiV3Doc(types(), req.path().substr(prefix.size()));
    if (!doc.is_null()) return Response::json(200, doc);
  }
  throw pathNotFound();
}

std::vector<const ResourceType*> ApiServer::Impl::types() const {
  std::vector<const ResourceType*> out;
  for (const auto& t : builtins_) out.push_back(&t);
  for (const auto& [name, ts] : crdTypes_) {
    for (const auto& t : ts) out.push_back(&t);
  }
  return out;
}

const ResourceType* ApiServer::Impl::typeFor(const std::string& storageKey) const {
  for (const auto* t : types()) {
    if (t->storageKey() == storageKey) return t;
  }
  return nullptr;
}

const ResourceType& ApiServer::Impl::builtinType(const std::string& plural) const {
  for (const auto& t : builtins_) {
    if (t.plural == plural && t.group.empty()) return t;
  }
  for (const auto& t : builtins_) {
    if (t.plural == plural) return t;
  }
  std::abort();  // a typo in this file
}

Response ApiServer::Impl::resource(Request& req, const Target& t, Call& call) {
  const std::string& m = req.method();
  const std::string manager = req.query("fieldManager").value_or("unknown");
  call.fieldValidation = req.query("fieldValidation").value_or("Warn");
  if (t.name.empty()) {
    if (m == "GET") {
      std::string w = req.query("watch").value_or("");
      return (w == "true" || w == "1") ? watch(req, t) : list(req, t);
    }
    if (m == "POST") {
      json obj = parseBody(req, *t.type);
      return Response::json(201, create(*t.type, t.ns, std::move(obj), call, manager));
    }
    if (m == "DELETE") {
      Selector labels = Selector::parseLabels(req.query("labelSelector").value_or(""));
      Selector fields = Selector::parseFields(req.query("fieldSelector").value_or(""), t.type->custom);
      json items = json::array();
      std::vector<json> victims;
      for (const json* o : store_.list(t.type->storageKey(), t.ns)) {
        if (labels.matches(*o) && fields.matches(*o)) victims.push_back(*o);
      }
      for (const auto& o : victims) {
        removeObject(*t.type, o, "Background");
        items.push_back(view(*t.type, o));
      }
      collectGarbage();
      return Response::json(200, {{"kind", t.type->listKind},
                                  {"apiVersion", t.type->apiVersion()},
                                  {"metadata", {{"resourceVersion", std::to_string(store_.currentRv())}}},
                                  {"items", items}});
    }
    throw methodNotAllowed();
  }
  const json* current = store_.get(t.type->storageKey(), t.ns, t.name);
  if (m == "GET") {
    if (current == nullptr) throw notFound(t.type->plural, t.type->group, t.name);
    if (t.sub == "scale") return Response::json(200, scaleOf(*t.type, *current));
    json v = view(*t.type, *current);
    if (wantsTable(req) && t.sub.empty()) {
      return Response::json(200, tableDoc(*t.type, {v}, meta(v).value("resourceVersion", ""),
                                          req.query("includeObject").value_or(""), true));
    }
    return Response::json(200, v);
  }
  if (m == "PUT") {
    if (current == nullptr) throw notFound(t.type->plural, t.type->group, t.name);
    json body = parseBody(req, *t.type);
    if (t.sub == "scale") {
      checkKind(*t.type, body, true);
      json obj = *current;
      const json& replicas = body.value("spec", json::object()).value("replicas", json(0));
      if (!replicas.is_number_integer() || replicas.get<int64_t>() < 0) {
        throw invalid("Scale", "autoscaling", t.name,
                      {fieldInvalid("spec.replicas", replicas, "must be greater than or equal to 0")});
      }
      setJsonPath(obj, t.type->scale->specReplicasPath, replicas);
      std::string rv = meta(body).value("resourceVersion", "");
      if (!rv.empty()) obj["metadata"]["resourceVersion"] = rv;
      json stored = update(*t.type, *current, obj, "", false, call, manager);
      return Response::json(200, scaleOf(*t.type, stored));
    }
    return Response::json(200, update(*t.type, *current, std::move(body), t.sub, t.type->custom, call, manager));
  }
  if (m == "PATCH") return patch(req, t, call);
  if (m == "DELETE") {
    if (!t.sub.empty()) throw methodNotAllowed();
    return remove(req, t);
  }
  throw methodNotAllowed();
}

// ---------------------------------------------------------------------------
// Reads

json ApiServer::Impl::view(const ResourceType& t, json o) const {
  o["apiVersion"] = t.apiVersion();
  o["kind"] = t.kind;
  return o;
}

Response ApiServer::Impl::list(Request& req, const Target& t) {
  Selector labels = Selector::parseLabels(req.query("labelSelector").value_or(""));
  Selector fields = Selector::parseFields(req.query("fieldSelector").value_or(""), t.type->custom);
  std::vector<json> items;
  for (const json* o : store_.list(t.type->storageKey(), t.ns)) {
    if (labels.matches(*o) && fields.matches(*o)) items.push_back(view(*t.type, *o));
  }
  std::string rv = std::to_string(store_.currentRv());
  if (wantsTable(req)) {
    return Response::json(200, tableDoc(*t.type, items, rv, req.query("includeObject").value_or(""), true));
  }
  return Response::json(200, {{"kind", t.type->listKind},
                              {"apiVersion", t.type->apiVersion()},
                              {"metadata", {{"resourceVersion", rv}}},
                              {"items", items}});
}

Response ApiServer::Impl::watch(Request& req, const Target& t) {
  auto s = std::make_shared<WatchSession>();
  s->type = *t.type;
  s->ns = t.ns;
  s->labels = Selector::parseLabels(req.query("labelSelector").value_or(""));
  s->fields = Selector::parseFields(req.query("fieldSelector").value_or(""), t.type->custom);
  s->table = wantsTable(req);
  s->includeObject = req.query("includeObject").value_or("");
  s->bookmarks = req.query("allowWatchBookmarks").value_or("") == "true";
  Duration limit = options_.maxWatch;
  if (auto ts = req.query("timeoutSeconds")) {
    try {
      limit = std::min(limit, Duration(std::chrono::seconds(std::stoll(*ts))));
    } catch (...) {
      throw badRequest(strCat("invalid value for timeoutSeconds: ", *ts));
    }
  }
  if (faults_.watchDropAfter > Duration::zero()) limit = std::min(limit, faults_.watchDropAfter);
  s->deadline = monoNow() + limit;
  s->nextBookmark = monoNow() + options_.bookmarkInterval;
  std::string rv = req.query("resourceVersion").value_or("");
  bool sendInitial = req.query("sendInitialEvents").value_or("") == "true";
  if (sendInitial && (req.query("resourceVersionMatch").value_or("") != "NotOlderThan" || !s->bookmarks)) {
    throw invalid(
        "ListOptions", "meta.k8s.io", "",
        {fieldForbidden("sendInitialEvents",
                        "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled "
                        "and resourceVersionMatch is NotOlderThan and allowWatchBookmarks is true")});
  }
  if (!rv.empty() && rv != "0" && rv.find_first_not_of("0123456789") != std::string::npos) {
    throw badRequest(strCat("invalid resource version: ", rv));
  }
  Response r = Response::sse([this, s, rv, sendInitial](std::shared_ptr<http::SseWriter> writer) {
    openWatch(s, std::move(writer), rv, sendInitial);
  });
  r.setHeader("Content-Type", "application/json");
  r.setHeader("Cache-Control", "no-cache, private");
  return r;
}

void ApiServer::Impl::openWatch(const std::shared_ptr<WatchSession>& s, std::shared_ptr<http::SseWriter> writer,
                                std::string rv, bool sendInitial) {
  absl::MutexLock lock(&mu_);
  s->writer = std::move(writer);
  if (stopping_) {
    s->writer->close();
    return;
  }
  const std::string key = s->type.storageKey();
  if (rv.empty() || rv == "0" || sendInitial) {
    for (const json* o : store_.list(key, s->ns)) {
      if (s->matches(*o)) s->send("ADDED", s->view(*o));
    }
    if (sendInitial) s->bookmark(store_.currentRv(), true);
  } else {
    uint64_t from = std::stoull(rv);
    auto events = store_.eventsAfter(key, from);
    if (!events) {
      ApiError e = expired(strCat("too old resource version: ", rv, " (", store_.compactedRv() + 1, ")"));
      s->send("ERROR", e.toStatus());
      s->writer->close();
      return;
    }
    for (const StoreEvent* e : *events) s->deliver(*e);
  }
  WatchSession* raw = s.get();
  s->id = store_.addWatcher(key, [raw](const StoreEvent& e) { raw->deliver(e); });
  watches_[s->id] = s;
}

json ApiServer::Impl::scaleOf(const ResourceType& t, const json& obj) const {
  const ScalePaths& p = *t.scale;
  auto spec = evalJsonPath(obj, p.specReplicasPath);
  auto status = evalJsonPath(obj, p.statusReplicasPath);
  json scale = {{"kind", "Scale"},
                {"apiVersion", "autoscaling/v1"},
                {"metadata",
                 {{"name", nameOf(obj)},
                  {"uid", uidOf(obj)},
                  {"resourceVersion", meta(obj).value("resourceVersion", "")},
                  {"creationTimestamp", meta(obj).value("creationTimestamp", "")}}},
                {"spec", {{"replicas", spec && spec->is_number() ? *spec : json(0)}}},
                {"status", {{"replicas", status && status->is_number() ? *status : json(0)}}}};
  if (t.namespaced) scale["metadata"]["namespace"] = nsOf(obj);
  if (!p.labelSelectorPath.empty()) {
    auto sel = evalJsonPath(obj, p.labelSelectorPath);
    if (sel) scale["status"]["selector"] = formatLabelSelector(*sel);
  }
  return scale;
}

// ---------------------------------------------------------------------------
// Writes

json ApiServer::Impl::parseBody(const Request& req, const ResourceType& t) const {
  std::string type = mediaType(req);
  try {
    if (type.empty() || type == "application/json") return json::parse(req.body());
    if (type == "application/yaml") return yamlToJson(req.body());
  } catch (const std::exception& e) {
    throw badRequest(strCat("the object provided is unrecognized (must be of type ", t.kind,
                            "): couldn't get version/kind; json parse error: ", e.what()));
  }
  throw unsupportedMediaType(
      strCat("the body of the request was in an unknown format - accepted media types include: "
             "application/json, application/yaml"));
}

void ApiServer::Impl::checkKind(const ResourceType& t, const json& obj, bool scale) const {
  if (!obj.is_object()) {
    throw badRequest(strCat("the object provided is unrecognized (must be of type ", t.kind, "): ", obj.dump()));
  }
  std::string want = scale ? "autoscaling/v1" : t.apiVersion();
  std::string kind = scale ? "Scale" : t.kind;
  std::string haveKind = obj.value("kind", "");
  std::string haveVersion = obj.value("apiVersion", "");
  if (haveKind.empty()) throw badRequest(strCat("Object 'Kind' is missing in '", obj.dump(), "'"));
  if (haveVersion.empty()) throw badRequest(strCat("Object 'apiVersion' is missing in '", obj.dump(), "'"));
  if (haveVersion != want) {
    throw badRequest(
        strCat("the API version in the data (", haveVersion, ") does not match the expected API version (", want, ")"));
  }
  if (haveKind != kind) {
    throw badRequest(strCat("the kind in the data (", haveKind, ") does not match the expected kind (", kind, ")"));
  }
  if (obj.contains("metadata") && !obj["metadata"].is_object()) {
    throw badRequest(
        strCat(kind, " in version \"", t.version, "\" cannot be handled as a ", kind, ": metadata must be an object"));
  }
}

void ApiServer::Impl::validateObject(const ResourceType& t, json& obj, const std::string& fieldValidation, Call& call) {
  std::vector<StatusCause> causes;
  const std::string name = nameOf(obj);
  bool label = t.plural == "namespaces" || t.plural == "services";
  if (name.size() > (label ? 63u : 253u) || !std::regex_match(name, label ? kDnsLabel : kDnsSubdomain)) {
    causes.push_back(fieldInvalid(
        "metadata.name", name,
        label ? "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start "
                "and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
                "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
              : "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and "
                "must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
                "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"));
  }
  for (const char* field : {"labels", "annotations"}) {
    if (!meta(obj).contains(field)) continue;
    const json& m = obj["metadata"][field];
    if (!m.is_object()) {
      causes.push_back(fieldTypeInvalid(strCat("metadata.", field), m, "must be a map of strings"));
      continue;
    }
    for (const auto& [k, v] : m.items()) {
      if (!v.is_string()) causes.push_back(fieldTypeInvalid(strCat("metadata.", field, ".", k), v, "must be a string"));
    }
  }
  if (t.schema) {
    std::vector<std::string> unknown = pruneUnknownFields(*t.schema, obj);
    if (!unknown.empty()) {
      if (fieldValidation == "Strict") {
        // 422 Invalid with a cause per unknown field, as K8S_API_NOTES.md
        // records kubectl expecting under fieldValidation=Strict.
        for (const auto& u : unknown) causes.push_back(StatusCause{"FieldValueInvalid", strCat("unknown field \"", u, "\""), u});
      } else if (fieldValidation != "Ignore") {
        for (const auto& u : unknown) call.warnings.push_back(strCat("unknown field \\\"", u, "\\\""));
      }
    }
    applyDefaults(*t.schema, obj);
    auto schemaErrors = validateSchema(*t.schema, obj);
    causes.insert(causes.end(), schemaErrors.begin(), schemaErrors.end());
  }
  if (t.plural == "customresourcedefinitions") {
    try {
      typesFromCrd(obj);
    } catch (const ApiError& e) {
      if (causes.empty()) throw;
    }
  }
  if (!causes.empty()) throw invalid(t.kind, t.group, name, causes);
}

void ApiServer::Impl::typeDefaults(const ResourceType& t, json& obj, const json* current) {
  if (t.plural == "namespaces" && t.group.empty()) {
    obj["spec"]["finalizers"] = json::array({"kubernetes"});
    if (current == nullptr) obj["status"] = {{"phase", "Active"}};
  } else if (t.plural == "deployments") {
    if (!obj["spec"].contains("replicas")) obj["spec"]["replicas"] = 1;
  } else if (t.plural == "secrets" && t.group.empty()) {
    if (obj.contains("stringData") && obj["stringData"].is_object()) {
      for (const auto& [k, v] : obj["stringData"].items()) {
        obj["data"][k] = base64Encode(v.is_string() ? v.get<std::string>() : v.dump());
      }
      obj.erase("stringData");
    }
    if (!obj.contains("type")) obj["type"] = "Opaque";
  } else if (t.plural == "services" && t.group.empty()) {
    if (!obj["spec"].contains("type")) obj["spec"]["type"] = "ClusterIP";
    if (!obj["spec"].contains("clusterIP")) {
      obj["spec"]["clusterIP"] =
          current != nullptr ? (*current)["spec"].value("clusterIP", "None")
                             : strCat("10.96.", (store_.currentRv() / 250) % 250, ".", store_.currentRv() % 250 + 1);
    }
  } else if (t.plural == "customresourcedefinitions") {
    json names = obj["spec"].value("names", json::object());
    if (!names.contains("singular") && names.contains("kind")) {
      std::string s = names["kind"];
      for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      names["singular"] = s;
    }
    if (!names.contains("listKind") && names.contains("kind"))
      names["listKind"] = names["kind"].get<std::string>() + "List";
    obj["spec"]["names"] = names;
    std::string ts = nowRfc3339();
    json stored = json::array();
    for (const auto& v : obj["spec"].value("versions", json::array())) {
      if (v.value("storage", false)) stored.push_back(v.value("name", ""));
    }
    obj["status"] = {{"acceptedNames", names},
                     {"storedVersions", stored},
                     {"conditions",
                      {{{"type", "NamesAccepted"},
                        {"status", "True"},
                        {"reason", "NoConflicts"},
                        {"message", "no conflicts found"},
                        {"lastTransitionTime", ts}},
                       {{"type", "Established"},
                        {"status", "True"},
                        {"reason", "InitialNamesAccepted"},
                        {"message", "the initial names have been accepted"},
                        {"lastTransitionTime", ts}}}}};
    if (current != nullptr && (*current).contains("status")) {
      obj["status"]["conditions"] = (*current)["status"]["conditions"];
    }
  }
}

json ApiServer::Impl::create(const ResourceType& t, const std::string& ns, json obj, Call& call,
                             const std::string& manager) {
  checkKind(t, obj);
  if (!obj.contains("metadata")) obj["metadata"] = json::object();
  json& md = obj["metadata"];
  if (t.namespaced) {
    std::string have = md.value("namespace", "");
    if (!have.empty() && have != ns) {
      throw badRequest("the namespace of the provided object does not match the namespace sent on the request");
    }
    md["namespace"] = ns;
  } else {
    md.erase("namespace");
  }
  if (md.value("name", "").empty() && !md.value("generateName", "").empty()) {
    md["name"] = md["generateName"].get<std::string>() + randomSuffix(5);
  }
  std::string name = md.value("name", "");
  if (name.empty()) {
    throw invalid(t.kind, t.group, "", {fieldRequired("metadata.name", "name or generateName is required")});
  }
  if (!md.value("resourceVersion", "").empty()) {
    throw badRequest("resourceVersion should not be set on objects to be created");
  }
  if (t.namespaced) {
    const json* nsObj = store_.get("/namespaces", "", ns);
    if (nsObj == nullptr) throw notFound("namespaces", "", ns);
    if (deleting(*nsObj)) {
      ApiError e = forbidden(strCat(t.plural, (t.group.empty() ? "" : "." + t.group), " \"", name,
                                    "\" is forbidden: unable to create new content in namespace ", ns,
                                    " because it is being terminated"));
      e.details = {{"name", name},
                   {"kind", t.plural},
                   {"causes", json::array({{{"reason", "NamespaceTerminating"},
                                            {"message", strCat("namespace ", ns, " is being terminated")},
                                            {"field", "metadata.namespace"}}})}};
      if (!t.group.empty()) e.details["group"] = t.group;
      throw e;
    }
  }
  if (store_.get(t.storageKey(), ns, name) != nullptr) throw alreadyExists(t.plural, t.group, name);
  md["uid"] = newUid();
  md["creationTimestamp"] = nowRfc3339();
  md.erase("deletionTimestamp");
  md.erase("deletionGracePeriodSeconds");
  md.erase("managedFields");
  md.erase("selfLink");
  if (t.hasGeneration) md["generation"] = 1;
  if (t.hasStatus) obj.erase("status");
  if (!obj.contains("spec") && (t.plural == "deployments" || t.plural == "services" || t.plural == "namespaces")) {
    obj["spec"] = json::object();
  }
  typeDefaults(t, obj, nullptr);
  validateObject(t, obj, call.fieldValidation, call);
  json stored = store_.put(t.storageKey(), obj);
  fieldManager_.recordUpdate(uidOf(stored), nullptr, stored, manager);
  afterWrite(t, stored);
  collectGarbage();
  return view(t, stored);
}

json ApiServer::Impl::update(const ResourceType& t, const json& current, json updated, const std::string& sub,
                             bool requireRv, Call& call, const std::string& manager) {
  checkKind(t, updated);
  if (!updated.contains("metadata")) updated["metadata"] = json::object();
  json& md = updated["metadata"];
  const std::string name = nameOf(current);
  std::string haveName = md.value("name", "");
  if (!haveName.empty() && haveName != name) {
    throw badRequest(strCat("the name of the object (", haveName, ") does not match the name on the URL (", name, ")"));
  }
  if (t.namespaced && !md.value("namespace", "").empty() && md["namespace"] != nsOf(current)) {
    throw badRequest("the namespace of the provided object does not match the namespace sent on the request");
  }
  std::string rv = md.value("resourceVersion", "");
  if (rv.empty() && requireRv) {
    throw invalid(t.kind, t.group, name,
                  {fieldInvalid("metadata.resourceVersion", "0x0", "must be specified for an update")});
  }
  if (!rv.empty() && rv != meta(current).value("resourceVersion", "")) throw staleConflict(t.plural, t.group, name);

  // What the caller may not change.
  for (const char* k : {"name", "namespace", "uid", "creationTimestamp", "deletionTimestamp",
                        "deletionGracePeriodSeconds", "generation", "resourceVersion"}) {
    if (meta(current).contains(k)) {
      md[k] = current["metadata"][k];
    } else {
      md.erase(k);
    }
  }
  md.erase("managedFields");
  // `md` is not used below: `updated` may be replaced.
  if (sub == "status") {
    json result = current;
    if (updated.contains("status")) {
      result["status"] = updated["status"];
    } else {
      result.erase("status");
    }
    updated = std::move(result);
  } else if (t.hasStatus) {
    if (current.contains("status")) {
      updated["status"] = current["status"];
    } else {
      updated.erase("status");
    }
  }
  updated["apiVersion"] = current.value("apiVersion", t.apiVersion());
  updated["kind"] = t.kind;
  typeDefaults(t, updated, &current);
  // Updates of status only validate too (the schema covers status).
  validateObject(t, updated, call.fieldValidation, call);
  if (deleting(current)) {
    auto before = finalizersOf(current);
    for (const auto& f : finalizersOf(updated)) {
      if (std::find(before.begin(), before.end(), f) == before.end()) {
        throw invalid(
            t.kind, t.group, name,
            {fieldForbidden("metadata.finalizers", "no new finalizers can be added if the object is being deleted")});
      }
    }
  }
  if (t.hasGeneration && specPart(updated) != specPart(current)) {
    updated["metadata"]["generation"] = meta(current).value("generation", 0) + 1;
  }
  json currentNormal = current;
  currentNormal["apiVersion"] = updated["apiVersion"];
  if (updated == currentNormal) return view(t, current);  // a no-op write keeps the resourceVersion

  json stored = store_.put(t.storageKey(), updated);
  fieldManager_.recordUpdate(uidOf(stored), current, stored, manager);
  afterWrite(t, stored);
  if (deleting(stored) && finalizersOf(stored).empty() && t.plural != "namespaces") {
    eraseObject(t.storageKey(), stored);
  }
  collectGarbage();
  return view(t, stored);
}

Response ApiServer::Impl::patch(Request& req, const Target& t, Call& call) {
  const std::string type = mediaType(req);
  const std::string manager = req.query("fieldManager").value_or("unknown");
  const json* current = store_.get(t.type->storageKey(), t.ns, t.name);
  if (type == "application/apply-patch+yaml") return apply(req, t, current, call);
  bool smp = type == "application/strategic-merge-patch+json";
  if (type != "application/merge-patch+json" && type != "application/json-patch+json" && !(smp && !t.type->custom)) {
    throw unsupportedMediaType(
        strCat("the body of the request was in an unknown format - accepted media types include: ",
               t.type->custom ? "" : "application/strategic-merge-patch+json, ",
               "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"));
  }
  if (current == nullptr) throw notFound(t.type->plural, t.type->group, t.name);
  json body;
  try {
    body = json::parse(req.body());
  } catch (const json::parse_error& e) {
    throw badRequest(strCat("error decoding patch: ", e.what()));
  }
  json base = t.sub == "scale" ? scaleOf(*t.type, *current) : view(*t.type, *current);
  json patched = type == "application/json-patch+json" ? applyJsonPatch(base, body)
                 : smp                                 ? applyStrategicMergePatch(base, body)
                                                       : applyMergePatch(base, body);
  if (t.sub == "scale") {
    checkKind(*t.type, patched, true);
    json obj = *current;
    json replicas = patched.value("spec", json::object()).value("replicas", json(0));
    if (!replicas.is_number_integer() || replicas.get<int64_t>() < 0) {
      throw invalid("Scale", "autoscaling", t.name,
                    {fieldInvalid("spec.replicas", replicas, "must be greater than or equal to 0")});
    }
    setJsonPath(obj, t.type->scale->specReplicasPath, replicas);
    obj["metadata"]["resourceVersion"] = meta(patched).value("resourceVersion", "");
    json stored = update(*t.type, *current, view(*t.type, obj), "", false, call, manager);
    return Response::json(200, scaleOf(*t.type, stored));
  }
  return Response::json(200, update(*t.type, *current, std::move(patched), t.sub, false, call, manager));
}

Response ApiServer::Impl::apply(Request& req, const Target& t, const json* current, Call& call) {
  if (t.sub == "scale") throw unsupportedMediaType("apply is not supported on the scale subresource");
  std::string manager = req.query("fieldManager").value_or("");
  if (manager.empty()) {
    throw invalid("PatchOptions", "meta.k8s.io", "", {fieldRequired("fieldManager", "is required for apply patch")});
  }
  bool force = req.query("force").value_or("") == "true";
  json applied;
  try {
    applied = yamlToJson(req.body());
  } catch (const std::exception& e) {
    throw badRequest(strCat("error decoding YAML: ", e.what()));
  }
  checkKind(*t.type, applied);
  std::string name = meta(applied).value("name", "");
  if (name.empty()) {
    throw invalid(t.type->kind, t.type->group, t.name, {fieldRequired("metadata.name", "name is required")});
  }
  if (name != t.name) {
    throw badRequest(strCat("the name of the object (", name, ") does not match the name on the URL (", t.name, ")"));
  }
  applied["metadata"].erase("managedFields");
  if (current == nullptr) {
    if (!t.sub.empty()) throw notFound(t.type->plural, t.type->group, t.name);
    json created = create(*t.type, t.ns, applied, call, manager);
    fieldManager_.forget(uidOf(created));
    auto result = fieldManager_.apply(uidOf(created), created, applied, manager, true, t.type->plural, t.type->group);
    fieldManager_.commitApply(uidOf(created), manager, result.fields);
    return Response::json(201, created);
  }
  json base = view(*t.type, *current);
  auto result = fieldManager_.apply(uidOf(*current), base, applied, manager, force, t.type->plural, t.type->group);
  std::string uid = uidOf(*current);
  json stored = update(*t.type, *current, result.object, t.sub, false, call, manager);
  fieldManager_.commitApply(uid, manager, result.fields);
  return Response::json(200, stored);
}

Response ApiServer::Impl::remove(Request& req, const Target& t) {
  json options = json::object();
  if (!req.body().empty()) {
    try {
      options = json::parse(req.body());
    } catch (const json::parse_error& e) {
      throw badRequest(strCat("error decoding DeleteOptions: ", e.what()));
    }
  }
  std::string policy = options.value("propagationPolicy", req.query("propagationPolicy").value_or("Background"));
  if (options.value("orphanDependents", false)) policy = "Orphan";
  if (policy != "Background" && policy != "Foreground" && policy != "Orphan") {
    throw invalid("DeleteOptions", "meta.k8s.io", "",
                  {fieldNotSupported("propagationPolicy", policy, {"Foreground", "Background", "Orphan", "nil"})});
  }
  const json* current = store_.get(t.type->storageKey(), t.ns, t.name);
  if (current == nullptr) throw notFound(t.type->plural, t.type->group, t.name);
  json pre = options.value("preconditions", json::object());
  if (pre.contains("uid") && pre["uid"] != uidOf(*current)) {
    throw conflict(t.type->plural, t.type->group, t.name,
                   strCat("Precondition failed: UID in precondition: ", pre["uid"].get<std::string>(),
                          ", UID in object meta: ", uidOf(*current)));
  }
  if (pre.contains("resourceVersion") && pre["resourceVersion"] != meta(*current).value("resourceVersion", "")) {
    throw conflict(
        t.type->plural, t.type->group, t.name,
        strCat("Precondition failed: ResourceVersion in precondition: ", pre["resourceVersion"].get<std::string>(),
               ", ResourceVersion in object meta: ", meta(*current).value("resourceVersion", "")));
  }
  json before = *current;
  bool gone = removeObject(*t.type, before, policy);
  collectGarbage();
  if (gone) {
    json details = {{"name", t.name}, {"kind", t.type->plural}, {"uid", uidOf(before)}};
    if (!t.type->group.empty()) details["group"] = t.type->group;
    return Response::json(200, {{"kind", "Status"},
                                {"apiVersion", "v1"},
                                {"metadata", json::object()},
                                {"status", "Success"},
                                {"details", details}});
  }
  const json* now = store_.get(t.type->storageKey(), t.ns, t.name);
  return Response::json(now != nullptr ? 202 : 200, view(*t.type, now != nullptr ? *now : before));
}

bool ApiServer::Impl::removeObject(const ResourceType& t, const json& obj, const std::string& policy) {
  json o = obj;
  auto finalizers = finalizersOf(o);
  auto add = [&](const std::string& f) {
    if (std::find(finalizers.begin(), finalizers.end(), f) == finalizers.end()) finalizers.push_back(f);
  };
  bool hasDependents = false;
  for (const auto& [key, other] : store_.all()) {
    for (const auto& ref : meta(*other).value("ownerReferences", json::array())) {
      hasDependents = hasDependents || ref.value("uid", "") == uidOf(o);
    }
  }
  if (!deleting(o) && hasDependents) {
    if (policy == "Foreground") add("foregroundDeletion");
    if (policy == "Orphan") add("orphan");
  }
  bool isNamespace = t.plural == "namespaces" && t.group.empty();
  if (finalizers.empty() && !isNamespace) {
    eraseObject(t.storageKey(), o);
    return true;
  }
  if (!deleting(o) || finalizers != finalizersOf(o)) {
    if (!deleting(o)) {
      o["metadata"]["deletionTimestamp"] = nowRfc3339();
      o["metadata"]["deletionGracePeriodSeconds"] = 0;
    }
    if (isNamespace) o["status"]["phase"] = "Terminating";
    setFinalizers(o, finalizers);
    store_.put(t.storageKey(), o);
  }
  return false;
}

void ApiServer::Impl::eraseObject(const std::string& storageKey, const json& obj) {
  store_.erase(storageKey, nsOf(obj), nameOf(obj));
  fieldManager_.forget(uidOf(obj));
  if (storageKey == "apiextensions.k8s.io/customresourcedefinitions") {
    auto it = crdTypes_.find(nameOf(obj));
    if (it != crdTypes_.end()) {
      std::string key = it->second.empty() ? "" : it->second.front().storageKey();
      for (const json* o : store_.list(key, "")) fieldManager_.forget(uidOf(*o));
      store_.eraseAll(key);
      crdTypes_.erase(it);
    }
  }
}

void ApiServer::Impl::afterWrite(const ResourceType& t, const json& stored) {
  if (t.plural != "customresourcedefinitions") return;
  crdTypes_[nameOf(stored)] = typesFromCrd(stored);
}

// Background garbage collection, run after every write until nothing
// changes: dependents whose owners are all gone are deleted, foreground
// owners wait for their dependents, orphaning owners release theirs, and
// terminating namespaces are emptied and then removed.
void ApiServer::Impl::collectGarbage() {
  if (inGc_) return;
  inGc_ = true;
  for (int round = 0; round < 1000; ++round) {
    std::map<std::string, std::pair<std::string, json>> byUid;  // uid -> storageKey, object
    for (const auto& [key, o] : store_.all()) byUid[uidOf(*o)] = {key, *o};
    std::map<std::string, int> numDependents;
    bool changed = false;
    for (const auto& [uid, entry] : byUid) {
      const auto& [key, o] = entry;
      const json refs = meta(o).value("ownerReferences", json::array());
      if (!refs.is_array() || refs.empty()) continue;
      int alive = 0;
      json keptRefs = json::array();
      bool foreground = false;
      for (const auto& ref : refs) {
        auto owner = byUid.find(ref.value("uid", ""));
        if (owner == byUid.end()) continue;
        const json& ownerObj = owner->second.second;
        auto ofs = finalizersOf(ownerObj);
        if (deleting(ownerObj) && std::find(ofs.begin(), ofs.end(), "orphan") != ofs.end()) continue;  // released
        ++alive;
        keptRefs.push_back(ref);
        ++numDependents[owner->first];
        if (deleting(ownerObj) && std::find(ofs.begin(), ofs.end(), "foregroundDeletion") != ofs.end())
          foreground = true;
      }
      const ResourceType* t = typeFor(key);
      if (t == nullptr) continue;
      if (alive == 0 && !refs.empty()) {
        // Orphaned by an "orphan" owner: drop the references; otherwise all owners are gone.
        bool released = false;
        for (const auto& ref : refs) released = released || byUid.count(ref.value("uid", "")) > 0;
        if (released) {
          json o2 = o;
          o2["metadata"].erase("ownerReferences");
          store_.put(key, o2);
          changed = true;
        } else if (!deleting(o)) {
          removeObject(*t, o, "Background");
          changed = true;
        }
      } else if (keptRefs.size() != refs.size()) {
        json o2 = o;
        o2["metadata"]["ownerReferences"] = keptRefs;
        store_.put(key, o2);
        changed = true;
      } else if (foreground && !deleting(o)) {
        removeObject(*t, o, "Foreground");
        changed = true;
      }
    }
    if (changed) continue;
    // Owners waiting for dependents; namespaces waiting to be empty.
    for (const auto& [uid, entry] : byUid) {
      const auto& [key, o] = entry;
      if (!deleting(o)) continue;
      auto fs = finalizersOf(o);
      const ResourceType* t = typeFor(key);
      if (t == nullptr) continue;
      if (key == "/namespaces") {
        bool empty = true;
        for (const auto& [k2, other] : store_.all()) {
          const ResourceType* t2 = typeFor(k2);
          if (t2 == nullptr || !t2->namespaced || nsOf(*other) != nameOf(o)) continue;
          empty = false;
          if (!deleting(*other)) {
            removeObject(*t2, *other, "Background");
            changed = true;
          }
        }
        if (empty && fs.empty()) {
          eraseObject(key, o);
          changed = true;
        }
        if (changed) break;
        continue;
      }
      bool waitsForeground = std::find(fs.begin(), fs.end(), "foregroundDeletion") != fs.end();
      bool orphans = std::find(fs.begin(), fs.end(), "orphan") != fs.end();
      if ((waitsForeground && numDependents[uid] == 0) || orphans) {
        std::erase(fs, "foregroundDeletion");
        std::erase(fs, "orphan");
        json o2 = o;
        setFinalizers(o2, fs);
        if (fs.empty()) {
          eraseObject(key, o2);
        } else {
          store_.put(key, o2);
        }
        changed = true;
        break;
      }
    }
    if (!changed) break;
  }
  inGc_ = false;
}

// ---------------------------------------------------------------------------

ApiServer::ApiServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ApiServer::~ApiServer() { impl_->shutdown(); }

absl::StatusOr<std::unique_ptr<ApiServer>> ApiServer::start(ApiServerOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  absl::Status s = impl->start();
  if (!s.ok()) return s;
  return std::make_unique<ApiServer>(std::move(impl));
}

int ApiServer::port() const { return impl_->port(); }
std::string ApiServer::baseUrl() const { return impl_->baseUrl(); }
void ApiServer::shutdown() { impl_->shutdown(); }

std::string kubeconfigYaml(const std::string& server, const std::string& caPem) {
  std::string ca = caPem.empty() ? "" : strCat("    certificate-authority-data: ", absl::Base64Escape(caPem), "\n");
  return strCat("apiVersion: v1\n", "kind: Config\n", "clusters:\n", "- name: tandem\n", "  cluster:\n",
                "    server: ", server, "\n", ca, "users:\n", "- name: tandem\n", "  user: {}\n", "contexts:\n",
                "- name: tandem\n", "  context:\n", "    cluster: tandem\n", "    user: tandem\n",
                "    namespace: default\n", "current-context: tandem\n", "preferences: {}\n");
}

}  // namespace tandem::apiserver
