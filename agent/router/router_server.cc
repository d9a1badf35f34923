#include "agent/router/router_server.h"

#include <atomic>
#include <thread>

#include <nlohmann/json.hpp>

#include "agent/openai_api.h"
#include "agent/openai_http.h"
#include "agent/openai_request.h"
#include "agent/router/router_core.h"
#include "agent/router/router_metrics.h"
#include "agent/router/upstream.h"
#include "agent/router/upstream_error.h"
#include "agent/router/worker_feeds.h"
#include "agent/routing_headers.h"
#include "engine/model/files.h"
#include "engine/model/model_config.h"
#include "engine/model/tokenizer.h"
#include "src/common/block_hash.h"
#include "src/common/log.h"
#include "src/common/strings.h"
#include "src/http/client.h"
#include "src/http/server.h"
#include "src/routing/tandem_policy.h"
#include "src/common/thread_name.h"

namespace tandem::agent {
namespace {

using nlohmann::json;

ApiError noWorkerError(routing::NoWorkerReason reason) {
  if (reason == routing::NoWorkerReason::kTooLong) {
    return {.status = 400,
            .message = "the prompt and max_tokens exceed what every decode worker can hold",
            .code = "context_length_exceeded"};
  }
  return {.status = 503,
          .type = "service_unavailable_error",
          .message = "no healthy decode worker can take the request",
          .code = "no_decode_worker",
          .headers = {{"Retry-After", "1"}}};
}

// Counts the threads serving routed requests, so drain() and the
// destructor can wait for them.
class CallThreads {
 public:
  template <typename Fn>
  void run(Fn&& fn) {
    {
      absl::MutexLock lock(&mu_);
      ++live_;
    }
    std::thread([this, fn = std::forward<Fn>(fn)]() mutable {
      nameThisThread("router-call");
      fn();
      absl::MutexLock lock(&mu_);
      --live_;
    }).detach();
  }
  // Waits until none runs.
  void join() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(+[](int* n) { return *n == 0; }, &live_));
  }

 private:
  absl::Mutex mu_;
  int live_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

// One client request on its way through the router.
struct RoutedCall {
  Endpoint endpoint;
  bool stream = false;
  std::string path;  // "/v1/chat/completions"
  std::string body;
  std::optional<std::string> session;
  routing::RouteRequest route;
  MonoTime arrival;
};

struct RouterServer::Impl {
  Impl(const AgentConfig& c, const Clock& clk)
      : config(c),
        clock(clk),
        metrics(registry, c.pool),
        core(std::make_unique<routing::TandemPolicy>(c.routing), clk),
        upstreams(c.upstream_open_timeout) {}

  const AgentConfig config;
  const Clock& clock;
  Logger log{"router"};
  std::shared_ptr<const engine::Tokenizer> tokenizer;
  ApiLimits limits;
  metrics::Registry registry;
  RouterMetrics metrics;
  RouterCore core;
  std::unique_ptr<WorkerFeeds> feeds;
  std::unique_ptr<http::Server> server;
  std::atomic<bool> draining{false};
  UpstreamPools upstreams;  // kept-alive connections to the decode workers
  CallThreads calls;

  http::Response generate(Endpoint endpoint, http::Request& req) {
    if (draining.load()) {
      return apiError({.status = 503, .type = "service_unavailable_error", .message = "this router is draining",
                       .code = "draining"});
    }
    auto body = req.json();
    if (!body.ok()) return apiError({.status = 400, .message = std::string(toStd(body.status().message()))});
    auto parsed = parseRequest(endpoint, *body, *tokenizer, limits, req.header("x-session-id"));
    if (auto* e = std::get_if<ApiError>(&parsed)) return apiError(*e);
    const ParsedRequest& p = std::get<ParsedRequest>(parsed);
    std::optional<HashSpec> hash = core.hashSpec();
    if (!hash) return apiError(noWorkerError(routing::NoWorkerReason::kNoDecodeWorker));
    auto call = std::make_shared<RoutedCall>();
    call->endpoint = endpoint;
    call->stream = p.stream;
    call->path = req.path();
    call->body = req.body();
    call->arrival = clock.now();
    if (p.spec.session) call->session = p.spec.session->value();
    call->route = {.session = p.spec.session,
                   .prompt_hashes = computeBlockHashes(p.spec.prompt, hash->block_size, hash->root),
                   .prompt_tokens = static_cast<int64_t>(p.spec.prompt.size()),
                   .expected_output_tokens = p.spec.sampling.max_tokens};
    return http::Response::deferred([this, call](std::shared_ptr<http::Responder> r) {
      calls.run([this, call, r] { serve(*call, *r); });
    });
  }

  // Runs on the call's own thread: decide, forward, and at most one retry
  // on another worker for a failure before the first token.
  void serve(RoutedCall& call, http::Responder& responder) {
    std::vector<std::string> avoid;
    for (int attempt = 0;; ++attempt) {
      const MonoTime t0 = clock.now();
      auto routed = core.route(call.route, avoid);
      if (auto* none = std::get_if<routing::NoWorker>(&routed)) {
        responder.respond(apiError(noWorkerError(none->reason)));
        return;
      }
      RouterCore::Assignment& a = std::get<RouterCore::Assignment>(routed);
      const routing::Decision& d = a.decision;
      metrics.onDecision(routing::routePathName(d.path), clock.now() - t0,
                         d.reason == routing::DecisionReason::kSticky);
      if (d.reason == routing::DecisionReason::kMigrated) metrics.onMigration();
      UpstreamOutcome out = forward(call, a, responder);
      const bool last = attempt >= 1;
      switch (out.kind) {
        case UpstreamOutcome::Kind::kServed:
        case UpstreamOutcome::Kind::kClientGone:
          core.finished(call.route, a);
          return;
        case UpstreamOutcome::Kind::kRefused:
          core.rejected(call.route, a, *out.reason);
          if (last) return relayRefusal(out, responder);
          metrics.onRetry(routing::rejectReasonName(*out.reason));
          break;
        case UpstreamOutcome::Kind::kUnreachable:
          core.unreachable(call.route, a);
          log.warn("decode worker unreachable", {{"worker", d.decode}, {"error", out.detail}});
          if (last) {
            responder.respond(apiError({.status = 503, .type = "service_unavailable_error",
                                        .message = strCat("decode worker ", d.decode, " is unreachable: ", out.detail),
                                        .code = "upstream_unreachable", .headers = {{"Retry-After", "1"}}}));
            return;
          }
          metrics.onRetry(kUnreachableRetryLabel);
          break;
      }
      avoid.push_back(d.decode);
    }
  }

  // One attempt on the decision's decode worker, the decision in headers.
  UpstreamOutcome forward(RoutedCall& call, RouterCore::Assignment& a, http::Responder& responder) {
    const routing::Decision& d = a.decision;
    std::optional<WorkerAddress> dst = core.address(d.decode);
    if (!dst) return {.kind = UpstreamOutcome::Kind::kUnreachable, .detail = "no address known"};
    UpstreamRequest up{.base_url = dst->http, .path = call.path, .body = call.body,
                       .open_timeout = config.upstream_open_timeout, .idle_timeout = config.request_timeout};
    if (call.session) up.headers["x-session-id"] = *call.session;
    up.headers[std::string(kRoutePathHeader)] = std::string(routing::routePathName(d.path));
    if (d.prefill) {
      std::optional<WorkerAddress> p = core.address(*d.prefill);
      if (p && !p->kv.empty()) up.headers[std::string(kPrefillPeerHeader)] = p->kv;
    }
    if (!call.stream) return forwardUnary(upstreams, up, responder);
    UpstreamOutcome out = forwardStream(upstreams, up, responder, clock, [&] {
      core.admitted(a);
      metrics.onFirstToken(clock.now() - call.arrival);
    });
    if (out.first_chunk) metrics.onStreamEnd(out.chunks, *out.first_chunk, out.last_chunk);
    return out;
  }
};

}  // namespace tandem::agent

namespace tandem::agent {
namespace {

// Loads what the router needs of the model: its config (context length) and
// tokenizer, not its weights.
absl::Status loadModel(RouterServer::Impl& impl) {
  const AgentConfig& config = impl.config;
  TANDEM_ASSIGN_OR_RETURN(std::string text, engine::readFile(config.model_dir + "/config.json"));
  TANDEM_ASSIGN_OR_RETURN(engine::ModelConfig mc,
                          engine::parseModelConfig(text, config.model_dir + "/config.json"));
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<engine::Tokenizer> tok, engine::loadTokenizer(config.model_dir, mc));
  impl.tokenizer = std::move(tok);
  const int max_len = config.engine.max_model_len > 0 ? config.engine.max_model_len : mc.max_position_embeddings;
  impl.limits = {.model_name = config.model_name,
                 .max_model_len = max_len,
                 .default_max_tokens = config.default_max_tokens,
                 .chat_format = impl.tokenizer->chatFormat()};
  return absl::OkStatus();
}

http::Routes routerRoutes(RouterServer::Impl& impl) {
  http::Routes r;
  r.handle("GET", "/healthz", [](http::Request&) { return http::Response::json(200, json{{"status", "ok"}}); });
  r.handle("GET", "/readyz", [&impl](http::Request&) {
    if (impl.draining.load()) return http::Response::json(503, json{{"status", "draining"}});
    if (!impl.core.hasDecodeSnapshot()) {
      return http::Response::json(503, json{{"status", "no decode worker has reported its state yet"}});
    }
    return http::Response::json(200, json{{"status", "ready"}});
  });
  r.handle("GET", "/metrics", [&impl](http::Request&) {
    impl.metrics.setStaleWorkers(impl.core.numStale());
    for (const auto& w : impl.core.workerLoads()) impl.metrics.setWorkerLoad(w.name, w.sessions, w.in_flight);
    return http::Response::text(200, metrics::serializeText(impl.registry), std::string(metrics::kContentType));
  });
  r.handle("GET", "/v1/models", [&impl](http::Request&) { return modelsResponse(impl.limits); });
  r.handle("POST", "/v1/completions",
           [&impl](http::Request& req) { return impl.generate(Endpoint::kCompletions, req); });
  r.handle("POST", "/v1/chat/completions",
           [&impl](http::Request& req) { return impl.generate(Endpoint::kChat, req); });
  return r;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RouterServer>> RouterServer::start(const AgentConfig& config, const Clock& clock) {
  TANDEM_RETURN_IF_ERROR(validateAgentConfig(config));
  auto impl = std::make_unique<Impl>(config, clock);
  TANDEM_RETURN_IF_ERROR(loadModel(*impl));
  impl->feeds = std::make_unique<WorkerFeeds>(impl->core, clock, impl->log);
  for (const HostPort& w : config.decode_workers) impl->feeds->add(w, routing::WorkerRole::kDecode);
  for (const HostPort& w : config.prefill_workers) impl->feeds->add(w, routing::WorkerRole::kPrefill);
  TANDEM_ASSIGN_OR_RETURN(const http::ServerLibrary library, http::parseServerLibrary(config.http_server));
  TANDEM_ASSIGN_OR_RETURN(impl->server, http::Server::start({.host = config.host,
                                                             .port = config.port,
                                                             .maxBodyBytes = config.max_body_bytes,
                                                             .requestTimeout = config.request_timeout,
                                                             .sseKeepalive = config.sse_keepalive,
                                                             .clock = &clock,
                                                             .library = library},
                                                            routerRoutes(*impl)));
  impl->log.info("serving", {{"address", strCat(config.host, ":", impl->server->port())},
                             {"role", "router"},
                             {"model", config.model_name},
                             {"pool", config.pool},
                             {"decode_workers", static_cast<int64_t>(config.decode_workers.size())},
                             {"prefill_workers", static_cast<int64_t>(config.prefill_workers.size())}});
  return std::unique_ptr<RouterServer>(new RouterServer(std::move(impl)));
}

RouterServer::RouterServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RouterServer::~RouterServer() {
  // No new requests, then the routed calls end (a stream to a client that
  // is gone stops at once), then the state streams.
  impl_->server->shutdown(Duration(0));
  impl_->calls.join();
  impl_->feeds.reset();
}

int RouterServer::port() const { return impl_->server->port(); }

void RouterServer::drain() {
  impl_->draining.store(true);
  impl_->log.info("draining", {{"grace_s", std::chrono::duration<double>(impl_->config.drain_grace).count()}});
  impl_->server->shutdown(impl_->config.drain_grace);
  impl_->calls.join();
  impl_->log.info("drained");
}

}  // namespace tandem::agent
