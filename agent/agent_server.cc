#include "agent/agent_server.h"

#include <random>

#include <nlohmann/json.hpp>

#include "agent/agent_metrics.h"
#include "agent/openai_api.h"
#include "agent/pd_service.h"
#include "agent/trace.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/engine_loop.h"
#include "engine/model/model_loader.h"
#include "engine/model/tokenizer.h"
#include "src/common/log.h"
#include "src/common/strings.h"
#include "src/http/server.h"

namespace tandem::agent {
namespace {

using nlohmann::json;

http::Response apiError(const ApiError& e) {
  http::Response r = http::Response::json(e.status, e.toJson());
  for (const auto& [k, v] : e.headers) r.setHeader(k, v);
  return r;
}

std::string newId(std::string_view prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(rng()));
  return strCat(prefix, buf);
}

int64_t unixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

bool normalFinish(engine::FinishReason r) {
  return r == engine::FinishReason::kEos || r == engine::FinishReason::kLength || r == engine::FinishReason::kStop;
}

}  // namespace

struct AgentServer::Impl {
  AgentConfig config;
  Logger log{"agent"};
  std::shared_ptr<const engine::Tokenizer> tokenizer;
  ApiLimits limits;
  engine::EngineOptions engine_options;  // the engine's, for checks made before a request reaches it
  metrics::Registry registry;
  std::unique_ptr<AgentMetrics> metrics;
  std::unique_ptr<TraceWriter> trace;
  std::unique_ptr<engine::EngineLoop> loop;
  std::unique_ptr<PdMetrics> pd_metrics;
  std::unique_ptr<PrefillService> prefill;  // role prefill
  std::unique_ptr<DecodeService> decode;    // role decode
  std::unique_ptr<http::Server> server;
  std::atomic<bool> draining{false};
  int max_live = 0;
  int kv_port = 0;  // roles prefill and decode: the bound UCX port

  // One request's progress, shared by the engine callback and the HTTP side.
  struct Call {
    Endpoint endpoint;
    std::string id;
    int64_t created;
    std::string session;
    bool include_usage = false;
    std::string text;
    bool role_sent = false;
  };

  // Runs a request here (roles both, prefill) or disaggregated (role decode).
  // The callback sees the typed transfer failure, if one ended the request.
  uint64_t submit(engine::RequestSpec spec, PdUpdateCallback cb) {
    if (decode) return decode->submit(std::move(spec), std::move(cb));
    return loop->submit(std::move(spec), [cb = std::move(cb)](const engine::RequestUpdate& u) { cb(u, PdInfo{}); });
  }

  void finished(const Call& call, const engine::RequestUpdate& u, const PdInfo& info) {
    const std::string path(pdPathName(info.path));
    metrics->onFinish(u, path);
    if (trace) {
      trace->write(traceRecord({.request_id = call.id, .model = limits.model_name, .role = config.role,
                                .worker = config.worker, .path = path, .kv = info.timings ? &*info.timings : nullptr},
                               u, call.session));
    }
    log.debug("request finished", {{"request_id", call.id},
                                   {"finish_reason", engine::finishReasonName(u.finish_reason)},
                                   {"prompt_tokens", u.num_prompt_tokens},
                                   {"output_tokens", u.num_output_tokens}});
  }

  http::Response generate(Endpoint endpoint, http::Request& req) {
    if (draining.load()) {
      return apiError({.status = 503, .type = "service_unavailable_error", .message = "this agent is draining", .code = "draining"});
    }
    auto body = req.json();
    if (!body.ok()) return apiError({.status = 400, .message = std::string(toStd(body.status().message()))});
    auto parsed = parseRequest(endpoint, *body, *tokenizer, limits, req.header("x-session-id"));
    if (auto* e = std::get_if<ApiError>(&parsed)) return apiError(*e);
    ParsedRequest p = std::move(std::get<ParsedRequest>(parsed));
    if (auto why = engine::capacityRejection(engine_options, static_cast<int>(p.spec.prompt.size()), p.spec)) {
      // Before a stream opens, so the client gets a 400 status, not an error event in a 200 stream.
      engine::RequestUpdate u;
      u.finished = true;
      u.finish_reason = engine::FinishReason::kRejected;
      u.reject_reason = engine::RejectReason::kCapacity;
      u.message = std::move(*why);
      return apiError(errorForFinish(u));
    }
    if (loop->numLive() >= max_live) {
      return apiError({.status = 429, .type = "rate_limit_error",
                       .message = strCat("too many requests in flight (", max_live, "); retry later"),
                       .code = "queue_full", .headers = {{"Retry-After", "1"}}});
    }
    p.spec.deadline = SystemClock::instance().now() + config.request_timeout;
    auto call = std::make_shared<Call>();
    call->endpoint = endpoint;
    call->id = newId(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-");
    call->created = unixNow();
    call->session = p.spec.session ? p.spec.session->value() : "";
    call->include_usage = p.include_usage;
    return p.stream ? stream(call, std::move(p)) : unary(call, std::move(p));
  }

  http::Response unary(std::shared_ptr<Call> call, ParsedRequest p) {
    return http::Response::deferred([this, call, spec = std::move(p.spec)](std::shared_ptr<http::Responder> r) mutable {
      uint64_t handle = submit(std::move(spec), [this, call, r](const engine::RequestUpdate& u, const PdInfo& info) {
        call->text += u.text_delta;
        if (!u.finished) return;
        finished(*call, u, info);
        if (!normalFinish(u.finish_reason)) {
          r->respond(apiError(errorForFinish(u, info.failure)));
          return;
        }
        r->respond(http::Response::json(
            200, completionBody(call->endpoint, call->id, call->created, limits.model_name, call->text,
                                openAiFinishReason(u.finish_reason), {u.num_prompt_tokens, u.num_output_tokens})));
      });
      // Deadline or disconnect: end the request in the engine, freeing its blocks.
      r->context().onCancel([this, handle] { loop->cancel(handle); });
    });
  }

  http::Response stream(std::shared_ptr<Call> call, ParsedRequest p) {
    return http::Response::sse([this, call, spec = std::move(p.spec)](std::shared_ptr<http::SseWriter> w) mutable {
      uint64_t handle = submit(std::move(spec), [this, call, w](const engine::RequestUpdate& u, const PdInfo& info) {
        const std::string& model = limits.model_name;
        if (!u.text_delta.empty() || (u.finished && normalFinish(u.finish_reason) && !call->role_sent)) {
          bool role = call->endpoint == Endpoint::kChat && !call->role_sent;
          if (role) {
            w->send(chunkBody(call->endpoint, call->id, call->created, model, "", "", true, call->include_usage).dump());
            call->role_sent = true;
          }
          if (!u.text_delta.empty()) {
            w->send(chunkBody(call->endpoint, call->id, call->created, model, u.text_delta, "", false, call->include_usage).dump());
          }
        }
        if (!u.finished) return;
        finished(*call, u, info);
        if (normalFinish(u.finish_reason)) {
          w->send(chunkBody(call->endpoint, call->id, call->created, model, "", openAiFinishReason(u.finish_reason),
                            false, call->include_usage).dump());
          if (call->include_usage) {
            w->send(usageChunkBody(call->endpoint, call->id, call->created, model,
                                   {u.num_prompt_tokens, u.num_output_tokens}).dump());
          }
        } else if (u.finish_reason != engine::FinishReason::kCancelled || !w->cancelled()) {
          // The status line is already sent; the error travels as an event, as OpenAI's API does.
          w->send(errorForFinish(u, info.failure).toJson().dump());
        }
        w->send("[DONE]");
        w->close();
      });
      w->context().onCancel([this, handle] { loop->cancel(handle); });
    });
  }

  http::Routes routes() {
    http::Routes r;
    r.handle("GET", "/healthz", [](http::Request&) { return http::Response::json(200, json{{"status", "ok"}}); });
    r.handle("GET", "/readyz", [this](http::Request&) {
      if (draining.load()) return http::Response::json(503, json{{"status", "draining"}});
      if (!loop->alive()) return http::Response::json(503, json{{"status", "starting"}});
      return http::Response::json(200, json{{"status", "ready"}});
    });
    r.handle("GET", "/metrics", [this](http::Request&) {
      return http::Response::text(200, metrics::serializeText(registry), std::string(metrics::kContentType));
    });
    r.handle("GET", "/v1/models", [this](http::Request&) {
      json model = {{"id", limits.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "tandem"},
                    {"max_model_len", limits.max_model_len}};
      return http::Response::json(200, json{{"object", "list"}, {"data", json::array({model})}});
    });
    r.handle("POST", "/v1/completions", [this](http::Request& req) { return generate(Endpoint::kCompletions, req); });
    r.handle("POST", "/v1/chat/completions", [this](http::Request& req) { return generate(Endpoint::kChat, req); });
    return r;
  }
};

absl::StatusOr<std::unique_ptr<AgentServer>> AgentServer::start(const AgentConfig& config) {
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<engine::ModelWeights> weights, engine::loadModelWeights(config.model_dir));
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<engine::Tokenizer> tokenizer,
                          engine::loadTokenizer(config.model_dir, weights->config));
  impl->tokenizer = std::move(tokenizer);
  std::shared_ptr<const engine::ModelWeights> shared_weights = std::move(weights);
  const bool pd_role = config.role == "prefill" || config.role == "decode";
  const transport::TransportOptions kv_transport{
      .host = config.kv_host,
      .port = config.kv_port,
      .tls = config.kv_tls,
      .ib_sl = config.ib_sl >= 0 ? std::optional<int>(config.ib_sl) : std::nullopt,
      .ib_traffic_class = config.ib_traffic_class >= 0 ? std::optional<int>(config.ib_traffic_class) : std::nullopt,
      .copy_threads = config.kv_copy_threads};
  engine::EngineOptions engine_options = config.engine;
  std::shared_ptr<transport::UcxRegion> kv_pool;
  if (pd_role) {
    // The KV pool lives in memory UCX allocated, so a peer on the same
    // machine can read it over shared memory (transport/ucx_transport.h).
    engine_options.kv_memory = [&](size_t bytes) -> absl::StatusOr<engine::KvMemory> {
      TANDEM_ASSIGN_OR_RETURN(kv_pool, transport::UcxRegion::allocate(bytes, kv_transport));
      return engine::KvMemory{.bytes = kv_pool->bytes(), .keep_alive = kv_pool};
    };
  }
  // The CPU backend's vector code: TANDEM_CPU_SIMD, or the CPU's best. A bad
  // value is a start-up error here (the backend itself would abort on it).
  TANDEM_ASSIGN_OR_RETURN(const engine::SimdLevel simd, engine::simdLevelFromEnvironment());
  auto backend = std::make_unique<engine::CpuBackend>(engine::CpuBackendOptions{.simd = simd});
  const std::string_view cpu_simd = engine::simdLevelName(backend->simdLevel());
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine,
                          engine::Engine::create(engine_options, shared_weights, std::move(backend),
                                                 impl->tokenizer, SystemClock::instance()));
  impl->limits = {.model_name = config.model_name,
                  .max_model_len = engine->options().max_model_len,
                  .default_max_tokens = config.default_max_tokens};
  impl->max_live = engine->options().max_num_seqs + engine->options().max_waiting;
  impl->engine_options = engine->options();  // resolved, immutable: read on HTTP threads
  impl->engine_options.kv_memory = nullptr;  // holds references to this function's locals
  impl->metrics = std::make_unique<AgentMetrics>(impl->registry, config.pool, config.role);
  if (!config.trace_file.empty()) {
    TANDEM_ASSIGN_OR_RETURN(impl->trace, TraceWriter::open(config.trace_file));
  }
  engine::StepStats initial;
  initial.num_total_blocks = engine->options().num_blocks;
  initial.num_free_blocks = engine->numAvailableBlocks();
  impl->metrics->onStep(initial);
  Impl* raw = impl.get();
  impl->pd_metrics = std::make_unique<PdMetrics>(impl->registry, metrics::Labels{{"pool", config.pool}, {"role", config.role}});
  impl->loop = std::make_unique<engine::EngineLoop>(std::move(engine), [raw](const engine::StepStats& s, const engine::Engine& e) {
    raw->metrics->onStep(s);
    raw->pd_metrics->leases.set(e.numLeases());
  });
  if (pd_role) {
    PdOptions pd;
    pd.transport = kv_transport;
    pd.transport.pool = kv_pool;
    pd.lease_ttl = std::chrono::duration_cast<std::chrono::milliseconds>(config.lease_ttl);
    pd.prefill_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(config.prefill_timeout);
    pd.checksum_rate = config.checksum_rate;
    pd.direct_max_suffix_tokens = config.direct_max_suffix_tokens;
    pd.faults.layer_delay = std::chrono::milliseconds(config.fault_layer_delay_ms);
    pd.faults.get_delay = std::chrono::milliseconds(config.fault_get_delay_ms);
    pd.faults.get_complete_delay = std::chrono::milliseconds(config.fault_get_complete_delay_ms);
    pd.faults.fail_first_transfers = config.fault_fail_first_transfers;
    if (config.fault_layer_delay_ms || config.fault_get_delay_ms || config.fault_get_complete_delay_ms ||
        config.fault_fail_first_transfers) {
      impl->log.warn("FAULT INJECTION IS ON: this agent misbehaves on purpose (test configuration)");
    }
    if (config.role == "prefill") {
      // Prefills for decode agents count like any request here (path disagg).
      TANDEM_ASSIGN_OR_RETURN(impl->prefill,
                              PrefillService::start(*impl->loop, pd, *impl->pd_metrics, [raw](const engine::RequestUpdate& u) {
                                raw->finished(Impl::Call{.id = strCat("prefill-", u.id.value())}, u, PdInfo{.path = PdPath::kDisagg});
                              }));
      impl->kv_port = impl->prefill->port();
    } else {
      TANDEM_ASSIGN_OR_RETURN(const HostPort peer, parseHostPort("--prefill-peer", config.prefill_peer));
      pd.peer_host = peer.host;
      pd.peer_port = peer.port;
      TANDEM_ASSIGN_OR_RETURN(impl->decode, DecodeService::start(*impl->loop, pd, *impl->pd_metrics));
      impl->kv_port = impl->decode->port();
    }
  }
  TANDEM_ASSIGN_OR_RETURN(const http::ServerLibrary library, http::parseServerLibrary(config.http_server));
  TANDEM_ASSIGN_OR_RETURN(impl->server, http::Server::start({.host = config.host,
                                                             .port = config.port,
                                                             .maxBodyBytes = config.max_body_bytes,
                                                             .requestTimeout = config.request_timeout,
                                                             .sseKeepalive = config.sse_keepalive,
                                                             .library = library},
                                                            impl->routes()));
  impl->log.info("serving", {{"address", strCat(config.host, ":", impl->server->port())},
                             {"kv_port", impl->kv_port},
                             {"model", config.model_name},
                             {"role", config.role},
                             {"pool", config.pool},
                             {"kv_blocks", config.engine.num_blocks},
                             {"cpu_simd", cpu_simd}});
  return std::unique_ptr<AgentServer>(new AgentServer(std::move(impl)));
}

AgentServer::AgentServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

AgentServer::~AgentServer() {
  // The HTTP server first (no new requests), then the transport services
  // (every get completes before an importing request is ended), then the
  // engine loop.
  if (impl_->server) impl_->server->shutdown(Duration(0));
  impl_->decode.reset();
  impl_->prefill.reset();
  impl_->loop.reset();
}

int AgentServer::kvPort() const { return impl_->kv_port; }

int AgentServer::port() const { return impl_->server->port(); }

void AgentServer::drain() {
  impl_->draining.store(true);
  impl_->log.info("draining", {{"grace_s", std::chrono::duration<double>(impl_->config.drain_grace).count()},
                               {"in_flight", impl_->loop->numLive()}});
  impl_->server->shutdown(impl_->config.drain_grace);
  impl_->log.info("drained", {{"cancelled", impl_->loop->numLive()}});
}

}  // namespace tandem::agent
