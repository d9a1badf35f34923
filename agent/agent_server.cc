#include "agent/agent_server.h"

#include <unistd.h>

#include <random>

#include <nlohmann/json.hpp>

#include "agent/agent_metrics.h"
#include "agent/cuda_device_backend.h"
#include "agent/internal_auth.h"
#include "agent/decode_service.h"
#include "agent/discovery.h"
#include "agent/openai_api.h"
#include "agent/openai_http.h"
#include "agent/openai_request.h"
#include "agent/openai_stream.h"
#include "agent/pd_metrics.h"
#include "agent/prefill_service.h"
#include "agent/routing_headers.h"
#include "agent/tensor_parallel_ranks.h"
#include "agent/tool_calls.h"
#include "agent/trace.h"
#include "agent/worker_events_http.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/cuda/kernel_backend.h"
#include "engine/engine_loop.h"
#include "engine/model/files.h"
#include "engine/model/model_fingerprint.h"
#include "engine/model/model_loader.h"
#include "engine/model/rank_group.h"
#include "engine/model/tensor_parallel.h"
#include "engine/model/tokenizer.h"
#include "src/common/log.h"
#include "src/common/strings.h"
#include "src/http/server.h"

namespace tandem::agent {
namespace {

using nlohmann::json;

std::string newId(std::string_view prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(rng()));
  return strCat(prefix, buf);
}

int64_t unixSeconds(WallTime t) {
  return std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count();
}

// --scripted-output's replies: the file's text, split at each line that is
// exactly kScriptedReplySeparator (docs/agent.md).
constexpr std::string_view kScriptedReplySeparator = "\n<|next_reply|>\n";

std::vector<std::string> splitScriptedReplies(std::string_view script) {
  std::vector<std::string> replies;
  for (size_t pos = 0;;) {
    const size_t sep = script.find(kScriptedReplySeparator, pos);
    replies.emplace_back(script.substr(pos, sep == std::string_view::npos ? std::string_view::npos : sep - pos));
    if (sep == std::string_view::npos) return replies;
    pos = sep + kScriptedReplySeparator.size();
  }
}

// The KV transport of roles prefill and decode, and the KV pool it
// allocates (set while the engine is built; null in role both).
struct KvSetup {
  transport::TransportOptions transport;
  std::shared_ptr<transport::UcxRegion> pool;
};

transport::TransportOptions kvTransportOptions(const AgentConfig& config) {
  return {.host = config.kv_host,
          .port = config.kv_port,
          .tls = config.kv_tls,
          .ib_sl = config.ib_sl >= 0 ? std::optional<int>(config.ib_sl) : std::nullopt,
          .ib_traffic_class = config.ib_traffic_class >= 0 ? std::optional<int>(config.ib_traffic_class) : std::nullopt,
          .copy_threads = config.kv_copy_threads};
}

}  // namespace

struct AgentServer::Impl {
  Impl(const AgentConfig& c, const Clock& clk) : config(c), clock(clk), role(agentRoleName(c.role)) {}

  const AgentConfig config;
  const Clock& clock;      // not owned; outlives the server
  const std::string role;  // the `role` label of metrics and traces
  Logger log{"agent"};
  std::shared_ptr<const engine::Tokenizer> tokenizer;
  ApiLimits limits;
  engine::EngineOptions engine_options;  // the engine's, for checks made before a request reaches it
  std::string cpu_simd = "n/a";          // the CPU backend's vector code, for the start-up log
  std::string kv_memory = "host";        // where the KV pool is, for the start-up log
  size_t kv_pool_bytes = 0;              // its size (--num-blocks x the layer blocks of --kv-dtype), likewise
  std::string ucx_cuda_memory = "n/a";   // whether the KV transport's UCX reads device memory (P/D roles)
  metrics::Registry registry;
  std::unique_ptr<AgentMetrics> metrics;
  std::unique_ptr<TraceWriter> trace;
  std::unique_ptr<WorkerEventsPublisher> events;  // before loop: its observer publishes here
  // --tensor-parallel: ranks 1..N-1 (before loop: they exit once the
  // engine's group has closed their links), and the NCCL communicator.
  std::unique_ptr<RankProcesses> ranks;
  std::optional<DeviceAllReduce> nccl;
  std::unique_ptr<engine::EngineLoop> loop;
  std::unique_ptr<PdMetrics> pd_metrics;
  std::unique_ptr<PrefillService> prefill;  // role prefill
  std::unique_ptr<DecodeService> decode;    // role decode
  std::unique_ptr<ServiceDiscovery> discovery;  // role decode with --prefill-service
  std::unique_ptr<ApiKeyGate> api_keys;         // with --api-keys-file
  std::shared_ptr<auth::PoolKeySource> pool_keys;  // --pool-key-dir, or insecure (docs/security.md)
  PublicApiAuth public_auth;                    // what /v1/... requests are checked with
  std::unique_ptr<http::Server> server;
  std::atomic<bool> draining{false};
  bool backend_failure_logged = false;  // loop thread only
  int max_live = 0;
  int kv_port = 0;                 // roles prefill and decode: the bound UCX port
  uint64_t model_fingerprint = 0;  // set while the engine is built

  // One request's progress, shared by the engine callback and the HTTP side.
  struct Call {
    Endpoint endpoint;
    std::string id;
    int64_t created;
    std::string session;
    RouteHint route;                            // role decode: the router's decision, if any (routing_headers.h)
    std::string text;                           // unary: the text so far
    std::optional<OpenAiStreamEncoder> stream;  // streamed: its encoder
    // Chat with tools: which calls the reply may hold and how the model
    // writes them; streamed, what holds back text that may be a call.
    ToolRules tools;
    ToolCallFormat tool_call_format = ToolCallFormat::kNone;
    std::optional<ToolCallStream> tool_stream;
    // The API key's concurrency slot: released when the request finishes,
    // before its last bytes go out, or with the call if it never ran.
    ApiKeyGrant grant;
  };

  // ---- Serving (HTTP threads; engine callbacks on the loop's thread) ----

  // Runs a request here (roles both, prefill) or disaggregated (role decode).
  // The callback sees the typed transfer failure, if one ended the request.
  // Role decode follows the router's decision the call carries, if any.
  uint64_t submit(const Call& call, engine::RequestSpec spec, PdUpdateCallback cb) {
    if (decode) return decode->submit(std::move(spec), std::move(cb), call.route);
    return loop->submit(std::move(spec), [cb = std::move(cb)](const engine::RequestUpdate& u) { cb(u, PdInfo{}); });
  }

  void finished(const Call& call, const engine::RequestUpdate& u, const PdInfo& info) {
    const std::string path(pdPathName(info.path));
    metrics->onFinish(u, path);
    if (trace) {
      trace->write(traceRecord({.request_id = call.id,
                                .model = limits.model_name,
                                .role = role,
                                .worker = config.worker,
                                .path = path,
                                .kv = info.timings ? &*info.timings : nullptr,
                                .prefill_peer = info.prefill_peer,
                                .moved_from_peer = info.moved_from_peer},
                               u, call.session));
    }
    log.debug("request finished", {{"request_id", call.id},
                                   {"finish_reason", engine::finishReasonName(u.finish_reason)},
                                   {"prompt_tokens", u.num_prompt_tokens},
                                   {"output_tokens", u.num_output_tokens}});
  }

  // The calls in a finished reply, if it is valid tool-call output for
  // the call's tools (tool_calls.h); other text is the client's as is.
  std::optional<ToolCallOutput> readToolCalls(const Call& call, const std::string& text) {
    if (call.tools.names.empty()) return std::nullopt;
    std::optional<ToolCallOutput> out = parseToolCalls(call.tool_call_format, text, call.tools);
    if (!out) logUnreadToolCall(call, text);
    return out;
  }

  // A reply shaped like a tool call that is not a valid one goes out as
  // text; the log says why a client got text.
  void logUnreadToolCall(const Call& call, const std::string& text) {
    if (!looksLikeToolCall(call.tool_call_format, text)) return;
    log.debug("reply returned as text: not a valid tool call for the request's tools",
              {{"request_id", call.id}, {"text", text.substr(0, 512)}});
  }

  // OpenAI's tool_calls array of `calls`, each with a new id.
  static json toolCallsJson(const std::vector<ToolCall>& calls) {
    json out = json::array();
    for (const ToolCall& c : calls) out.push_back(toolCallJson(newId("call_"), c.name, c.arguments));
    return out;
  }

  // Why a parsed request cannot be admitted now (draining is checked
  // before parsing), answered before any stream opens so the client gets
  // the HTTP status, not an error event in a 200 stream.
  std::optional<ApiError> refuse(const ParsedRequest& p) {
    if (auto why = engine::capacityRejection(engine_options, static_cast<int>(p.spec.prompt.size()), p.spec)) {
      engine::RequestUpdate u;
      u.finished = true;
      u.finish_reason = engine::FinishReason::kRejected;
      u.reject_reason = engine::RejectReason::kCapacity;
      u.message = std::move(*why);
      return errorForFinish(u);
    }
    if (loop->numLive() >= max_live) {
      return ApiError{.status = 429,
                      .type = "rate_limit_error",
                      .message = strCat("too many requests in flight (", max_live, "); retry later"),
                      .code = "queue_full",
                      .headers = {{"Retry-After", "1"}}};
    }
    return std::nullopt;
  }

  // Whether `req` comes from one of the pool's routers (it bears the pool's
  // token), or this agent is insecure and cannot tell.
  bool fromRouter(const http::Request& req) {
    const InternalCaller c = internalCaller(*pool_keys, req);
    return c == InternalCaller::kInsecure || c == InternalCaller::kAuthenticated;
  }

  // A router's decision from the request's headers (routing_headers.h). A
  // decode agent refuses a path it does not know and a prefill agent it
  // does not have (the router's mistake, or a stale view of the pool);
  // other roles ignore the headers.
  std::variant<RouteHint, ApiError> routeHint(const http::Request& req) {
    RouteHint hint;
    if (!decode) return hint;
    if (auto path = req.header(kRoutePathHeader)) {
      if (*path == "direct") {
        hint.path = PdPath::kDirect;
      } else if (*path == "disagg") {
        hint.path = PdPath::kDisagg;
      } else {
        return ApiError{.message = strCat(kRoutePathHeader, ": expected direct or disagg, got \"", *path, "\""),
                        .param = std::string(kRoutePathHeader)};
      }
    }
    hint.prefill_peer = req.header(kPrefillPeerHeader).value_or("");
    if ((hint.path || !hint.prefill_peer.empty()) && !fromRouter(req)) {
      return ApiError{.status = 403,
                      .message = strCat("the routing headers (", kRoutePathHeader, ", ", kPrefillPeerHeader,
                                        ") are honoured only from this pool's routers, which send the pool's token"),
                      .code = "routing_headers_not_allowed"};
    }
    if (hint.prefill_peer.empty()) return hint;
    absl::Status s = decode->checkPrefillPeer(hint.prefill_peer);
    if (s.ok()) return hint;
    return ApiError{.status = 400, .message = std::string(toStd(s.message())), .code = "unknown_prefill_peer"};
  }

  http::Response generate(Endpoint endpoint, http::Request& req) {
    auto auth = authorizePublic(public_auth, req);
    if (auto* refused = std::get_if<http::Response>(&auth)) return std::move(*refused);
    if (draining.load()) {
      return apiError({.status = 503,
                       .type = "service_unavailable_error",
                       .message = "this agent is draining",
                       .code = "draining"});
    }
    auto body = req.json();
    if (!body.ok()) return apiError({.status = 400, .message = std::string(toStd(body.status().message()))});
    // A chat template sees messages and tools in the client's key order.
    std::optional<nlohmann::ordered_json> ordered;
    if (endpoint == Endpoint::kChat && limits.chat_template) {
      ordered = nlohmann::ordered_json::parse(req.body(), nullptr, /*allow_exceptions=*/false);
    }
    auto parsed = parseRequest(endpoint, *body, *tokenizer, limits, req.header("x-session-id"),
                               ordered ? &*ordered : nullptr);
    if (auto* e = std::get_if<ApiError>(&parsed)) return apiError(*e);
    ParsedRequest p = std::move(std::get<ParsedRequest>(parsed));
    if (auto e = refuse(p)) return apiError(*e);
    auto route = routeHint(req);
    if (auto* e = std::get_if<ApiError>(&route)) return apiError(*e);
    p.spec.deadline = clock.now() + config.request_timeout;
    auto call = std::make_shared<Call>();
    call->endpoint = endpoint;
    call->id = newId(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-");
    call->created = unixSeconds(clock.wallNow());
    call->session = p.spec.session ? p.spec.session->value() : "";
    call->route = std::get<RouteHint>(std::move(route));
    call->grant = std::get<ApiKeyGrant>(std::move(auth));
    call->tools = std::move(p.tools);
    call->tool_call_format = p.tool_call_format;
    if (!p.stream) return unary(call, std::move(p.spec));
    if (!call->tools.names.empty()) call->tool_stream.emplace(call->tool_call_format, call->tools);
    call->stream.emplace(OpenAiStreamEncoder::Options{.endpoint = endpoint,
                                                      .id = call->id,
                                                      .created = call->created,
                                                      .model = limits.model_name,
                                                      .include_usage = p.include_usage});
    return stream(call, std::move(p.spec));
  }

  http::Response unary(std::shared_ptr<Call> call, engine::RequestSpec spec) {
    return http::Response::deferred([this, call, spec = std::move(spec)](std::shared_ptr<http::Responder> r) mutable {
      auto handle = submit(*call, std::move(spec), [this, call, r](const engine::RequestUpdate& u, const PdInfo& info) {
        call->text += u.text_delta;
        if (!u.finished) return;
        finished(*call, u, info);
        call->grant.release();
        if (!isNormalFinish(u.finish_reason)) {
          r->respond(apiError(errorForFinish(u, info.failure)));
          return;
        }
        const Usage usage{u.num_prompt_tokens, u.num_output_tokens};
        if (std::optional<ToolCallOutput> calls = readToolCalls(*call, call->text)) {
          r->respond(http::Response::json(
              200, completionBody(call->endpoint, call->id, call->created, limits.model_name, calls->content,
                                  "tool_calls", usage, toolCallsJson(calls->calls))));
          return;
        }
        r->respond(http::Response::json(200, completionBody(call->endpoint, call->id, call->created, limits.model_name,
                                                            call->text, openAiFinishReason(u.finish_reason), usage)));
      });
      // Deadline or disconnect: end the request in the engine, freeing its blocks.
      r->context().onCancel([this, handle] { loop->cancel(handle); });
    });
  }

  http::Response stream(std::shared_ptr<Call> call, engine::RequestSpec spec) {
    return http::Response::sse([this, call, spec = std::move(spec)](std::shared_ptr<http::SseWriter> w) mutable {
      auto handle = submit(*call, std::move(spec), [this, call, w](const engine::RequestUpdate& u, const PdInfo& info) {
        OpenAiStreamEncoder& encoder = *call->stream;
        // With tools, text that may be a call is held back (tool_calls.h).
        std::string bytes = call->tool_stream ? encoder.text(call->tool_stream->feed(u.text_delta))
                                              : encoder.text(u.text_delta);
        if (u.finished) {
          finished(*call, u, info);
          call->grant.release();
          if (isNormalFinish(u.finish_reason)) {
            bytes += finishStream(*call, u);
          } else if (u.finish_reason != engine::FinishReason::kCancelled || !w->cancelled()) {
            bytes += encoder.fail(errorForFinish(u, info.failure));
          } else {
            bytes += encoder.done();  // the client is gone: nobody reads an error
          }
        }
        if (!bytes.empty()) w->sendRaw(bytes);
        if (u.finished) w->close();
      });
      w->context().onCancel([this, handle] { loop->cancel(handle); });
    });
  }

  // A stream's normal end: the text held back as a possible tool call
  // goes out as calls (finish_reason tool_calls) or as text.
  std::string finishStream(Call& call, const engine::RequestUpdate& u) {
    OpenAiStreamEncoder& encoder = *call.stream;
    const Usage usage{u.num_prompt_tokens, u.num_output_tokens};
    if (!call.tool_stream) return encoder.finish(u.finish_reason, usage);
    std::string rest;
    std::optional<ToolCallOutput> calls = call.tool_stream->finish(&rest);
    if (!calls) {
      logUnreadToolCall(call, rest);
      return encoder.text(rest) + encoder.finish(u.finish_reason, usage);
    }
    std::string bytes = encoder.text(calls->content);
    for (size_t i = 0; i < calls->calls.size(); ++i) {
      const ToolCall& c = calls->calls[i];
      bytes += encoder.toolCall(static_cast<int>(i), newId("call_"), c.name, c.arguments);
    }
    return bytes + encoder.finish("tool_calls", usage);
  }

  // Why this agent cannot serve: its backend failed (a step saw it), or a
  // tensor-parallel rank exited (seen here at once, even while idle).
  std::optional<std::string> failure() const {
    if (auto f = loop->failure()) return f;
    if (ranks) return ranks->exited();
    return std::nullopt;
  }

  http::Routes routes() {
    http::Routes r;
    // A failed backend (a GPU error: every step fails from then on) fails
    // both probes, so the pod leaves the Service and is restarted.
    r.handle("GET", "/healthz", [this](http::Request&) {
      if (auto f = failure()) return http::Response::json(503, json{{"status", "failed"}, {"error", *f}});
      return http::Response::json(200, json{{"status", "ok"}});
    });
    r.handle("GET", "/readyz", [this](http::Request&) {
      if (auto f = failure()) return http::Response::json(503, json{{"status", "failed"}, {"error", *f}});
      if (draining.load()) return http::Response::json(503, json{{"status", "draining"}});
      if (!loop->alive()) return http::Response::json(503, json{{"status", "starting"}});
      return http::Response::json(200, json{{"status", "ready"}});
    });
    r.handle("GET", "/metrics", [this](http::Request&) {
      return http::Response::text(200, metrics::serializeText(registry), std::string(metrics::kContentType));
    });
    r.handle("GET", "/v1/models", [this](http::Request& req) {
      auto auth = authorizePublic(public_auth, req);
      if (auto* refused = std::get_if<http::Response>(&auth)) return std::move(*refused);
      return modelsResponse(limits);
    });
    r.handle("POST", "/v1/completions", [this](http::Request& req) { return generate(Endpoint::kCompletions, req); });
    r.handle("POST", "/v1/chat/completions", [this](http::Request& req) { return generate(Endpoint::kChat, req); });
    r.handle("GET", "/internal/v1/events", [this](http::Request& req) {
      if (auto refused = refuseInternal(*pool_keys, req)) return std::move(*refused);
      return serveWorkerEvents(*events);
    });
    return r;
  }

  // ---- Start-up steps, in the order start() runs them ----

  // The pool key (--pool-key-dir; docs/security.md).
  absl::Status startPoolKeys() {
    if (config.pool_key_dir.empty()) {
      pool_keys = auth::PoolKeySource::insecure();
      log.warn("no --pool-key-dir: the KV channel and /internal/v1/ are not authenticated (docs/security.md)");
      return absl::OkStatus();
    }
    TANDEM_ASSIGN_OR_RETURN(pool_keys, auth::PoolKeySource::open(config.pool_key_dir, clock));
    public_auth.pool_keys = pool_keys.get();
    return absl::OkStatus();
  }

  // The public API's keys (--api-keys-file; docs/api-keys.md).
  absl::Status startApiKeys() {
    if (config.api_keys_file.empty()) return absl::OkStatus();
    TANDEM_ASSIGN_OR_RETURN(api_keys, ApiKeyGate::open({.file = config.api_keys_file,
                                                        .defaults = config.api_key_limits,
                                                        .reload_interval = config.api_keys_reload_interval,
                                                        .clock = &clock},
                                                       registry, {{"pool", config.pool}, {"role", role}}));
    public_auth.api_keys = api_keys.get();
    return absl::OkStatus();
  }

  // Loads the model and tokenizer and builds the engine on --device's
  // backend (first: a device that is not there fails before the weights
  // are read). Roles prefill and decode put the KV pool, or its staging
  // copy when the pool is in device memory, in memory UCX allocated
  // (kv->pool), so a peer on the same machine can read it over shared
  // memory (transport/ucx_transport.h).
  absl::StatusOr<std::unique_ptr<engine::Engine>> buildEngine(KvSetup& kv) {
    // The CPU backend's vector code: TANDEM_CPU_SIMD, or the CPU's best. A bad
    // value is a start-up error here (the backend itself would abort on it).
    TANDEM_ASSIGN_OR_RETURN(const engine::SimdLevel simd, engine::simdLevelFromEnvironment());
    // The other ranks start once this one's device is there; they load
    // their shards while this one loads its own.
    // NCCL's group id is handed out over a Unix socket: in /dev/shm, which
    // a pod with a read-only root filesystem still has writable (the
    // operator mounts one for a group), else /tmp.
    const std::string rendezvous =
        config.tensor_parallel > 1 && config.device == "cuda"
            ? strCat(::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp", "/tandem-tp-", ::getpid(), ".sock")
            : std::string();
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<engine::Backend> backend, makeBackend(simd));
    if (config.tensor_parallel > 1) {
      // A model that does not split is refused before any rank starts.
      TANDEM_ASSIGN_OR_RETURN(const engine::ModelConfig model_config, engine::loadModelConfig(config.model_dir));
      if (absl::Status s = engine::checkShardable(model_config, config.tensor_parallel); !s.ok()) {
        return absl::InvalidArgumentError(strCat("--tensor-parallel ", config.tensor_parallel, ": ", s.message()));
      }
      TANDEM_ASSIGN_OR_RETURN(ranks, RankProcesses::start(config.tensor_parallel, config.command_line, rendezvous));
    }
    if (!rendezvous.empty()) {
      TANDEM_ASSIGN_OR_RETURN(nccl, joinCudaGroup(*backend, {.socket_path = rendezvous,
                                                             .world = config.tensor_parallel,
                                                             .rank = 0,
                                                             .timeout = std::chrono::minutes(2)}));
    }
    // With tensor parallelism, rank 0's shard (read layer by layer).
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<engine::ModelWeights> weights,
                            config.tensor_parallel > 1
                                ? engine::loadModelShard(config.model_dir, 0, config.tensor_parallel)
                                : engine::loadModelWeights(config.model_dir));
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<engine::Tokenizer> tok,
                            engine::loadTokenizer(config.model_dir, weights->config));
    tokenizer = std::move(tok);
    std::shared_ptr<const engine::ModelWeights> shared_weights = std::move(weights);
    engine::EngineOptions options = config.engine;
    if (ranks) {
      TANDEM_ASSIGN_OR_RETURN(options.tensor_parallel, connectRanks(*shared_weights));
    }
    TANDEM_ASSIGN_OR_RETURN(model_fingerprint, fingerprintModel());
    options.block_hash_root = blockHashRoot(model_fingerprint, config.cache_salt);
    if (!config.scripted_output_file.empty()) {  // validateAgentConfig: only with --allow-test-hooks
      TANDEM_ASSIGN_OR_RETURN(const std::string script, engine::readFile(config.scripted_output_file));
      for (const std::string& reply : splitScriptedReplies(script)) {
        options.scripted_replies.push_back(tokenizer->encode(reply));
      }
      log.warn("test hook on: every reply is scripted",
               {{"scripted_output", config.scripted_output_file}, {"replies", options.scripted_replies.size()}});
    }
    auto ucx_region = [&kv](size_t bytes) -> absl::StatusOr<engine::KvMemory> {
      TANDEM_ASSIGN_OR_RETURN(kv.pool, transport::UcxRegion::allocate(bytes, kv.transport));
      return engine::KvMemory{.bytes = kv.pool->bytes(), .keep_alive = kv.pool};
    };
    // The GPU kernels keep the pool in the device's memory (on the CPU
    // executor too, so that the emulator runs what a GPU runs); roles prefill
    // and decode stage it through the UCX region (docs/cuda.md).
    // With tensor parallelism the UCX region is a staging copy holding every
    // rank's KV heads (engine.h, kvRegionLayout), whatever the device.
    auto* kernels = dynamic_cast<engine::KernelBackend*>(backend.get());
    if (kernels != nullptr && isPdRole(config.role) && kvDeviceDirect(kv, ranks != nullptr)) {
      // UCX registers the device pool itself: no staging copy (docs/cuda.md).
      // The CUDA emulator's device memory is host memory, registered as such.
      const bool cuda = config.device == "cuda";
      options.kv_direct = true;
      options.kv_memory = [kernels, &kv, cuda](size_t bytes) -> absl::StatusOr<engine::KvMemory> {
        TANDEM_ASSIGN_OR_RETURN(engine::KvMemory memory, kernels->kvMemory(bytes));
        TANDEM_ASSIGN_OR_RETURN(kv.pool,
                                transport::UcxRegion::map(memory.bytes, cuda, memory.keep_alive, kv.transport));
        memory.keep_alive = kv.pool;  // unregistered first, then the memory freed (UcxRegion::map)
        return memory;
      };
      kv_memory = cuda ? "device, registered with UCX directly (no staging copy)"
                       : "device, registered with UCX directly (no staging copy; the emulator's device memory is "
                         "host memory)";
    } else if (kernels != nullptr) {
      options.kv_memory = [kernels](size_t bytes) { return kernels->kvMemory(bytes); };
      if (isPdRole(config.role)) options.kv_staging = ucx_region;
      kv_memory = isPdRole(config.role) ? "device, staged through host memory" : "device";
    } else if (isPdRole(config.role) && ranks) {
      options.kv_staging = ucx_region;
      kv_memory = "host, staged through host memory";
    } else if (isPdRole(config.role)) {
      options.kv_memory = ucx_region;
    }
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine,
                            engine::Engine::create(options, shared_weights, std::move(backend), tokenizer, clock));
    if (engine->kvStaged() && engine->kv().onDevice() && !ranks) {  // pinning is for speed: without it the copies still run
      const absl::Status& pinned = engine->kvStagingPinned();
      kv_memory = pinned.ok() ? "device, staged through pinned host memory"
                              : strCat("device, staged through host memory (not pinned: ", toStd(pinned.message()), ")");
    }
    if (engine->kvStaged() && ranks) kv_memory += ", every rank's KV heads";
    kv_pool_bytes = engine->kv().bytes().size();
    TANDEM_ASSIGN_OR_RETURN(std::optional<ChatTemplate> chat_template, loadChatTemplate(config.model_dir));
    limits = {.model_name = config.model_name,
              .max_model_len = engine->options().max_model_len,
              .default_max_tokens = config.default_max_tokens,
              .chat_format = tokenizer->chatFormat(),
              .chat_template = chat_template ? std::make_shared<const ChatTemplate>(std::move(*chat_template)) : nullptr,
              .clock = &clock};
    max_live = engine->options().max_num_seqs + engine->options().max_waiting;
    engine_options = engine->options();  // resolved, immutable: read on HTTP threads
    engine_options.kv_memory = nullptr;  // these refer to start()'s KvSetup
    engine_options.kv_staging = nullptr;
    engine_options.tensor_parallel = nullptr;  // the engine thread's alone
    return engine;
  }

  // Whether a P/D role's KV pool in device memory is registered with UCX
  // directly (--kv-device-transport): direct; or auto on a GPU, one process
  // per model, where this UCX reads and writes GPU memory and the node's
  // NICs can (GPUDirect RDMA: nvidia-peermem loaded, which UCX's InfiniBand
  // transport checks too; a UCX lists CUDA memory without it, and a peer on
  // another node could then not reach the pool). Otherwise staged, and the
  // start-up log says why.
  bool kvDeviceDirect(const KvSetup& kv, bool tensor_parallel) {
    if (config.kv_device_transport == "direct") return true;
    if (config.kv_device_transport == "staged" || config.device != "cuda") return false;
    std::string why;
    if (tensor_parallel) {
      why = "--tensor-parallel: peers read the staging copy of every rank's KV heads";
    } else if (!transport::UcxRegion::cudaMemorySupported(kv.transport)) {
      why = "this UCX cannot register GPU memory (no CUDA support, e.g. Debian's)";
    } else if (!gpuDirectRdmaOnThisNode()) {
      why = "no GPUDirect RDMA on this node (nvidia-peermem is not loaded): a NIC could not reach GPU memory";
    }
    if (why.empty()) return true;
    log.info("--kv-device-transport auto: the KV pool is staged through host memory", {{"why", why}});
    return false;
  }

  static bool gpuDirectRdmaOnThisNode() {
    return ::access("/sys/kernel/mm/memory_peers/nv_mem/version", F_OK) == 0 ||
           ::access("/sys/module/nvidia_peermem/version", F_OK) == 0;
  }

  // The engine's backend for --device. The GPU kernels run on the CPU
  // executor (cuda-emulator) or, in a build with the CUDA backend
  // (TANDEM_ENABLE_CUDA), on a GPU (cuda); a build without one, or a machine
  // without a usable GPU, stops start-up saying which (cuda_device_backend.h).
  absl::StatusOr<std::unique_ptr<engine::Backend>> makeBackend(engine::SimdLevel simd) {
    const int world = config.tensor_parallel;
    if (config.device == "cuda") {
      // No GPU at all is the backend's error (it says what the runtime said).
      auto backend = makeRankBackend(config.device, simd, 0, world, config.gemmDtype());
      const int gpus = visibleCudaDevices();
      if (backend.ok() && world > gpus) {
        return absl::FailedPreconditionError(strCat("--tensor-parallel ", world, " needs ", world,
                                                    " GPUs (one per rank); this process sees ", gpus));
      }
      if (backend.ok() && gpus > world) {
        log.warn("--device cuda: more GPUs are visible than --tensor-parallel uses; the others stay idle",
                 {{"visible_gpus", gpus}, {"tensor_parallel", world}});
      }
      return backend;
    }
    if (config.device == "cuda-emulator") {
      log.warn("--device cuda-emulator: the GPU kernels run on the CPU executor, far slower than --device cpu",
               {{"executor_shuffle", gpu::CpuExecutor::optionsFromEnvironment().shuffle}});
    }
    cpu_simd = std::string(engine::simdLevelName(engine::resolveSimdLevel(simd)));  // the backend's or its GEMM's
    return makeRankBackend(config.device, simd, 0, world, config.gemmDtype());
  }

  // Rank 0's group: every other rank's Hello, checked against this rank's
  // cache (its shard's KV heads, the pool's blocks). A rank that died
  // first is named with its exit status.
  absl::StatusOr<std::shared_ptr<engine::RankGroupLeader>> connectRanks(const engine::ModelWeights& shard) {
    engine::RankGroupLeader::Options o{.links = ranks->takeLinks(),
                                       .layout = engine::kvLayoutFor(shard.config, config.engine.num_blocks,
                                                                     config.engine.block_size, config.engine.kv_dtype),
                                       .socket_all_reduce = !nccl,
                                       .all_reduce = nccl ? nccl->all_reduce : nullptr,
                                       .external_status = nccl ? nccl->status : nullptr};
    absl::StatusOr<std::unique_ptr<engine::RankGroupLeader>> group = engine::RankGroupLeader::connect(std::move(o));
    if (!group.ok()) {
      if (auto exited = ranks->exited(std::chrono::seconds(2))) {
        return absl::Status(group.status().code(), strCat(group.status().message(), " (", *exited, ")"));
      }
      return group.status();
    }
    log.info("tensor-parallel group ready",
             {{"world", config.tensor_parallel},
              {"all_reduce", nccl ? "nccl" : "link"},
              {"kv_heads_per_rank", shard.config.num_kv_heads}});
    return std::shared_ptr<engine::RankGroupLeader>(std::move(*group));
  }

  // The operator's pinned fingerprint, or the model files' (read once: the
  // cost is reading the weights again, logged); with --dtype bfloat16 made
  // its own (engine::bf16Fingerprint: other KV than float32's).
  absl::StatusOr<uint64_t> fingerprintModel() {
    uint64_t f = 0;
    if (config.model_fingerprint) {
      f = *config.model_fingerprint;
    } else {
      const MonoTime start = clock.now();
      TANDEM_ASSIGN_OR_RETURN(f, engine::modelFingerprint(config.model_dir));
      log.info("model fingerprint", {{"fingerprint", engine::fingerprintHex(f)},
                                     {"seconds", std::chrono::duration<double>(clock.now() - start).count()}});
    }
    if (config.gemmDtype() == engine::GemmDtype::kBfloat16) {
      const uint64_t bf16 = engine::bf16Fingerprint(f);
      log.info("model fingerprint with bf16 projections (--dtype bfloat16)",
               {{"checkpoint", engine::fingerprintHex(f)}, {"fingerprint", engine::fingerprintHex(bf16)}});
      return bf16;
    }
    return f;
  }

  // The agent's and the transport's metrics (with the engine's initial
  // KV gauges) and the trace file, then the engine's thread, which keeps
  // the gauges current after every step.
  absl::Status startEngineLoop(std::unique_ptr<engine::Engine> engine) {
    metrics = std::make_unique<AgentMetrics>(registry, config.pool, role);
    metrics->setTensorParallelRanks(config.tensor_parallel);
    if (!config.trace_file.empty()) {
      TANDEM_ASSIGN_OR_RETURN(trace, TraceWriter::open(config.trace_file));
    }
    engine::StepStats initial;
    initial.num_total_blocks = engine->options().num_blocks;
    initial.num_free_blocks = engine->numAvailableBlocks();
    metrics->onStep(initial);
    pd_metrics = std::make_unique<PdMetrics>(registry, metrics::Labels{{"pool", config.pool}, {"role", role}});
    events = WorkerEventsPublisher::start(workerEventsOptions(config, *engine, clock), registry,
                                          {{"pool", config.pool}, {"role", role}});
    loop =
        std::make_unique<engine::EngineLoop>(std::move(engine), [this](const engine::StepStats& s, engine::Engine& e) {
          metrics->onStep(s);
          pd_metrics->leases.set(e.numLeases());
          events->onEngineStep(e.drainRoutableChanges(), s);
          if (!backend_failure_logged && !e.backendStatus().ok()) {
            backend_failure_logged = true;
            log.error("the backend failed: every step fails from now on; /healthz and /readyz answer 503",
                      {{"error", std::string(toStd(e.backendStatus().message()))}});
          }
        });
    return absl::OkStatus();
  }

  // Roles prefill and decode: the P/D service on the KV port (pd.md).
  absl::Status startPdService(const KvSetup& kv, transport::KvTransportFactory kv_transport_factory) {
    if (!isPdRole(config.role)) return absl::OkStatus();
    if (kv.pool) ucx_cuda_memory = kv.pool->cudaMemory() ? "yes" : "no";
    PdOptions pd;
    pd.transport = kv.transport;
    pd.transport.pool = kv.pool;
    pd.transport.clock = &clock;
    pd.lease_ttl = std::chrono::duration_cast<std::chrono::milliseconds>(config.lease_ttl);
    pd.prefill_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(config.prefill_timeout);
    pd.checksum_rate = config.checksum_rate;
    pd.peer_health.missed_heartbeats = config.kv_heartbeat_misses;
    pd.peer_health.heartbeat_interval =
        std::chrono::duration_cast<std::chrono::milliseconds>(config.kv_heartbeat_interval);
    pd.peer_health.idle_heartbeat_interval =
        std::chrono::duration_cast<std::chrono::milliseconds>(config.kv_heartbeat_idle_interval);
    pd.prefill_deadline = {
        .floor = std::chrono::duration_cast<std::chrono::milliseconds>(config.prefill_deadline_floor),
        .slack = config.prefill_deadline_slack,
        .assumed_rate = config.prefill_assumed_rate};
    pd.direct_max_suffix_tokens = config.direct_max_suffix_tokens;
    pd.model_fingerprint = model_fingerprint;
    pd.pool_keys = pool_keys;
    const PdEnv env{
        .loop = *loop, .metrics = *pd_metrics, .clock = clock, .transport = std::move(kv_transport_factory)};
    if (config.role == AgentRole::kPrefill) {
      // Prefills for decode agents count like any request here (path disagg).
      TANDEM_ASSIGN_OR_RETURN(prefill, PrefillService::start(env, pd, [this](const engine::RequestUpdate& u) {
                                finished(Call{.id = strCat("prefill-", u.id.value())}, u,
                                         PdInfo{.path = PdPath::kDisagg});
                              }));
      kv_port = prefill->port();
    } else {
      if (config.prefill_service.empty()) {
        std::vector<PeerAddress> peers;  // validateAgentConfig requires one for role decode
        for (const HostPort& p : config.prefill_peers) peers.push_back({.host = p.host, .port = p.port});
        pd.prefill_peers = std::make_shared<StaticPeerDirectory>(std::move(peers));
      } else {
        // The prefill agents' KV listeners from their Service (port `kv`).
        auto directory = std::make_shared<DynamicPeerDirectory>();
        TANDEM_ASSIGN_OR_RETURN(discovery, ServiceDiscovery::connect(config.discovery_namespace));
        TANDEM_RETURN_IF_ERROR(
            discovery->follow(config.prefill_service, "kv", [directory](const std::vector<HostPort>& ready) {
              std::vector<PeerAddress> peers;
              for (const HostPort& p : ready) peers.push_back({.host = p.host, .port = p.port});
              directory->set(std::move(peers));
            }));
        pd.prefill_peers = directory;
      }
      TANDEM_ASSIGN_OR_RETURN(decode, DecodeService::start(env, pd));
      kv_port = decode->port();
    }
    return absl::OkStatus();
  }

  // The HTTP listener, serving routes() from here on.
  absl::Status startHttp() {
    TANDEM_ASSIGN_OR_RETURN(http::ServerOptions server_options, httpServerOptions(config, clock));
    TANDEM_ASSIGN_OR_RETURN(server, http::Server::start(std::move(server_options), routes()));
    log.info("serving", {{"address", strCat(config.host, ":", server->port())},
                         {"kv_port", kv_port},
                         {"model", config.model_name},
                         {"role", role},
                         {"pool", config.pool},
                         {"kv_blocks", config.engine.num_blocks},
                         {"kv_cache_bytes", config.kv_cache_bytes},
                         {"model_fingerprint", engine::fingerprintHex(model_fingerprint)},
                         {"cpu_simd", cpu_simd},
                         {"device", config.device},
                         {"dtype", config.dtype},
                         {"kv_dtype", engine::kvDtypeName(config.engine.kv_dtype)},
                         {"kv_pool_bytes", kv_pool_bytes},
                         {"tensor_parallel", config.tensor_parallel},
                         {"kv_memory", kv_memory},
                         {"ucx_cuda_memory", ucx_cuda_memory},
                         {"api_keys", api_keys ? "on" : "off"}});
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<AgentServer>> AgentServer::start(const AgentConfig& config, const Clock& clock,
                                                                transport::KvTransportFactory kv_transport_factory) {
  TANDEM_RETURN_IF_ERROR(validateAgentConfig(config));
  AgentConfig resolved = config;
  TANDEM_RETURN_IF_ERROR(resolveKvCacheBytes(resolved));  // --kv-cache-bytes: the blocks that fit
  auto impl = std::make_unique<Impl>(resolved, clock);
  TANDEM_RETURN_IF_ERROR(impl->startPoolKeys());
  TANDEM_RETURN_IF_ERROR(impl->startApiKeys());  // first: a bad keys file fails before the model loads
  KvSetup kv{.transport = kvTransportOptions(config)};
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine, impl->buildEngine(kv));
  TANDEM_RETURN_IF_ERROR(impl->startEngineLoop(std::move(engine)));
  TANDEM_RETURN_IF_ERROR(impl->startPdService(kv, std::move(kv_transport_factory)));
  // Routers name a prefill agent to D by this address (D's --prefill-peers
  // spell it the same way): the listener's, as configured.
  if (impl->kv_port > 0) {
    impl->events->setKvAddress(strCat(kv.transport.host.empty() ? config.host : kv.transport.host, ":", impl->kv_port));
  }
  TANDEM_RETURN_IF_ERROR(impl->startHttp());
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
  impl_->events->setDraining(true);
  impl_->log.info("draining", {{"grace_s", std::chrono::duration<double>(impl_->config.drain_grace).count()},
                               {"in_flight", impl_->loop->numLive()}});
  impl_->server->shutdown(impl_->config.drain_grace);
  impl_->log.info("drained", {{"cancelled", impl_->loop->numLive()}});
}

}  // namespace tandem::agent
