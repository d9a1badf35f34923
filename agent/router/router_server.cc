#include "agent/router/router_server.h"

#include <atomic>
#include <mutex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "agent/chat_template.h"
#include "agent/discovery.h"
#include "agent/openai_api.h"
#include "agent/openai_http.h"
#include "agent/openai_request.h"
#include "agent/router/router_core.h"
#include "agent/router/routing_knobs.h"
#include "agent/router/router_metrics.h"
#include "agent/router/upstream.h"
#include "agent/router/upstream_error.h"
#include "agent/router/worker_feeds.h"
#include "agent/internal_auth.h"
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

// The answer when only unresponsive decode workers could take a request
// and --unserved-timeout has passed since it arrived.
ApiError unservedError(Duration bound) {
  return {.status = 503,
          .type = "service_unavailable_error",
          .message = strCat("no decode worker took the request within ", std::chrono::duration<double>(bound).count(),
                            " s: every one that could take it stopped answering"),
          .code = "decode_workers_unresponsive",
          .headers = {{"Retry-After", "1"}}};
}

// The attempts under way and the router's liveness view of their workers
// (docs/routing.md "Liveness"). An attempt its worker has not started
// (UpstreamAttempt) is called off when the worker is unresponsive and
//  * another decode worker answers: the request moves there; or
//  * none does, and the worker has been unresponsive for --unserved-timeout,
//    counted from the request's arrival if that is later: the request gets
//    the typed 503 (serve()).
// An attempt on a worker that answers again is left alone. One thread
// re-checks on every change of liveness, every new attempt, and the next
// bound; on the injected clock.
class AttemptWatch {
 public:
  AttemptWatch(RouterCore& core, const Clock& clock, Duration unserved_timeout)
      : core_(core), clock_(clock), unserved_timeout_(unserved_timeout) {
    thread_ = std::thread([this] {
      nameThisThread("router-watch");
      run();
    });
  }
  ~AttemptWatch() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    cv_.SignalAll();
    thread_.join();
  }

  void add(const std::string& worker, std::shared_ptr<UpstreamAttempt> attempt, MonoTime arrival) {
    {
      absl::MutexLock lock(&mu_);
      entries_.push_back({worker, std::move(attempt), arrival});
    }
    cv_.SignalAll();
  }
  void remove(const UpstreamAttempt* attempt) {
    absl::MutexLock lock(&mu_);
    std::erase_if(entries_, [&](const Entry& e) { return e.attempt.get() == attempt; });
  }
  // A worker's liveness changed (RouterCore has it already): look again.
  // Under the lock, so the signal cannot fall between a check and its wait.
  void poke() {
    absl::MutexLock lock(&mu_);
    cv_.SignalAll();
  }

 private:
  struct Entry {
    std::string worker;
    std::shared_ptr<UpstreamAttempt> attempt;
    MonoTime arrival;
  };

  void run() {
    absl::MutexLock lock(&mu_);
    while (!stop_) {
      const MonoTime next = check();
      clock_.waitUntil(cv_, mu_, next);
    }
  }

  // Calls off what is due; returns when to look again.
  MonoTime check() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const MonoTime now = clock_.now();
    MonoTime next = MonoTime::max();
    for (const Entry& e : entries_) {
      if (e.attempt->started() || e.attempt->calledOff()) continue;
      const std::optional<MonoTime> since = core_.unresponsiveSince(e.worker);
      if (!since) continue;
      const MonoTime bound = std::max(*since, e.arrival) + unserved_timeout_;
      if (now >= bound || core_.otherResponsiveDecodeWorker(e.worker)) {
        e.attempt->callOff();
      } else {
        next = std::min(next, bound);
      }
    }
    return next;
  }

  RouterCore& core_;
  const Clock& clock_;
  const Duration unserved_timeout_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// An event stream to the client that releases the call's API-key grant
// before its end reaches the client: at OpenAI's last event, [DONE] (a
// client stops reading there), else when it closes or is dropped unclosed.
class GrantReleasingWriter final : public http::SseWriter {
 public:
  GrantReleasingWriter(std::shared_ptr<http::SseWriter> inner, std::shared_ptr<ApiKeyGrant> grant)
      : inner_(std::move(inner)), grant_(std::move(grant)) {}
  ~GrantReleasingWriter() override { grant_->release(); }

  bool send(std::string_view data) override {
    if (data == "[DONE]") grant_->release();
    return inner_->send(data);
  }
  bool sendEvent(const http::SseEvent& event) override { return inner_->sendEvent(event); }
  bool sendRaw(std::string_view bytes) override { return inner_->sendRaw(bytes); }
  size_t numUnsentBytes() const override { return inner_->numUnsentBytes(); }
  void close() override {
    grant_->release();
    inner_->close();
  }
  http::CallContext& context() override { return inner_->context(); }

 private:
  const std::shared_ptr<http::SseWriter> inner_;
  const std::shared_ptr<ApiKeyGrant> grant_;
};

// The client's responder for a routed call: releases the call's API-key
// grant right before the client can see the answer end (before a plain
// answer is sent; when a stream closes), so a client that sends its next
// request the moment one ended finds its key's slot free; else when the
// call is over (the last reference goes). Used on the call's thread only.
class GrantReleasingResponder final : public http::Responder {
 public:
  GrantReleasingResponder(std::shared_ptr<http::Responder> inner, ApiKeyGrant grant)
      : inner_(std::move(inner)), grant_(std::make_shared<ApiKeyGrant>(std::move(grant))) {}

  bool respond(http::Response response) override {
    if (response.kind() != http::Response::Kind::kSse) {
      grant_->release();
      return inner_->respond(std::move(response));
    }
    http::Response wrapped =
        http::Response::sse([start = response.sseStart(), grant = grant_](std::shared_ptr<http::SseWriter> w) {
          start(std::make_shared<GrantReleasingWriter>(std::move(w), grant));
        });
    for (const auto& [name, value] : response.headers()) wrapped.setHeader(name, value);
    return inner_->respond(std::move(wrapped));
  }
  http::CallContext& context() override { return inner_->context(); }

 private:
  const std::shared_ptr<http::Responder> inner_;
  const std::shared_ptr<ApiKeyGrant> grant_;  // shared with the stream's writer, if one opens
};

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
  ApiKeyGrant grant;  // the client's API key's slot, until the answer ends (GrantReleasingResponder)
};

struct RouterServer::Impl {
  Impl(const AgentConfig& c, const Clock& clk)
      : config(c),
        clock(clk),
        metrics(registry, c.pool),
        core(std::make_unique<routing::TandemPolicy>(c.routing), clk),
        watch(core, clk, c.unserved_timeout),
        upstreams(c.upstream_open_timeout) {}

  const AgentConfig config;
  const Clock& clock;
  Logger log{"router"};
  std::shared_ptr<const engine::Tokenizer> tokenizer;
  ApiLimits limits;
  metrics::Registry registry;
  RouterMetrics metrics;
  RouterCore core;
  AttemptWatch watch;  // before `feeds`: a feed's thread pokes it until the feeds are gone
  std::shared_ptr<auth::PoolKeySource> pool_keys;  // --pool-key-dir, or insecure (docs/security.md)
  std::unique_ptr<WorkerFeeds> feeds;
  std::unique_ptr<ServiceDiscovery> discovery;  // feeds the feeds; stopped before them
  std::unique_ptr<RoutingKnobsWatcher> knobs;    // the planner's knobs (--routing-knobs)
  std::unique_ptr<ApiKeyGate> api_keys;         // with --api-keys-file
  PublicApiAuth public_auth;                    // what /v1/... requests are checked with
  std::mutex reported_mu;
  std::set<std::string> reported_workers;  // the per-worker series /metrics last showed
  std::unique_ptr<http::Server> server;
  std::atomic<bool> draining{false};
  UpstreamPools upstreams;  // kept-alive connections to the decode workers
  CallThreads calls;

  http::Response generate(Endpoint endpoint, http::Request& req) {
    auto auth = authorizePublic(public_auth, req);
    if (auto* refused = std::get_if<http::Response>(&auth)) return std::move(*refused);
    if (draining.load()) {
      return apiError({.status = 503, .type = "service_unavailable_error", .message = "this router is draining",
                       .code = "draining"});
    }
    auto body = req.json();
    if (!body.ok()) return apiError({.status = 400, .message = std::string(toStd(body.status().message()))});
    // A chat template sees messages and tools in the client's key order (as on the workers).
    std::optional<nlohmann::ordered_json> ordered;
    if (endpoint == Endpoint::kChat && limits.chat_template) {
      ordered = nlohmann::ordered_json::parse(req.body(), nullptr, /*allow_exceptions=*/false);
    }
    auto parsed = parseRequest(endpoint, *body, *tokenizer, limits, req.header("x-session-id"),
                               ordered ? &*ordered : nullptr);
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
    call->grant = std::get<ApiKeyGrant>(std::move(auth));
    if (p.spec.session) call->session = p.spec.session->value();
    call->route = {.session = p.spec.session,
                   .prompt_hashes = computeBlockHashes(p.spec.prompt, hash->block_size, hash->root),
                   .prompt_tokens = static_cast<int64_t>(p.spec.prompt.size()),
                   .expected_output_tokens = p.spec.sampling.max_tokens};
    return http::Response::deferred([this, call](std::shared_ptr<http::Responder> r) {
      auto responder = std::make_shared<GrantReleasingResponder>(std::move(r), std::move(call->grant));
      calls.run([this, call, responder] { serve(*call, *responder); });
    });
  }

  // Runs on the call's own thread: decide, forward, and at most one retry
  // on another worker for a refusal or an unreachable worker before the
  // first token. An attempt called off because its worker stopped answering
  // (AttemptWatch) moves without using that retry. Unresponsive workers are
  // tried only when no other can take the request; once --unserved-timeout
  // has passed since its arrival with none answering, the answer is a typed 503.
  void serve(RoutedCall& call, http::Responder& responder) {
    std::vector<std::string> avoid;  // workers that refused it or could not be reached
    int failures = 0;
    const MonoTime unserved_at = call.arrival + config.unserved_timeout;
    for (;;) {
      const MonoTime t0 = clock.now();
      auto routed = core.route(call.route, avoid);
      if (auto* none = std::get_if<routing::NoWorker>(&routed);
          none && none->reason == routing::NoWorkerReason::kNoDecodeWorker && core.numUnresponsive() > 0) {
        if (t0 >= unserved_at) return unserved(responder);
        routed = core.route(call.route, avoid, /*allow_unresponsive=*/true);
      }
      if (auto* none = std::get_if<routing::NoWorker>(&routed)) {
        responder.respond(apiError(noWorkerError(none->reason)));
        return;
      }
      RouterCore::Assignment& a = std::get<RouterCore::Assignment>(routed);
      const routing::Decision& d = a.decision;
      metrics.onDecision(routing::routePathName(d.path), clock.now() - t0,
                         d.reason == routing::DecisionReason::kSticky);
      if (d.reason == routing::DecisionReason::kMigrated) metrics.onMigration();
      auto attempt = std::make_shared<UpstreamAttempt>();
      watch.add(d.decode, attempt, call.arrival);
      UpstreamOutcome out = forward(call, a, responder, attempt);
      watch.remove(attempt.get());
      switch (out.kind) {
        case UpstreamOutcome::Kind::kServed:
        case UpstreamOutcome::Kind::kClientGone:
          core.finished(call.route, a);
          return;
        case UpstreamOutcome::Kind::kCalledOff:
          // Not a failure of the worker, and not one to avoid: it may be the
          // last resort (or answer again) on the next round.
          core.finished(call.route, a);
          metrics.onCalledOff();
          metrics.onRetry(kUnresponsiveRetryLabel);
          log.info("called off a request its decode worker had not started; it stopped answering",
                   {{"worker", d.decode}});
          continue;
        case UpstreamOutcome::Kind::kRefused:
          core.rejected(call.route, a, *out.reason);
          if (++failures > 1) return relayRefusal(out, responder);
          metrics.onRetry(routing::rejectReasonName(*out.reason));
          break;
        case UpstreamOutcome::Kind::kUnreachable:
          core.unreachable(call.route, a);
          log.warn("decode worker unreachable", {{"worker", d.decode}, {"error", out.detail}});
          if (++failures > 1) {
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

  void unserved(http::Responder& responder) {
    metrics.onUnserved();
    responder.respond(apiError(unservedError(config.unserved_timeout)));
  }

  // One attempt on the decision's decode worker, the decision in headers.
  // Of the client's headers only the session goes to D: never its
  // Authorization (the client's API key stays at the router).
  UpstreamOutcome forward(RoutedCall& call, RouterCore::Assignment& a, http::Responder& responder,
                          std::shared_ptr<UpstreamAttempt> attempt) {
    const routing::Decision& d = a.decision;
    std::optional<WorkerAddress> dst = core.address(d.decode);
    if (!dst) return {.kind = UpstreamOutcome::Kind::kUnreachable, .detail = "no address known"};
    UpstreamRequest up{.base_url = dst->http,
                       .path = call.path,
                       .body = call.body,
                       .open_timeout = config.upstream_open_timeout,
                       .idle_timeout = config.request_timeout,
                       .attempt = std::move(attempt)};
    if (call.session) up.headers["x-session-id"] = *call.session;
    // The pool's token: D honours the decision headers only with it.
    if (std::string a = internalAuthorization(*pool_keys); !a.empty()) up.headers["Authorization"] = std::move(a);
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
  // The workers' chat template, so chats (tools included) are checked and
  // tokenized for routing as the workers will render them.
  TANDEM_ASSIGN_OR_RETURN(std::optional<ChatTemplate> chat_template, loadChatTemplate(config.model_dir));
  impl.limits = {.model_name = config.model_name,
                 .max_model_len = max_len,
                 .default_max_tokens = config.default_max_tokens,
                 .chat_format = impl.tokenizer->chatFormat(),
                 .chat_template =
                     chat_template ? std::make_shared<const ChatTemplate>(std::move(*chat_template)) : nullptr,
                 .clock = &impl.clock};
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
    impl.metrics.setUnresponsiveWorkers(impl.core.numUnresponsive());
    std::set<std::string> now;
    for (const auto& w : impl.core.workerLoads()) {
      impl.metrics.setWorkerLoad(w.name, w.sessions, w.in_flight);
      now.insert(w.name);
    }
    {
      // A worker that left (discovery) takes its series with it.
      std::lock_guard l(impl.reported_mu);
      for (const std::string& gone : impl.reported_workers) {
        if (!now.contains(gone)) impl.metrics.removeWorker(gone);
      }
      impl.reported_workers = std::move(now);
    }
    return http::Response::text(200, metrics::serializeText(impl.registry), std::string(metrics::kContentType));
  });
  r.handle("GET", "/v1/models", [&impl](http::Request& req) {
    auto auth = authorizePublic(impl.public_auth, req);
    if (auto* refused = std::get_if<http::Response>(&auth)) return std::move(*refused);
    return modelsResponse(impl.limits);
  });
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
  if (!config.api_keys_file.empty()) {
    TANDEM_ASSIGN_OR_RETURN(impl->api_keys,
                            ApiKeyGate::open({.file = config.api_keys_file,
                                              .defaults = config.api_key_limits,
                                              .reload_interval = config.api_keys_reload_interval,
                                              .clock = &clock},
                                             impl->registry, {{"pool", config.pool}, {"role", "router"}}));
    impl->public_auth.api_keys = impl->api_keys.get();
  }
  if (config.pool_key_dir.empty()) {
    impl->pool_keys = auth::PoolKeySource::insecure();
    impl->log.warn("no --pool-key-dir: the router sends the agents no pool token (docs/security.md)");
  } else {
    TANDEM_ASSIGN_OR_RETURN(impl->pool_keys, auth::PoolKeySource::open(config.pool_key_dir, clock));
  }
  // (public_auth.pool_keys stays unset: at the router the pool's token is
  // no reason to skip a client's key.)
  TANDEM_RETURN_IF_ERROR(loadModel(*impl));
  RouterServer::Impl* raw = impl.get();
  impl->feeds = std::make_unique<WorkerFeeds>(
      impl->core, clock, impl->log, config.worker_stale_after,
      [raw](const std::string&, bool) { raw->watch.poke(); },
      [raw] { return internalAuthorization(*raw->pool_keys); });
  for (const HostPort& w : config.decode_workers) impl->feeds->add(w, routing::WorkerRole::kDecode);
  for (const HostPort& w : config.prefill_workers) impl->feeds->add(w, routing::WorkerRole::kPrefill);
  if (!config.decode_service.empty() || !config.prefill_service.empty()) {
    TANDEM_ASSIGN_OR_RETURN(impl->discovery, ServiceDiscovery::connect(config.discovery_namespace));
    for (const auto& followed : {std::pair{config.decode_service, routing::WorkerRole::kDecode},
                                 std::pair{config.prefill_service, routing::WorkerRole::kPrefill}}) {
      if (followed.first.empty()) continue;
      const routing::WorkerRole role = followed.second;
      TANDEM_RETURN_IF_ERROR(impl->discovery->follow(followed.first, "http", [raw, role](const std::vector<HostPort>& ready) {
        raw->feeds->sync(role, ready);
      }));
    }
  }
  if (!config.routing_knobs_file.empty()) {
    impl->knobs = std::make_unique<RoutingKnobsWatcher>(
        config.routing_knobs_file, config.routing,
        [raw](const routing::RouterConfig& c) { return raw->core.setRouterConfig(c); });
  }
  TANDEM_ASSIGN_OR_RETURN(http::ServerOptions server_options, httpServerOptions(config, clock));
  TANDEM_ASSIGN_OR_RETURN(impl->server, http::Server::start(std::move(server_options), routerRoutes(*impl)));
  impl->log.info("serving", {{"address", strCat(config.host, ":", impl->server->port())},
                             {"role", "router"},
                             {"model", config.model_name},
                             {"pool", config.pool},
                             {"decode_workers", static_cast<int64_t>(config.decode_workers.size())},
                             {"prefill_workers", static_cast<int64_t>(config.prefill_workers.size())},
                             {"api_keys", impl->api_keys ? "on" : "off"}});
  return std::unique_ptr<RouterServer>(new RouterServer(std::move(impl)));
}

RouterServer::RouterServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RouterServer::~RouterServer() {
  // No new requests, then the routed calls end (a stream to a client that
  // is gone stops at once), then the state streams.
  impl_->server->shutdown(Duration(0));
  impl_->calls.join();
  impl_->knobs.reset();
  impl_->discovery.reset();
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
