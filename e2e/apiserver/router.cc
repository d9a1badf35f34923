#include "e2e/apiserver/router.h"

#include <random>

#include <nlohmann/json.hpp>

#include "e2e/apiserver/api_error.h"
#include "e2e/apiserver/content_types.h"
#include "e2e/apiserver/discovery.h"
#include "e2e/apiserver/rbac.h"
#include "src/common/check.h"
#include "src/common/strings.h"

namespace tandem::apiserver {

using http::Request;
using http::Response;
using nlohmann::json;

namespace {

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

const json& versionDoc() {
  static const json kDoc = {{"major", "1"},
                            {"minor", "32"},
                            {"gitVersion", "v1.32.0-tandem"},
                            {"gitCommit", "0000000000000000000000000000000000000000"},
                            {"gitTreeState", "clean"},
                            {"buildDate", "2024-01-01T00:00:00Z"},
                            {"goVersion", "go1.23"},
                            {"compiler", "gc"},
                            {"platform", "linux/amd64"}};
  return kDoc;
}

TokenIssuer newTokenIssuer() {
  absl::StatusOr<TokenIssuer> issuer = TokenIssuer::create();
  TANDEM_CHECK(issuer.ok(), "no random key for service-account tokens");
  return std::move(*issuer);
}

// Where a resource path's group/version ends: /api/<v>/... or /apis/<g>/<v>/...
size_t resourceStart(const std::vector<std::string>& segs) { return segs[0] == "api" ? 2 : 3; }

}  // namespace

Router::Router(const ApiServerOptions& options, const Clock& clock)
    : options_(options),
      clock_(clock),
      tokens_(newTokenIssuer()),
      cluster_(options.watchHistory, clock),
      watches_(cluster_.store, clock, options.bookmarkInterval, wake_),
      faults_(options.faults, std::random_device{}()) {
  absl::MutexLock lock(&mu_);
  Call call{.manager = "tandem-apiserver"};
  for (const char* ns : {"default", "kube-system", "kube-public", "kube-node-lease"}) {
    writer_.create(cluster_.types.builtin("", "namespaces"), "",
                   {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}}, call);
  }
}

void Router::setServerAddress(std::string address) {
  absl::MutexLock lock(&mu_);
  serverAddress_ = std::move(address);
}

Response Router::serve(Request& req) {
  Call call{.manager = req.query("fieldManager").value_or("unknown"),
            .fieldValidation = req.query("fieldValidation").value_or("Warn")};
  Response r;
  try {
    absl::MutexLock lock(&mu_);
    std::optional<Response> answered = access(req);
    r = answered ? std::move(*answered) : route(req, call);
  } catch (const ApiError& e) {
    r = Response::json(e.code(), e.toStatus());
  } catch (const json::exception& e) {
    r = Response::json(400, badRequest(e.what()).toStatus());
  }
  r = negotiate(req, std::move(r));  // protobuf for clients that ask for it (content_types.h)
  for (const auto& w : call.warnings) r.setHeader("Warning", strCat("299 - \"", w, "\""));
  return r;
}

std::optional<Response> Router::access(Request& req) {
  const UserInfo user = authenticate(req, tokens_, cluster_.store, clock_.wallNow());
  const RequestAttributes a = requestAttributes(req);
  if (Decision d = authorize(cluster_.store, user, a); !d.allowed) throw forbiddenError(user, a, d.reason);
  // A server-side apply of an object that does not exist creates it, and
  // kube-apiserver's patch handler then authorizes a create as well.
  if (a.resourceRequest && a.verb == "patch" && a.subresource.empty() && !a.name.empty() &&
      req.header("Content-Type").value_or("").starts_with("application/apply-patch") &&
      cluster_.store.get(strCat(a.apiGroup, "/", a.resource), a.ns, a.name) == nullptr) {
    RequestAttributes create = a;
    create.verb = "create";
    if (Decision d = authorize(cluster_.store, user, create); !d.allowed) throw forbiddenError(user, create, d.reason);
  }
  checkEscalation(cluster_.store, user, a, req);
  if (!a.resourceRequest || a.verb != "create" || a.apiVersion != "v1") return std::nullopt;
  if (a.apiGroup.empty() && a.resource == "serviceaccounts" && a.subresource == "token") {
    return tokenRequest(req, tokens_, cluster_.store, clock_.wallNow(), a.ns, a.name);
  }
  if (a.apiGroup == "authorization.k8s.io" && a.resource == "selfsubjectaccessreviews" && a.name.empty()) {
    return selfSubjectAccessReview(req, cluster_.store, user);
  }
  if (a.apiGroup == "authentication.k8s.io" && a.resource == "selfsubjectreviews" && a.name.empty()) {
    return selfSubjectReview(req, user);
  }
  return std::nullopt;
}

Response Router::route(Request& req, Call& call) {
  const std::string& path = req.path();
  auto segs = splitPath(path);
  const bool get = req.method() == "GET";
  if (path == "/version" && get) return Response::json(200, versionDoc());
  if ((path == "/healthz" || path == "/readyz" || path == "/livez") && get) return Response::text(200, "ok");
  if (!segs.empty() && segs[0] == "tandem") return faultControl(req, faults_, watches_, cluster_.store, clock_.now());
  if (!segs.empty() && segs[0] == "openapi") return openapi(req);
  if (segs.empty() || (segs[0] != "api" && segs[0] != "apis")) throw pathNotFound();
  if (segs.size() <= resourceStart(segs)) {
    if (!get) throw methodNotAllowed();
    return discovery(req, segs);
  }
  return resource(req, segs, call);
}

Response Router::discovery(const Request& req, const std::vector<std::string>& segs) {
  auto all = cluster_.types.all();
  bool core = segs[0] == "api";
  std::string group = core ? "" : (segs.size() > 1 ? segs[1] : "");
  std::string version = core ? (segs.size() > 1 ? segs[1] : "") : (segs.size() > 2 ? segs[2] : "");
  json doc;
  if (req.path() == "/api") {
    doc = apiVersionsDoc(serverAddress_);
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

Response Router::openapi(const Request& req) {
  if (req.method() != "GET") throw methodNotAllowed();
  if (req.path() == "/openapi/v3") return Response::json(200, openapiV3Index(cluster_.types.all()));
  const std::string prefix = "/openapi/v3/";
  if (req.path().starts_with(prefix)) {
    json doc = openapiV3Doc(cluster_.types.all(), req.path().substr(prefix.size()));
    if (!doc.is_null()) return Response::json(200, doc);
  }
  throw pathNotFound();
}

Target Router::parseTarget(const std::vector<std::string>& segs) {
  size_t start = resourceStart(segs);
  std::string group = start == 2 ? "" : segs[1];
  std::string version = segs[start - 1];
  std::vector<std::string> rest(segs.begin() + static_cast<long>(start), segs.end());
  Target target;
  if (rest.size() >= 3 && rest[0] == "namespaces") {
    const ResourceType* t = cluster_.types.find(group, version, rest[2]);
    if (t != nullptr && t->namespaced) {
      target.type = t;
      target.ns = rest[1];
      rest.erase(rest.begin(), rest.begin() + 2);
    }
  }
  if (target.type == nullptr) target.type = cluster_.types.find(group, version, rest[0]);
  if (target.type == nullptr || rest.size() > 3) throw pathNotFound();
  if (rest.size() >= 2) target.name = rest[1];
  if (rest.size() == 3) {
    target.sub = rest[2];
    if (!(target.sub == "status" && target.type->hasStatus) && !(target.sub == "scale" && target.type->scale) &&
        !((target.sub == "binding" || target.sub == "log") && target.type->podSubresources)) {
      throw pathNotFound();
    }
  }
  if (!target.type->namespaced && !target.ns.empty()) throw pathNotFound();
  if (target.type->namespaced && target.ns.empty() && !target.name.empty()) throw pathNotFound();
  return target;
}

// A resource request: the target, then the injected faults, then the verb.
Response Router::resource(Request& req, const std::vector<std::string>& segs, Call& call) {
  Target target = parseTarget(segs);
  faults_.maybeFail(req.method(), target.type->plural, target.type->group, target.name);
  Duration delay = faults_.delayFor(isWatch(req));
  Response r = dispatch(req, target, call);
  if (delay <= Duration::zero()) return r;
  return delayed(std::move(r), delay);
}

Response Router::dispatch(Request& req, const Target& t, Call& call) {
  const std::string& m = req.method();
  if (t.name.empty()) {
    if (m == "GET") return isWatch(req) ? watch(req, t) : listObjects(cluster_, req, t);
    if (m == "POST") return createObject(writer_, req, t, call);
    if (m == "DELETE") return deleteCollection(writer_, cluster_, req, t);
    throw methodNotAllowed();
  }
  if (t.sub == "binding") {
    if (m != "POST") throw methodNotAllowed();
    return bindPod(writer_, cluster_, req, t, call);
  }
  if (t.sub == "log") {
    if (m != "GET") throw methodNotAllowed();
    return podLog(cluster_, req, t);
  }
  if (m == "GET") return getObject(cluster_, req, t);
  if (m == "PUT") return replaceObject(writer_, cluster_, req, t, call);
  if (m == "PATCH") return patchObject(writer_, cluster_, req, t, call);
  if (m == "DELETE" && t.sub.empty()) return deleteObject(writer_, cluster_, req, t);
  throw methodNotAllowed();
}

Response Router::watch(const Request& req, const Target& t) {
  Duration limit = options_.maxWatch;
  Duration dropAfter = faults_.options().watchDropAfter;
  if (dropAfter > Duration::zero()) limit = std::min(limit, dropAfter);
  WatchSpec spec = watchSpec(req, t, limit);
  // The stream opens after this handler returned (and released the mutex).
  Response r = Response::sse([this, spec](std::shared_ptr<http::SseWriter> writer) {
    absl::MutexLock lock(&mu_);
    watches_.open(spec, std::move(writer));
  });
  r.setHeader("Content-Type", "application/json");
  r.setHeader("Cache-Control", "no-cache, private");
  return r;
}

// The slow fault: the answer waits in delayedReplies_ until the timer
// thread sees the clock pass `due`.
Response Router::delayed(Response response, Duration delay) {
  MonoTime due = clock_.now() + delay;
  return Response::deferred([this, due, response](std::shared_ptr<http::Responder> responder) {
    {
      absl::MutexLock lock(&mu_);
      if (!stopping_) {
        delayedReplies_.add(due, std::move(responder), response);
        wake_->notify();
        return;
      }
    }
    responder->respond(response);
  });
}

MonoTime Router::tick(std::vector<DelayedReplies::Reply>& due) {
  MonoTime now = clock_.now();
  watches_.tick(now);
  due = delayedReplies_.takeDue(now);
  return std::min(watches_.nextDeadline(), delayedReplies_.nextDeadline());
}

void Router::runTimers() {
  while (true) {
    std::vector<DelayedReplies::Reply> due;
    MonoTime next;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      next = tick(due);
    }
    for (auto& [responder, response] : due) responder->respond(std::move(response));
    wake_->waitUntil(clock_, next);
  }
}

void Router::stop() {
  std::vector<DelayedReplies::Reply> due;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    watches_.closeAll();
    due = delayedReplies_.takeDue(MonoTime::max());
  }
  for (auto& [responder, response] : due) responder->respond(std::move(response));
  wake_->notify();
}

}  // namespace tandem::apiserver
