// The pods' own subresources: binding (the scheduler's) and log (served by
// the node's kubelet, as a real API server proxies it).

#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "e2e/apiserver/api_error.h"
#include "e2e/apiserver/json_util.h"
#include "e2e/apiserver/object_meta.h"
#include "e2e/apiserver/requests.h"
#include "src/common/strings.h"
#include "src/http/client.h"

namespace tandem::apiserver {

using http::Request;
using http::Response;
using nlohmann::json;

namespace {

const json& podOrThrow(const Cluster& cluster, const Target& t) {
  const json* pod = cluster.store.get(t.type->storageKey(), t.ns, t.name);
  if (pod == nullptr) throw notFound("pods", "", t.name);
  return *pod;
}

// Sets (or replaces) the condition of `type` in status.conditions.
void setCondition(json& status, json condition) {
  json& conditions = status["conditions"];
  if (!conditions.is_array()) conditions = json::array();
  for (auto& c : conditions) {
    if (c.value("type", "") == condition["type"]) {
      c = std::move(condition);
      return;
    }
  }
  conditions.push_back(std::move(condition));
}

}  // namespace

Response bindPod(ObjectWriter& writer, Cluster& cluster, const Request& req, const Target& t, Call& call) {
  json binding = parseJsonOr400(req.body(), "Binding");
  if (binding.value("kind", "Binding") != "Binding") {
    throw badRequest(strCat("the body is a ", binding.value("kind", ""), ", not a Binding"));
  }
  const std::string node = binding.value("/target/name"_json_pointer, "");
  if (node.empty()) throw invalid("Binding", "", t.name, {fieldRequired("target.name")});
  const std::string kind = binding.value("/target/kind"_json_pointer, "Node");
  if (kind != "Node") throw invalid("Binding", "", t.name, {fieldNotSupported("target.kind", kind, {"Node"})});
  const json& current = podOrThrow(cluster, t);
  if (deleting(current)) throw conflict("pods", "", t.name, "pod is being deleted, cannot be assigned to a host");
  const std::string assigned = current.value("/spec/nodeName"_json_pointer, "");
  if (!assigned.empty()) {
    throw conflict("pods", "", t.name, strCat("pod ", t.name, " is already assigned to node \"", assigned, "\""));
  }
  json bound = current;
  bound["spec"]["nodeName"] = node;
  json stored = writer.update(*t.type, current, bound, "", false, call);
  json withCondition = stored;
  setCondition(withCondition["status"], {{"type", "PodScheduled"},
                                         {"status", "True"},
                                         {"lastProbeTime", nullptr},
                                         {"lastTransitionTime", rfc3339(cluster.clock.wallNow())}});
  writer.update(*t.type, stored, withCondition, "status", false, call);
  return Response::json(201, {{"kind", "Status"}, {"apiVersion", "v1"}, {"metadata", json::object()},
                              {"status", "Success"}, {"code", 201}});
}

Response podLog(const Cluster& cluster, const Request& req, const Target& t) {
  const json& pod = podOrThrow(cluster, t);
  std::vector<std::string> names;
  for (const auto& c : pod.value("/spec/containers"_json_pointer, json::array())) names.push_back(c.value("name", ""));
  std::string container = req.query("container").value_or("");
  if (container.empty()) {
    if (names.size() != 1) {
      throw badRequest(strCat("a container name must be specified for pod ", t.name, ", choose one of: [",
                              absl::StrJoin(names, " "), "]"));
    }
    container = names.front();
  } else if (std::find(names.begin(), names.end(), container) == names.end()) {
    throw badRequest(strCat("container ", container, " is not valid for pod ", t.name));
  }
  const std::string nodeName = pod.value("/spec/nodeName"_json_pointer, "");
  if (nodeName.empty()) {
    throw badRequest(strCat("container \"", container, "\" in pod \"", t.name, "\" is waiting to start: not scheduled"));
  }
  const json* node = cluster.store.get("/nodes", "", nodeName);
  const int64_t port =
      node == nullptr ? 0 : node->value("/status/daemonEndpoints/kubeletEndpoint/Port"_json_pointer, int64_t{0});
  std::string address;
  if (node != nullptr) {
    for (const auto& a : node->value("/status/addresses"_json_pointer, json::array())) {
      if (a.value("type", "") == "InternalIP") address = a.value("address", "");
    }
  }
  if (port <= 0 || address.empty()) {
    throw ApiError(503, "ServiceUnavailable",
                   strCat("node ", nodeName, " reports no kubelet endpoint to read the log of pod ", t.name, " from"));
  }
  std::string url = strCat("http://", address, ":", port, "/containerLogs/", t.ns, "/", t.name, "/", container);
  std::string sep = "?";
  for (const char* q : {"tailLines", "previous", "timestamps", "limitBytes", "sinceSeconds"}) {
    if (auto v = req.query(q)) {
      url += strCat(sep, q, "=", *v);
      sep = "&";
    }
  }
  // Fetched outside the emulator's mutex, on a thread of its own.
  return Response::deferred([url, nodeName](std::shared_ptr<http::Responder> responder) {
    std::thread([url, nodeName, responder] {
      auto r = http::httpGet(url, std::chrono::seconds(20));
      if (!r.ok()) {
        responder->respond(Response::json(
            503, ApiError(503, "ServiceUnavailable",
                          strCat("the kubelet of node ", nodeName, " did not answer: ", r.status().message()))
                     .toStatus()));
        return;
      }
      if (r->status != 200) {
        responder->respond(Response::json(r->status, ApiError(r->status, r->status == 404 ? "NotFound" : "BadRequest",
                                                              r->body)
                                                         .toStatus()));
        return;
      }
      responder->respond(Response::text(200, r->body));
    }).detach();
  });
}

}  // namespace tandem::apiserver
