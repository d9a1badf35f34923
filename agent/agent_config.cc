#include "agent/agent_config.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <functional>
#include <utility>
#include <vector>

#include "agent/config_option.h"
#include "engine/model/llama.h"
#include "engine/model/model_fingerprint.h"
#include "engine/model/model_loader.h"
#include "engine/model/tensor_parallel.h"
#include "src/common/config.h"
#include "src/common/strings.h"

namespace tandem::agent {
namespace {

template <typename T>
Option engineNumber(const char* flag, const char* key, const char* help, T engine::EngineOptions::*member, double min,
                    double max) {
  return nestedNumber(flag, "engine", key, help, &AgentConfig::engine, member, min, max);
}

absl::Status parseListen(AgentConfig& c, std::string_view v) {
  size_t colon = v.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(strCat("--listen: expected HOST:PORT, got \"", v, "\""));
  }
  int port = 0;
  TANDEM_RETURN_IF_ERROR(parseNumber("listen", v.substr(colon + 1), &port, 0, 65535));
  c.host = std::string(v.substr(0, colon));
  c.port = port;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HostPort> parseHostPort(std::string_view what, std::string_view v) {
  AgentConfig tmp;
  if (!parseListen(tmp, v).ok())
    return absl::InvalidArgumentError(strCat(what, ": expected HOST:PORT, got \"", v, "\""));
  return HostPort{.host = tmp.host, .port = tmp.port};
}

std::string_view agentRoleName(AgentRole role) {
  switch (role) {
    case AgentRole::kBoth:
      return "both";
    case AgentRole::kPrefill:
      return "prefill";
    case AgentRole::kDecode:
      return "decode";
    case AgentRole::kRouter:
      return "router";
  }
  return "both";
}

namespace {

constexpr AgentRole kRoles[] = {AgentRole::kBoth, AgentRole::kPrefill, AgentRole::kDecode, AgentRole::kRouter};

// --role / role: one of kRoles' names, kept as the enum.
Option roleOption() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (AgentRole r : kRoles) n.emplace_back(agentRoleName(r));
    return n;
  }();
  auto set = [](AgentConfig& c, std::string_view v) {
    for (AgentRole r : kRoles) {
      if (agentRoleName(r) == v) c.role = r;
    }
  };
  return {"role",
          "",
          "role",
          "data-plane role: both, prefill, decode or router",
          [](const AgentConfig& c) { return std::string(agentRoleName(c.role)); },
          [set](AgentConfig& c, std::string_view v) -> absl::Status {
            TANDEM_RETURN_IF_ERROR(checkOneOf("role", v, names));
            set(c, v);
            return absl::OkStatus();
          },
          [set](AgentConfig& c, ConfigMap& m) {
            std::string v;
            if (m.field("role", &v, {.one_of = names})) set(c, v);
          }};
}

absl::Status onePeerError(std::string_view what, std::string_view v) {
  return absl::InvalidArgumentError(
      strCat(what, ": expected one HOST:PORT (several go to --prefill-peers), got \"", v, "\""));
}

// --prefill-peers / kv.prefill_peers (a YAML list or a comma-separated
// string), and its one-peer alias --prefill-peer / kv.prefill_peer.
Option prefillPeersOption(bool alias) {
  const char* flag = alias ? "prefill-peer" : "prefill-peers";
  const char* key = alias ? "prefill_peer" : "prefill_peers";
  return {flag,
          "kv",
          key,
          alias ? "decode role: one prefill agent's KV address HOST:PORT (the one-element form of --prefill-peers)"
                : "decode role: the prefill agents' KV addresses HOST:PORT[,HOST:PORT...]; a request may name one "
                  "(x-tandem-prefill-peer)",
          [](const AgentConfig& c) {
            std::string out;
            for (const HostPort& p : c.prefill_peers) out += strCat(out.empty() ? "" : ",", p.host, ":", p.port);
            return out;
          },
          [=](AgentConfig& c, std::string_view v) -> absl::Status {
            const std::string what = strCat("--", flag);
            TANDEM_ASSIGN_OR_RETURN(std::vector<HostPort> peers, parsePeerList(what, v));
            if (alias && peers.size() != 1) return onePeerError(what, v);
            c.prefill_peers = std::move(peers);
            return absl::OkStatus();
          },
          [=](AgentConfig& c, ConfigMap& m) {
            std::string text;
            if (alias) {
              if (!m.field(key, &text)) return;
            } else {
              std::vector<std::string> list;
              if (!m.field(key, &list)) return;
              for (const std::string& e : list) text += (text.empty() ? "" : ",") + e;
            }
            auto peers = parsePeerList(key, text);
            if (peers.ok() && alias && peers->size() != 1) peers = onePeerError(key, text);
            if (peers.ok()) {
              c.prefill_peers = std::move(*peers);
            } else {
              // The error without its "key: " prefix: ConfigMap names the key.
              m.fail(key, toStd(peers.status().message()).substr(std::string_view(key).size() + 2));
            }
          }};
}

// engine.kv_dtype (EngineOptions::kv_dtype): float32 | bfloat16.
Option kvDtypeOption() {
  static const std::vector<std::string> kNames = {"float32", "bfloat16"};
  auto set = [](AgentConfig& c, std::string_view v) {
    c.engine.kv_dtype = v == "bfloat16" ? engine::KvDtype::kBfloat16 : engine::KvDtype::kFloat32;
  };
  return {"kv-dtype",
          "engine",
          "kv_dtype",
          "what the KV cache stores: float32, or bfloat16 (half the memory per block, so twice the blocks in the "
          "same memory; K and V rounded to bf16 as they are written; P and D must agree; docs/cuda.md)",
          [](const AgentConfig& c) { return std::string(engine::kvDtypeName(c.engine.kv_dtype)); },
          [set](AgentConfig& c, std::string_view v) -> absl::Status {
            TANDEM_RETURN_IF_ERROR(checkOneOf("kv-dtype", v, kNames));
            set(c, v);
            return absl::OkStatus();
          },
          [set](AgentConfig& c, ConfigMap& m) {
            std::string v;
            if (m.field("kv_dtype", &v, {.one_of = kNames})) set(c, v);
          }};
}

// --model-fingerprint / model.fingerprint: hex, pinned by the operator.
Option modelFingerprintOption() {
  return {"model-fingerprint",
          "model",
          "fingerprint",
          "the model's 64-bit fingerprint in hex, pinned from a model revision (empty: computed from the files)",
          [](const AgentConfig& c) {
            return c.model_fingerprint ? engine::fingerprintHex(*c.model_fingerprint) : std::string();
          },
          [](AgentConfig& c, std::string_view v) -> absl::Status {
            c.model_fingerprint.reset();  // empty: computed
            if (!v.empty()) {
              TANDEM_ASSIGN_OR_RETURN(c.model_fingerprint, engine::parseModelFingerprint("--model-fingerprint", v));
            }
            return absl::OkStatus();
          },
          [](AgentConfig& c, ConfigMap& m) {
            std::string v;
            if (!m.field("fingerprint", &v) || v.empty()) return;  // empty: computed
            auto f = engine::parseModelFingerprint("fingerprint", v);
            if (f.ok())
              c.model_fingerprint = *f;
            else
              m.fail("fingerprint", strCat("expected 1 to 16 hex digits, got \"", v, "\""));
          }};
}

// Role, names and the HTTP listener; the model.
void addServerOptions(std::vector<Option>& o) {
  o.push_back(roleOption());
  o.push_back(
      stringOption("pool", "", "pool", "InferencePool name (the `pool` label of every metric)", &AgentConfig::pool));
  o.push_back(
      stringOption("worker", "", "worker", "this agent's name in traces (default: host name)", &AgentConfig::worker));
  o.push_back({"listen", "", "listen", "HTTP address HOST:PORT (OpenAI API, /metrics, health); port 0 picks one",
               [](const AgentConfig& c) { return strCat(c.host, ":", c.port); }, parseListen,
               [](AgentConfig& c, ConfigMap& m) {
                 std::string v;
                 if (m.field("listen", &v)) {
                   absl::Status s = parseListen(c, v);
                   if (!s.ok()) m.fail("listen", toStd(s.message()).substr(10));
                 }
               }});
  o.push_back(stringOption(
      "port-file", "", "port_file",
      "once serving, write the bound HTTP port (line 1) and KV port (line 2, roles prefill and decode) here",
      &AgentConfig::port_file));
  o.push_back(stringOption("model-dir", "model", "dir",
                           "model directory (config.json, model.safetensors, tokenizer) [required]",
                           &AgentConfig::model_dir));
  o.push_back(stringOption("model-name", "model", "name", "model id clients send (default: the directory's name)",
                           &AgentConfig::model_name));
  o.push_back(modelFingerprintOption());
  o.push_back(stringOption("cache-salt", "model", "cache_salt",
                           "tenant salt of the KV block hashes: agents of another salt never share KV (empty: none)",
                           &AgentConfig::cache_salt));
  o.push_back(stringOption("device", "engine", "device",
                           "compute device: cpu, cuda (a GPU) or cuda-emulator (the GPU kernels run on the CPU, "
                           "slowly: for checking them end to end; docs/cuda.md)",
                           &AgentConfig::device, {"cpu", "cuda", "cuda-emulator"}));
  o.push_back(stringOption("dtype", "engine", "dtype",
                           "what the model's projections read: float32, or bfloat16 (weights kept in bf16, half the "
                           "GPU memory; each projection's input rounded to bf16; fp32 accumulation, residual stream "
                           "and attention; docs/cuda.md)",
                           &AgentConfig::dtype, {"float32", "bfloat16"}));
  o.push_back(kvDtypeOption());
  o.push_back({"kv-cache-bytes", "engine", "kv_cache_bytes",
               "size the KV pool by memory instead of --num-blocks: as many blocks as fit in this many bytes per "
               "process (per GPU), e.g. 40Gi, 512MiB, 2G; 0: --num-blocks decides",
               [](const AgentConfig& c) { return std::to_string(c.kv_cache_bytes); },
               [](AgentConfig& c, std::string_view v) -> absl::Status {
                 const std::optional<int64_t> bytes = parseByteSize(v);
                 if (!bytes) {
                   return absl::InvalidArgumentError(
                       strCat("--kv-cache-bytes: expected a size such as 40Gi, 512MiB or 2G, got \"", v, "\""));
                 }
                 c.kv_cache_bytes = *bytes;
                 return absl::OkStatus();
               },
               [](AgentConfig& c, ConfigMap& m) {
                 std::string v;
                 if (!m.field("kv_cache_bytes", &v)) return;
                 if (const std::optional<int64_t> bytes = parseByteSize(v)) {
                   c.kv_cache_bytes = *bytes;
                 } else {
                   m.fail("kv_cache_bytes", strCat("expected a size such as 40Gi, 512MiB or 2G, got \"", v, "\""));
                 }
               }});
  o.push_back(numberOption("tensor-parallel", "engine", "tensor_parallel",
                           "split the model across this many ranks, one process each (one GPU each with --device "
                           "cuda; docs/cuda.md)",
                           &AgentConfig::tensor_parallel, 1, 64));
}

// engine: the EngineOptions the agent passes through.
void addEngineOptions(std::vector<Option>& o) {
  o.push_back(engineNumber("num-blocks", "num_blocks", "KV blocks in the pool", &engine::EngineOptions::num_blocks, 1,
                           1 << 24));
  o.push_back(
      engineNumber("block-size", "block_size", "tokens per KV block", &engine::EngineOptions::block_size, 1, 1024));
  o.push_back(engineNumber("max-batched-tokens", "max_batched_tokens", "token budget of one engine step",
                           &engine::EngineOptions::max_num_batched_tokens, 1, 1 << 20));
  o.push_back(engineNumber("max-num-seqs", "max_num_seqs", "sequences running at once",
                           &engine::EngineOptions::max_num_seqs, 1, 1 << 16));
  o.push_back(engineNumber("max-waiting", "max_waiting", "waiting-queue bound; beyond it requests get 429",
                           &engine::EngineOptions::max_waiting, 0, 1 << 24));
  o.push_back(engineNumber("max-model-len", "max_model_len", "context length in tokens (0: the model's)",
                           &engine::EngineOptions::max_model_len, 0, 1 << 24));
  o.push_back(engineNumber("expected-output-tokens", "expected_output_tokens",
                           "output tokens reserved at admission (0: max_tokens)",
                           &engine::EngineOptions::expected_output_tokens, 0, 1 << 24));
  o.push_back(engineNumber("session-low-watermark-blocks", "session_low_watermark_blocks",
                           "evict resident sessions to keep this many blocks available",
                           &engine::EngineOptions::session_low_watermark_blocks, 0, 1 << 24));
  o.push_back(engineNumber("seed", "seed", "seed for requests without one (0: random)", &engine::EngineOptions::seed, 0,
                           1.8e19));
  o.push_back(nestedBool("prefix-cache", "engine", "prefix_cache", "reuse cached prompt prefixes (true|false)",
                         &AgentConfig::engine, &engine::EngineOptions::enable_prefix_cache));
}

// limits: and the drain.
void addLimitOptions(std::vector<Option>& o) {
  o.push_back(numberOption("default-max-tokens", "limits", "default_max_tokens",
                           "max_tokens of chat requests that give none", &AgentConfig::default_max_tokens, 1, 1 << 24));
  o.push_back(numberOption("max-body-bytes", "limits", "max_body_bytes", "largest request body (413 beyond)",
                           &AgentConfig::max_body_bytes, 1024, 1 << 30));
  o.push_back(durationOption("request-timeout", "limits", "request_timeout",
                             "deadline of one request, queueing included", &AgentConfig::request_timeout));
  o.push_back(durationOption("sse-keepalive", "limits", "sse_keepalive",
                             "idle streams get a keepalive comment this often; a client that hung up is noticed (and "
                             "its request cancelled) at the next one",
                             &AgentConfig::sse_keepalive));
  o.push_back(durationOption("header-timeout", "limits", "header_timeout",
                             "a connection whose request headers are not complete this long after its first byte "
                             "(or after it opened) is closed: slow clients cannot hold connections",
                             &AgentConfig::header_timeout));
  o.push_back(durationOption("body-timeout", "limits", "body_timeout",
                             "a request body not complete this long after its headers gets 408 and is closed",
                             &AgentConfig::body_timeout));
  o.push_back(durationOption("idle-timeout", "limits", "idle_timeout",
                             "a kept-alive connection with no request under way is closed after this",
                             &AgentConfig::idle_timeout));
  o.push_back(numberOption("max-connections", "limits", "max_connections",
                           "open HTTP connections at most; more are closed as soon as accepted",
                           &AgentConfig::max_connections, 1, 1 << 20));
  o.push_back(stringOption("http-server", "", "http_server", "HTTP server library: beast or cpprest (docs/http.md)",
                           &AgentConfig::http_server, {"beast", "cpprest"}));
  o.push_back(durationOption("drain-grace", "", "drain_grace", "on SIGTERM, how long in-flight requests may finish",
                             &AgentConfig::drain_grace));
}

// api_keys: the public API's keys and per-key limits (docs/api-keys.md).
void addApiKeyOptions(std::vector<Option>& o) {
  o.push_back(stringOption("api-keys-file", "api_keys", "file",
                           "YAML file of the SHA-256 of the keys /v1/... requests must bear (Authorization: Bearer), "
                           "re-read when it changes; empty: no keys needed",
                           &AgentConfig::api_keys_file));
  o.push_back(durationOption("api-keys-reload-interval", "api_keys", "reload_interval",
                             "how often the API keys file is re-read (a key removed from it is refused from then on)",
                             &AgentConfig::api_keys_reload_interval));
  o.push_back(nestedNumber("api-key-requests-per-second", "api_keys", "requests_per_second",
                           "requests per second of a key that sets no requests_per_second (0: unlimited)",
                           &AgentConfig::api_key_limits, &ApiKeyLimits::requests_per_second, 0, 1e6));
  o.push_back(nestedNumber("api-key-burst", "api_keys", "burst",
                           "requests a key that sets no burst may make at once above its rate (0: "
                           "max(1, requests per second))",
                           &AgentConfig::api_key_limits, &ApiKeyLimits::burst, 0, 1e6));
  o.push_back(nestedNumber("api-key-max-concurrent", "api_keys", "max_concurrent",
                           "requests in flight (open streams included) of a key that sets no max_concurrent (0: "
                           "unlimited)",
                           &AgentConfig::api_key_limits, &ApiKeyLimits::max_concurrent, 0, 1e6));
}

// auth: the pool key (docs/security.md).
void addAuthOptions(std::vector<Option>& o) {
  o.push_back(stringOption(
      "pool-key-dir", "auth", "pool_key_dir",
      "directory of the pool's key (files key, previous-key, next-key: the pool's mounted Secret), re-read as it "
      "changes; authenticates the KV channel, /internal/v1/ and routed requests. Empty: insecure (only agents "
      "without a key work with this one)",
      &AgentConfig::pool_key_dir));
}

// events: the worker-state stream routers subscribe to (docs/routing.md).
void addEventOptions(std::vector<Option>& o) {
  o.push_back(durationOption("events-load-interval", "events", "load_interval",
                             "worker-state stream: load deltas at most this often (0: every change)",
                             &AgentConfig::events_load_interval));
  o.push_back(durationOption("events-heartbeat", "events", "heartbeat",
                             "worker-state stream: an idle stream gets a heartbeat this often (0: none)",
                             &AgentConfig::events_heartbeat));
  o.push_back(numberOption("events-buffer", "events", "buffer",
                           "worker-state stream: deltas kept for slow subscribers; one further behind is closed",
                           &AgentConfig::events_buffer, 1, 1 << 24));
}

// kv: the P/D transport (roles prefill and decode).
void addKvOptions(std::vector<Option>& o) {
  o.push_back({"kv-listen", "kv", "listen", "UCX KV listener HOST:PORT (prefill and decode roles); port 0 picks one",
               [](const AgentConfig& c) { return strCat(c.kv_host.empty() ? c.host : c.kv_host, ":", c.kv_port); },
               [](AgentConfig& c, std::string_view v) -> absl::Status {
                 AgentConfig tmp;
                 absl::Status s = parseListen(tmp, v);
                 if (!s.ok()) return absl::InvalidArgumentError(strCat("--kv-listen", toStd(s.message()).substr(8)));
                 c.kv_host = tmp.host;
                 c.kv_port = tmp.port;
                 return absl::OkStatus();
               },
               [](AgentConfig& c, ConfigMap& m) {
                 std::string v;
                 if (m.field("listen", &v)) {
                   AgentConfig tmp;
                   absl::Status s = parseListen(tmp, v);
                   if (!s.ok()) m.fail("listen", "expected HOST:PORT");
                   c.kv_host = tmp.host;
                   c.kv_port = tmp.port;
                 }
               }});
  o.push_back(prefillPeersOption(/*alias=*/false));
  o.push_back(prefillPeersOption(/*alias=*/true));
  o.push_back(stringOption("decode-service", "discovery", "decode_service",
                           "router: find the decode agents from this headless Service's EndpointSlices (port "
                           "`http`) instead of --decode-workers",
                           &AgentConfig::decode_service));
  o.push_back(stringOption("prefill-service", "discovery", "prefill_service",
                           "router and decode: find the prefill agents from this headless Service's EndpointSlices "
                           "(port `http` for the router, `kv` for decode) instead of --prefill-workers / "
                           "--prefill-peers",
                           &AgentConfig::prefill_service));
  o.push_back(stringOption("discovery-namespace", "discovery", "namespace",
                           "the namespace of --decode-service / --prefill-service; default: the pod's own",
                           &AgentConfig::discovery_namespace));
  o.push_back(stringOption("kv-tls", "kv", "tls",
                           "UCX transports for KV (UCX_TLS), e.g. tcp or posix,cma,tcp; empty: UCX's choice",
                           &AgentConfig::kv_tls));
  o.push_back(numberOption("ib-sl", "kv", "ib_sl", "InfiniBand service level of KV traffic (UCX_IB_SL); -1: unset",
                           &AgentConfig::ib_sl, -1, 15));
  o.push_back(numberOption("ib-traffic-class", "kv", "ib_traffic_class",
                           "RoCE traffic class of KV traffic (UCX_IB_TRAFFIC_CLASS); -1: unset",
                           &AgentConfig::ib_traffic_class, -1, 255));
  o.push_back(
      numberOption("kv-copy-threads", "kv", "copy_threads",
                   "decode over shared memory: threads that copy a pull of 4 MiB or more (the transport's and helpers)",
                   &AgentConfig::kv_copy_threads, 1, 64));
  o.push_back(stringOption("kv-device-transport", "kv", "device_transport",
                           "prefill and decode with a KV pool in GPU memory: direct (UCX registers the pool: no "
                           "staging copy, GPUDirect RDMA; needs a UCX with CUDA support; not yet run on a GPU), "
                           "staged (through pinned host memory) or auto (direct where this UCX has CUDA support "
                           "and the node GPUDirect RDMA, else staged; docs/cuda.md)",
                           &AgentConfig::kv_device_transport, {"auto", "staged", "direct"}));
  o.push_back(durationOption("lease-ttl", "kv", "lease_ttl",
                             "prefill: how long computed KV stays pinned for the decode agent",
                             &AgentConfig::lease_ttl));
  o.push_back(durationOption("prefill-timeout", "kv", "prefill_timeout",
                             "decode: deadline for the prefill agent to deliver the KV",
                             &AgentConfig::prefill_timeout));
  o.push_back(durationOption("kv-heartbeat-interval", "kv", "heartbeat_interval",
                             "decode: heartbeat to a prefill agent this often while it has work or is suspect "
                             "(at least 10ms)",
                             &AgentConfig::kv_heartbeat_interval));
  o.push_back(durationOption("kv-heartbeat-idle-interval", "kv", "heartbeat_idle_interval",
                             "decode: heartbeat to an idle prefill agent this often (at least 10ms)",
                             &AgentConfig::kv_heartbeat_idle_interval));
  o.push_back(numberOption("kv-heartbeat-misses", "kv", "heartbeat_misses",
                           "decode: heartbeats unanswered in a row that make a prefill agent suspect: it gets no new "
                           "work and what it has not accepted moves",
                           &AgentConfig::kv_heartbeat_misses, 1, 1000));
  o.push_back(durationOption("prefill-deadline-floor", "kv", "prefill_deadline_floor",
                             "decode: the least time a prefill agent that accepted a request gets to deliver it "
                             "(at least 10ms; never more than --prefill-timeout)",
                             &AgentConfig::prefill_deadline_floor));
  o.push_back(numberOption("prefill-deadline-slack", "kv", "prefill_deadline_slack",
                           "decode: a prefill agent that accepted gets this many times the time its measured rate "
                           "says the prompt takes",
                           &AgentConfig::prefill_deadline_slack, 1, 1000));
  o.push_back(numberOption("prefill-assumed-rate", "kv", "prefill_assumed_rate",
                           "decode: prefill tokens/s assumed of a prefill agent until one of its transfers finished",
                           &AgentConfig::prefill_assumed_rate, 1, 1e9));
  o.push_back(numberOption("checksum-rate", "kv", "checksum_rate",
                           "decode: fraction of transfers whose checksums are verified (0..1)",
                           &AgentConfig::checksum_rate, 0, 1));
  o.push_back(
      numberOption("direct-max-suffix", "kv", "direct_max_suffix_tokens",
                   "decode: compute here when the session is resident and at most this many tokens are new (0: never)",
                   &AgentConfig::direct_max_suffix_tokens, 0, 1 << 24));
}

// trace: and log:.
void addLogOptions(std::vector<Option>& o) {
  o.push_back(stringOption("trace-file", "trace", "file", "per-request JSON lines: a file, - for stdout, empty for off",
                           &AgentConfig::trace_file));
  o.push_back(stringOption("log-level", "log", "level", "log level or spec (info, debug, warn,engine=debug)",
                           &AgentConfig::log_level));
  o.push_back(stringOption("log-format", "log", "format", "text or json", &AgentConfig::log_format, {"text", "json"}));
}

// test: hooks for tests of the whole serving path, refused without
// --allow-test-hooks (validateAgentConfig).
void addTestHookOptions(std::vector<Option>& o) {
  o.push_back({"allow-test-hooks", "test", "allow_test_hooks", "true: allow the test hooks below (never in production)",
               [](const AgentConfig& c) { return std::string(c.allow_test_hooks ? "true" : "false"); },
               [](AgentConfig& c, std::string_view v) -> absl::Status {
                 if (v != "true" && v != "false") {
                   return absl::InvalidArgumentError(
                       strCat("--allow-test-hooks: expected true or false, got \"", v, "\""));
                 }
                 c.allow_test_hooks = v == "true";
                 return absl::OkStatus();
               },
               [](AgentConfig& c, ConfigMap& m) { m.field("allow_test_hooks", &c.allow_test_hooks); }});
  o.push_back(stringOption("scripted-output", "test", "scripted_output",
                           "test hook: replies are this file's text (its tokens in order, then EOS) instead of sampled "
                           "tokens; lines <|next_reply|> separate the replies of requests 1, 2, ... (then again from "
                           "the first); needs --allow-test-hooks true",
                           &AgentConfig::scripted_output_file));
}

// Every option, in --help order.
const std::vector<Option>& options() {
  static const std::vector<Option> opts = [] {
    std::vector<Option> o;
    addServerOptions(o);
    addEngineOptions(o);
    addLimitOptions(o);
    addApiKeyOptions(o);
    addAuthOptions(o);
    addEventOptions(o);
    addKvOptions(o);
    addRouterOptions(o);
    addLogOptions(o);
    addTestHookOptions(o);
    return o;
  }();
  return opts;
}

std::string hostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

}  // namespace

std::string agentHelp() {
  AgentConfig defaults;
  std::string out =
      "tandem-agent: the Tandem data-plane process (OpenAI-compatible API, metrics, engine).\n\n"
      "usage: tandem-agent [--config FILE] [--flag VALUE | --flag=VALUE]...\n"
      "       tandem-agent hash-api-key --name NAME < KEY   the API keys file's entry for a key (docs/api-keys.md)\n\n"
      "  --config FILE                         YAML file with the keys below; flags override it\n"
      "  --help                                this text\n";
  for (const Option& o : options()) {
    std::string yaml = o.section[0] ? strCat(o.section, ".", o.key) : std::string(o.key);
    std::string line = strCat("  --", o.flag, " VALUE");
    line.resize(std::max<size_t>(line.size() + 1, 40), ' ');
    std::string def = o.show(defaults);
    out += strCat(line, o.help, "\n", std::string(40, ' '), "yaml: ", yaml,
                  def.empty() ? "" : strCat("  default: ", def), "\n");
  }
  return out;
}

namespace {

// argv as (flag, value) pairs, --config apart: the file is applied before the flags.
struct CommandLine {
  bool help = false;
  std::string config_file;
  std::vector<std::pair<std::string, std::string>> flags;
};

absl::StatusOr<CommandLine> splitArgs(int argc, const char* const* argv) {
  CommandLine cl;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--help" || a == "-h") {
      cl.help = true;
      return cl;
    }
    if (!a.starts_with("--"))
      return absl::InvalidArgumentError(strCat("unexpected argument \"", a, "\" (flags start with --; see --help)"));
    a.remove_prefix(2);
    std::string name, value;
    if (size_t eq = a.find('='); eq != std::string_view::npos) {
      name = std::string(a.substr(0, eq));
      value = std::string(a.substr(eq + 1));
    } else {
      name = std::string(a);
      if (i + 1 >= argc) return absl::InvalidArgumentError(strCat("--", name, ": missing value"));
      value = argv[++i];
    }
    if (name == "config")
      cl.config_file = value;
    else
      cl.flags.emplace_back(std::move(name), std::move(value));
  }
  return cl;
}

// Every option from the YAML file; all of the file's errors at once.
absl::Status applyConfigFile(const std::string& path, AgentConfig& c) {
  TANDEM_ASSIGN_OR_RETURN(ConfigDoc doc, ConfigDoc::fromFile(path));
  ConfigMap root = doc.root();
  std::vector<std::pair<std::string, ConfigMap>> sections;
  for (const Option& o : options()) {
    ConfigMap* m = &root;
    if (o.section[0]) {
      auto it = std::find_if(sections.begin(), sections.end(), [&](const auto& s) { return s.first == o.section; });
      if (it == sections.end()) {
        sections.emplace_back(o.section, root.section(o.section));
        it = sections.end() - 1;
      }
      m = &it->second;
    }
    o.fromYaml(c, *m);
  }
  return doc.finish();
}

absl::Status applyFlags(const std::vector<std::pair<std::string, std::string>>& flags, AgentConfig& c) {
  for (const auto& [name, value] : flags) {
    auto it =
        std::find_if(options().begin(), options().end(), [&name = name](const Option& o) { return name == o.flag; });
    if (it == options().end()) return absl::InvalidArgumentError(strCat("unknown flag --", name, " (see --help)"));
    TANDEM_RETURN_IF_ERROR(it->fromFlag(c, value));
  }
  return absl::OkStatus();
}

// Defaults that depend on other values: kv_host, model_name, worker.
void fillDerivedDefaults(AgentConfig& c) {
  if (c.kv_host.empty()) c.kv_host = c.host;
  if (c.model_name.empty()) {
    std::string d = c.model_dir;
    while (d.size() > 1 && d.back() == '/') d.pop_back();
    size_t slash = d.rfind('/');
    c.model_name = slash == std::string::npos ? d : d.substr(slash + 1);
  }
  if (c.worker.empty()) c.worker = hostName();
}

// Each (flag, value) at least `minimum` (named `minimum_text` in the error).
absl::Status atLeast(std::initializer_list<std::pair<const char*, std::chrono::nanoseconds>> values,
                     std::chrono::nanoseconds minimum, std::string_view minimum_text) {
  for (auto [flag, value] : values) {
    if (value < minimum) {
      return absl::InvalidArgumentError(
          strCat(flag, ": ", std::chrono::duration<double>(value).count(), "s is below the ", minimum_text, " minimum"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status resolveKvCacheBytes(AgentConfig& c) {
  if (c.kv_cache_bytes == 0 || c.role == AgentRole::kRouter) return absl::OkStatus();
  TANDEM_ASSIGN_OR_RETURN(engine::ModelConfig model, engine::loadModelConfig(c.model_dir));
  // A rank's share of the KV heads (a model that does not split is refused
  // later at start-up, naming --tensor-parallel).
  if (c.tensor_parallel > 1 && engine::checkShardable(model, c.tensor_parallel).ok()) {
    model = engine::shardConfig(model, c.tensor_parallel);
  }
  const engine::KvLayout one = engine::kvLayoutFor(model, 1, c.engine.block_size, c.engine.kv_dtype);
  const int64_t per_block = static_cast<int64_t>(one.totalBytes());
  const int64_t blocks = per_block > 0 ? c.kv_cache_bytes / per_block : 0;
  if (blocks < 1) {
    return absl::InvalidArgumentError(strCat("--kv-cache-bytes ", c.kv_cache_bytes, " holds no KV block: one takes ",
                                             per_block, " bytes (", model.num_layers, " layers x ", c.engine.block_size,
                                             " tokens x ", model.num_kv_heads, " KV heads x head_dim ", model.head_dim,
                                             " x K and V in ", engine::kvDtypeName(c.engine.kv_dtype), ")"));
  }
  constexpr int64_t kMaxBlocks = 1 << 24;  // --num-blocks' bound
  c.engine.num_blocks = static_cast<int>(std::min(blocks, kMaxBlocks));
  return absl::OkStatus();
}

absl::Status validateAgentConfig(const AgentConfig& c) {
  if (c.model_dir.empty()) return absl::InvalidArgumentError("--model-dir (model.dir) is required");
  if (c.role == AgentRole::kRouter) {
    if (c.decode_workers.empty() == c.decode_service.empty()) {
      return absl::InvalidArgumentError(
          "role router needs exactly one of --decode-workers (router.decode_workers) and --decode-service "
          "(discovery.decode_service)");
    }
    if (!c.prefill_workers.empty() && !c.prefill_service.empty()) {
      return absl::InvalidArgumentError(
          "--prefill-workers (router.prefill_workers) and --prefill-service (discovery.prefill_service) exclude each "
          "other");
    }
    TANDEM_RETURN_IF_ERROR(routing::validateRouterConfig(c.routing));
    TANDEM_RETURN_IF_ERROR(atLeast({{"--worker-stale-after (router.worker_stale_after)", c.worker_stale_after},
                                    {"--unserved-timeout (router.unserved_timeout)", c.unserved_timeout}},
                                   std::chrono::milliseconds(100), "100ms"));
  }
  TANDEM_RETURN_IF_ERROR(atLeast({{"--header-timeout (limits.header_timeout)", c.header_timeout},
                                  {"--body-timeout (limits.body_timeout)", c.body_timeout},
                                  {"--idle-timeout (limits.idle_timeout)", c.idle_timeout}},
                                 std::chrono::milliseconds(100), "100ms"));
  TANDEM_RETURN_IF_ERROR(
      atLeast({{"--kv-heartbeat-interval (kv.heartbeat_interval)", c.kv_heartbeat_interval},
               {"--kv-heartbeat-idle-interval (kv.heartbeat_idle_interval)", c.kv_heartbeat_idle_interval},
               {"--prefill-deadline-floor (kv.prefill_deadline_floor)", c.prefill_deadline_floor}},
              std::chrono::milliseconds(10), "10ms"));
  if (!c.api_keys_file.empty()) {
    TANDEM_RETURN_IF_ERROR(
        atLeast({{"--api-keys-reload-interval (api_keys.reload_interval)", c.api_keys_reload_interval}},
                std::chrono::milliseconds(100), "100ms"));
  }
  if (!c.scripted_output_file.empty() && !c.allow_test_hooks) {
    return absl::InvalidArgumentError(
        "--scripted-output (test.scripted_output) is a test hook: it needs --allow-test-hooks true as well");
  }
  if (c.tensor_parallel > 1 && c.role == AgentRole::kRouter) {
    return absl::InvalidArgumentError(strCat("--tensor-parallel ", c.tensor_parallel,
                                             " (engine.tensor_parallel) with role router: a router holds no model"));
  }
  // (Other roles have no KV transport: the operator's shared agent.yaml
  // gives its routers the setting too.)
  if (c.kv_device_transport == "direct" && isPdRole(c.role) && c.device == "cpu") {
    return absl::InvalidArgumentError(
        "--kv-device-transport direct (kv.device_transport) is for a KV pool in GPU memory (--device cuda or "
        "cuda-emulator); with --device cpu UCX registers the pool in host memory as it is");
  }
  if (c.kv_device_transport == "direct" && isPdRole(c.role) && c.tensor_parallel > 1) {
    return absl::InvalidArgumentError(
        strCat("--kv-device-transport direct (kv.device_transport) with --tensor-parallel ", c.tensor_parallel,
               ": peers read every rank's KV heads, which only the staging copy holds (use staged or auto)"));
  }
  if (c.role == AgentRole::kDecode && c.prefill_peers.empty() == c.prefill_service.empty()) {
    return absl::InvalidArgumentError(
        "role decode needs exactly one of --prefill-peers (kv.prefill_peers) / --prefill-peer (kv.prefill_peer) and "
        "--prefill-service (discovery.prefill_service)");
  }
  return absl::OkStatus();
}

absl::StatusOr<AgentConfig> parseAgentConfig(int argc, const char* const* argv, bool* help) {
  *help = false;
  AgentConfig c;
  TANDEM_ASSIGN_OR_RETURN(const CommandLine cl, splitArgs(argc, argv));
  *help = cl.help;
  if (cl.help) return c;
  if (!cl.config_file.empty()) TANDEM_RETURN_IF_ERROR(applyConfigFile(cl.config_file, c));
  TANDEM_RETURN_IF_ERROR(applyFlags(cl.flags, c));
  TANDEM_RETURN_IF_ERROR(validateAgentConfig(c));
  c.command_line.assign(argv + std::min(argc, 1), argv + argc);
  fillDerivedDefaults(c);
  return c;
}

absl::StatusOr<http::ServerOptions> httpServerOptions(const AgentConfig& c, const Clock& clock) {
  TANDEM_ASSIGN_OR_RETURN(const http::ServerLibrary library, http::parseServerLibrary(c.http_server));
  return http::ServerOptions{.host = c.host,
                             .port = c.port,
                             .maxBodyBytes = c.max_body_bytes,
                             .requestTimeout = c.request_timeout,
                             .sseKeepalive = c.sse_keepalive,
                             .clock = &clock,
                             .library = library,
                             .headerTimeout = c.header_timeout,
                             .bodyTimeout = c.body_timeout,
                             .idleTimeout = c.idle_timeout,
                             .maxConnections = static_cast<size_t>(c.max_connections)};
}

}  // namespace tandem::agent
