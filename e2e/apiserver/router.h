#pragma once
// The emulator's core: every request's way from URL to handler, under the
// one mutex that guards all state (objects, types, watches, faults), and the
// timer work (watch deadlines and bookmarks, held-back slow answers).
//
//   /version, /healthz, /readyz, /livez      fixed answers
//   /tandem/...                              fault control (faults.h)
//   /openapi/v3[/...]                        discovery.h
//   /api, /apis, /api/v1, /apis/<g>[/<v>]    discovery.h
//   /api/v1/..., /apis/<g>/<v>/...           resources: Target, then faults,
//                                            then the verb's handler (requests.h)
//
// ApiError thrown anywhere below becomes the response (a metav1.Status);
// JSON errors become 400. Warnings collected on the way become Warning headers.
//
// Thread-safety: serve() is called from many server threads at once;
// runTimers() runs on one thread of its own until stop(). Requests are
// short, and watches hold the mutex only to queue events.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "e2e/apiserver/api_server.h"
#include "e2e/apiserver/authn.h"
#include "e2e/apiserver/cluster.h"
#include "e2e/apiserver/faults.h"
#include "e2e/apiserver/object_writer.h"
#include "e2e/apiserver/requests.h"
#include "e2e/apiserver/wakeup.h"
#include "e2e/apiserver/watch_hub.h"
#include "src/common/clock.h"
#include "src/http/server.h"

namespace tandem::apiserver {

class Router {
 public:
  // `clock` is not owned and outlives the router. Creates the namespaces
  // every cluster has (default, kube-system, kube-public, kube-node-lease).
  Router(const ApiServerOptions& options, const Clock& clock);
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // The handler of every path.
  http::Response serve(http::Request& req);
  // host:port that /api reports as the server's address.
  void setServerAddress(std::string address);

  // Does the timer work when it is due (clock.waitUntil in between) until stop().
  void runTimers();
  // Ends every watch, sends the held-back answers now, and makes
  // runTimers() return. Idempotent.
  void stop();

 private:
  // Authentication and authorization before anything else (authn.h, rbac.h):
  // throws 401 / 403; answers the requests about identities themselves
  // (TokenRequest, the self reviews), nullopt for the rest.
  std::optional<http::Response> access(http::Request& req) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  http::Response route(http::Request& req, Call& call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  http::Response discovery(const http::Request& req, const std::vector<std::string>& segs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  http::Response openapi(const http::Request& req) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Target parseTarget(const std::vector<std::string>& segs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  http::Response resource(http::Request& req, const std::vector<std::string>& segs, Call& call)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  http::Response dispatch(http::Request& req, const Target& t, Call& call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  http::Response watch(const http::Request& req, const Target& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  http::Response delayed(http::Response response, Duration delay) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs the due timer work; returns when more is due, and the answers to send now.
  MonoTime tick(std::vector<DelayedReplies::Reply>& due) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ApiServerOptions options_;
  const Clock& clock_;
  const std::shared_ptr<Wakeup> wake_ = std::make_shared<Wakeup>();
  const TokenIssuer tokens_;  // its key drawn at start

  absl::Mutex mu_;
  Cluster cluster_ ABSL_GUARDED_BY(mu_);
  ObjectWriter writer_ ABSL_GUARDED_BY(mu_){cluster_};
  WatchHub watches_ ABSL_GUARDED_BY(mu_);
  FaultInjector faults_ ABSL_GUARDED_BY(mu_);
  DelayedReplies delayedReplies_ ABSL_GUARDED_BY(mu_);
  std::string serverAddress_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tandem::apiserver
