#pragma once
// An in-memory stand-in for the API server behind k8s::Transport, for pure
// tests: objects by path with one global resourceVersion, create (409
// AlreadyExists), update (409 Conflict on a stale resourceVersion), merge
// patch of top-level fields, delete; and hooks to inject failures and to run
// code (advance a FakeClock) inside a request. Records every request.
// Watches are served from a scripted list of lines.

#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/k8s/errors.h"
#include "src/k8s/transport.h"

namespace tandem::k8s::testing {

class FakeApi {
 public:
  std::vector<HttpRequest> requests;
  std::map<std::string, nlohmann::json> objects;  // object path → object
  int64_t resourceVersion = 100;
  // Called before each request is served; returning a status code != 0
  // answers with a Status of that code (fault injection).
  std::function<int(const HttpRequest&)> beforeRequest;
  // Scripted watch responses: each stream() pops one.
  std::deque<std::vector<std::string>> watchScripts;
  std::mutex mu;

  static std::string stripQuery(const std::string& path) { return path.substr(0, path.find('?')); }

  HttpResponse error(int code, const std::string& reason, const std::string& message) {
    K8sError e;
    e.code = code;
    e.reason = parseK8sErrorReason(reason);
    e.message = message;
    return {code, e.toJson().dump()};
  }

  HttpResponse serve(const HttpRequest& r) {
    std::lock_guard<std::mutex> lock(mu);
    requests.push_back(r);
    if (beforeRequest) {
      if (int code = beforeRequest(r); code != 0) return error(code, "", "injected failure");
    }
    std::string path = stripQuery(r.path);
    if (r.method == "GET") {
      auto it = objects.find(path);
      if (it == objects.end()) return error(404, "NotFound", path + " not found");
      return {200, it->second.dump()};
    }
    if (r.method == "POST") {
      nlohmann::json obj = nlohmann::json::parse(r.body);
      std::string objPath = path + "/" + obj["metadata"]["name"].get<std::string>();
      if (objects.count(objPath)) return error(409, "AlreadyExists", objPath + " already exists");
      obj["metadata"]["resourceVersion"] = std::to_string(++resourceVersion);
      objects[objPath] = obj;
      return {201, obj.dump()};
    }
    if (r.method == "PUT") {
      nlohmann::json obj = nlohmann::json::parse(r.body);
      auto it = objects.find(path);
      if (it == objects.end()) return error(404, "NotFound", path + " not found");
      if (obj["metadata"].value("resourceVersion", "") != it->second["metadata"].value("resourceVersion", "")) {
        return error(409, "Conflict", "the object has been modified; please apply your changes to the latest version");
      }
      obj["metadata"]["resourceVersion"] = std::to_string(++resourceVersion);
      it->second = obj;
      return {200, obj.dump()};
    }
    if (r.method == "PATCH") {
      auto it = objects.find(path);
      if (it == objects.end()) return error(404, "NotFound", path + " not found");
      it->second.merge_patch(nlohmann::json::parse(r.body));
      it->second["metadata"]["resourceVersion"] = std::to_string(++resourceVersion);
      return {200, it->second.dump()};
    }
    if (r.method == "DELETE") {
      auto it = objects.find(path);
      if (it == objects.end()) return error(404, "NotFound", path + " not found");
      nlohmann::json obj = it->second;
      objects.erase(it);
      return {200, obj.dump()};
    }
    return error(405, "MethodNotAllowed", r.method);
  }
};

class ScriptedLines final : public LineStream {
 public:
  explicit ScriptedLines(std::vector<std::string> lines) : lines_(lines.begin(), lines.end()) {}
  absl::StatusOr<std::optional<std::string>> nextLine() override {
    if (stopped_) return absl::CancelledError("stopped");
    if (lines_.empty()) return std::optional<std::string>();
    std::string line = lines_.front();
    lines_.pop_front();
    return std::optional<std::string>(line);
  }
  void stop() override { stopped_ = true; }

 private:
  std::deque<std::string> lines_;
  bool stopped_ = false;
};

// A Transport over a FakeApi it does not own.
class FakeTransport final : public Transport {
 public:
  explicit FakeTransport(FakeApi& api) : api_(api) {}
  absl::StatusOr<HttpResponse> send(const HttpRequest& request) override { return api_.serve(request); }
  absl::StatusOr<StreamResponse> stream(const HttpRequest& request) override {
    std::lock_guard<std::mutex> lock(api_.mu);
    api_.requests.push_back(request);
    StreamResponse out;
    if (api_.watchScripts.empty()) {
      out.status = 200;
      out.lines = std::make_unique<ScriptedLines>(std::vector<std::string>{});
      return out;
    }
    out.status = 200;
    out.lines = std::make_unique<ScriptedLines>(api_.watchScripts.front());
    api_.watchScripts.pop_front();
    return out;
  }

 private:
  FakeApi& api_;
};

}  // namespace tandem::k8s::testing
