#pragma once
// The handlers of the resource verbs, called by the Router once it has
// taken the URL apart and drawn the faults: reads (get, list, the scale
// subresource, Tables, what a watch asks for) in reads.cc; writes (create,
// replace, the patch types, server-side apply, delete, deletecollection)
// in write_requests.cc, which hand the object rules to ObjectWriter.
//
// They run under the Router's mutex and throw ApiError for the client.

#include <string>

#include <nlohmann/json.hpp>

#include "e2e/apiserver/cluster.h"
#include "e2e/apiserver/object_writer.h"
#include "e2e/apiserver/watch_hub.h"
#include "src/http/server.h"

namespace tandem::apiserver {

// A resource URL taken apart: /apis/<group>/<version>/namespaces/<ns>/<plural>/<name>/<sub>.
struct Target {
  const ResourceType* type = nullptr;
  std::string ns;
  std::string name;  // "": the collection
  std::string sub;   // "", "status", "scale"; for pods also "binding" and "log"
};

// `body` as JSON; 400 naming `what` ("patch", "DeleteOptions") if it is not.
nlohmann::json parseJsonOr400(const std::string& body, const char* what);

// Reads.
bool wantsTable(const http::Request& req);  // Accept asks for as=Table
bool isWatch(const http::Request& req);     // ?watch=true|1
// The autoscaling/v1 Scale of an object whose type has a scale subresource.
nlohmann::json scaleOf(const ResourceType& t, const nlohmann::json& obj);
http::Response getObject(const Cluster& cluster, const http::Request& req, const Target& t);
http::Response listObjects(const Cluster& cluster, const http::Request& req, const Target& t);
// What a watch request asks for; 400 / 422 for parameters a server refuses.
// `limit`: the longest the server lets a watch last.
WatchSpec watchSpec(const http::Request& req, const Target& t, Duration limit);

// Writes.
http::Response createObject(ObjectWriter& writer, const http::Request& req, const Target& t, Call& call);
http::Response replaceObject(ObjectWriter& writer, const Cluster& cluster, const http::Request& req, const Target& t,
                             Call& call);
http::Response patchObject(ObjectWriter& writer, Cluster& cluster, const http::Request& req, const Target& t,
                           Call& call);
http::Response deleteObject(ObjectWriter& writer, const Cluster& cluster, const http::Request& req, const Target& t);
http::Response deleteCollection(ObjectWriter& writer, const Cluster& cluster, const http::Request& req,
                                const Target& t);

// Pods (pod_requests.cc). binding: sets spec.nodeName once (409 if the pod
// has one or is being deleted) and the PodScheduled condition. log: the
// container's log, fetched from the kubelet endpoint the pod's Node reports
// (status.daemonEndpoints), off the mutex; `follow` is not supported (the
// log so far is returned).
http::Response bindPod(ObjectWriter& writer, Cluster& cluster, const http::Request& req, const Target& t, Call& call);
http::Response podLog(const Cluster& cluster, const http::Request& req, const Target& t);

}  // namespace tandem::apiserver
