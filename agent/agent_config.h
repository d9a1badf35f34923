#pragma once
// tandem-agent's configuration: a YAML file (--config) and command-line
// flags; a flag wins over the file. `tandem-agent --help` lists every flag
// with its YAML key and default (the table in agent_config.cc is the one
// source for both). docs/agent.md shows a complete file.

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/api_keys.h"
#include "engine/backend/backend.h"
#include "engine/engine.h"
#include "src/common/status.h"
#include "src/http/server.h"
#include "src/routing/router_config.h"

namespace tandem::agent {

// The data-plane role of this process (DESIGN.md §1), parsed once from
// --role (role:).
enum class AgentRole { kBoth, kPrefill, kDecode, kRouter };
// Roles prefill and decode: the ones with a KV transport (P/D).
inline bool isPdRole(AgentRole role) { return role == AgentRole::kPrefill || role == AgentRole::kDecode; }

// "both", "prefill", "decode", "router": the flag's spelling, and the `role`
// label of metrics, traces and logs.
std::string_view agentRoleName(AgentRole role);

// An address "HOST:PORT", PORT in [0, 65535].
struct HostPort {
  std::string host;
  int port = 0;
};
// Parses `v` as HOST:PORT; InvalidArgument naming `what` (e.g.
// "--prefill-peer") and the value otherwise.
absl::StatusOr<HostPort> parseHostPort(std::string_view what, std::string_view v);

struct AgentConfig {
  AgentRole role = AgentRole::kBoth;
  std::string pool = "default";
  std::string worker;  // this agent's name in traces; default: the host name
  std::string host = "127.0.0.1";
  int port = 8100;         // 0: pick a free port (see port_file)
  std::string port_file;   // write the bound port here once serving (for tests and scripts)
  std::string model_dir;   // Hugging Face-style directory (config.json, model.safetensors, tokenizer)
  std::string model_name;  // served model id; default: the directory's base name
  // The model's fingerprint (engine/model/model_fingerprint.h): computed
  // from the model's files at load unless the operator pins it.
  std::optional<uint64_t> model_fingerprint;
  std::string cache_salt;  // tenant salt of the block-hash chain (empty: none); P and D of a pool share it
  engine::EngineOptions engine;
  int default_max_tokens = 256;                                         // chat requests without max_tokens
  size_t max_body_bytes = 8u << 20;                                     // larger request bodies get 413
  std::chrono::nanoseconds request_timeout = std::chrono::minutes(10);  // per request, queue included
  std::chrono::nanoseconds sse_keepalive = std::chrono::seconds(15);    // idle-stream comment; detects hang-ups
  // Connection hygiene of the HTTP listener (docs/http.md, http::ServerOptions).
  std::chrono::nanoseconds header_timeout = std::chrono::seconds(10);  // a request's headers, from its first byte
  std::chrono::nanoseconds body_timeout = std::chrono::seconds(60);    // its body, after the headers (408)
  std::chrono::nanoseconds idle_timeout = std::chrono::seconds(60);    // a kept-alive connection without a request
  int max_connections = 4096;                                          // open at once; more are closed at once
  std::chrono::nanoseconds drain_grace = std::chrono::seconds(30);      // SIGTERM: in-flight work may finish this long
  // The pool key's directory (docs/security.md); empty: insecure.
  std::string pool_key_dir;
  // The engine's compute device: cpu | cuda | cuda-emulator (the CUDA
  // kernels run on the CPU; docs/cuda.md).
  std::string device = "cpu";
  // What the engine's projections read (engine/backend/backend.h,
  // GemmDtype): float32, or bfloat16 (weights kept in bf16, each
  // projection's input rounded to bf16, fp32 accumulation; on a GPU half
  // the weights' memory and the tensor cores). Every --device takes it.
  std::string dtype = "float32";
  engine::GemmDtype gemmDtype() const {
    return dtype == "bfloat16" ? engine::GemmDtype::kBfloat16 : engine::GemmDtype::kFloat32;
  }
  // Tensor parallelism (docs/cuda.md, "Tensor parallelism"): the model is
  // split across this many ranks, each its own process; this process is
  // rank 0 and starts the others. With --device cuda rank r runs on GPU r.
  // 1: none. Not for role router.
  int tensor_parallel = 1;
  // The KV pool's size in bytes per process (per GPU with --device cuda),
  // instead of engine.num_blocks: resolveKvCacheBytes turns it into the
  // blocks of this model and --kv-dtype that fit. 0: num_blocks decides.
  int64_t kv_cache_bytes = 0;
  // The arguments this agent was started with (after the program name):
  // the tensor-parallel ranks it starts get the same. parseAgentConfig
  // fills it.
  std::vector<std::string> command_line;
  std::string http_server = "beast";  // HTTP server library: beast | cpprest (docs/http.md)
  // The public API's keys (docs/api-keys.md): the keys file ("": API keys
  // off, every request is served), how often it is re-read, and the limits
  // of keys that set none of their own.
  std::string api_keys_file;
  std::chrono::nanoseconds api_keys_reload_interval = std::chrono::seconds(5);
  ApiKeyLimits api_key_limits;
  std::string trace_file;             // per-request trace lines: "" off, "-" stdout, else a file (appended)
  // Test hooks (docs/agent.md): each is refused unless allow_test_hooks is
  // set too, so none can be on by accident in production.
  bool allow_test_hooks = false;
  // Replies are this file's text, then EOS (several: split at lines
  // "<|next_reply|>", request k gets reply k; EngineOptions::scripted_replies).
  std::string scripted_output_file;
  // The worker-state stream (GET /internal/v1/events; docs/routing.md).
  std::chrono::nanoseconds events_load_interval = std::chrono::milliseconds(50);  // load deltas at most this often
  std::chrono::nanoseconds events_heartbeat = std::chrono::milliseconds(500);            // an idle stream's heartbeat; 0: none
  int events_buffer = 4096;  // deltas kept for slow subscribers; one further behind is closed
  // P/D (roles prefill and decode): the UCX KV transport.
  std::string kv_host;                   // KV listener address; default: host
  int kv_port = 8200;                    // 0: any free port
  std::vector<HostPort> prefill_peers;   // decode role (required there): the prefill agents' KV addresses
  std::string kv_tls;                    // UCX_TLS for KV traffic ("" = UCX's choice; "tcp"; "posix,cma,tcp")
  int ib_sl = -1;                        // InfiniBand service level for KV traffic (UCX_IB_SL); -1 = unset
  int ib_traffic_class = -1;             // RoCE traffic class for KV traffic (UCX_IB_TRAFFIC_CLASS); -1 = unset
  int kv_copy_threads = 2;               // decode over shared memory: threads copying a large pull
  // A KV pool in GPU memory (roles prefill and decode): "direct" registers
  // it with UCX (GPUDirect; needs a UCX with CUDA support), "staged" copies
  // through host memory, "auto" is direct where this UCX and the node's NICs
  // can (GPUDirect RDMA), else staged (docs/cuda.md).
  std::string kv_device_transport = "auto";
  std::chrono::nanoseconds lease_ttl = std::chrono::seconds(30);        // prefill: KV pinned at most this long
  std::chrono::nanoseconds prefill_timeout = std::chrono::seconds(60);  // decode: the whole transfer's deadline
  double checksum_rate = 1.0;  // decode: fraction of transfers whose per-block checksums are verified
  // decode: heartbeats to each prefill agent (docs/pd.md "Liveness"): this
  // often while it has work (or is suspect), `idle` while not; this many
  // unanswered in a row make it suspect.
  std::chrono::nanoseconds kv_heartbeat_interval = std::chrono::milliseconds(500);
  std::chrono::nanoseconds kv_heartbeat_idle_interval = std::chrono::seconds(2);
  int kv_heartbeat_misses = 3;
  // decode: a prefill agent that accepted gets max(floor, slack × tokens / its rate) (prefill_deadline.h)
  std::chrono::nanoseconds prefill_deadline_floor = std::chrono::seconds(2);
  double prefill_deadline_slack = 4.0;
  double prefill_assumed_rate = 1000.0;  // tokens/s before a peer's rate was measured
  int direct_max_suffix_tokens =
      256;  // decode: direct-to-D for resident sessions with at most this many new tokens (0: never)
  // Router role: the agents it routes to (their HTTP addresses; it
  // subscribes to each one's /internal/v1/events) and the policy's knobs.
  std::vector<HostPort> decode_workers;
  std::vector<HostPort> prefill_workers;
  // Discovery instead of fixed lists (docs/routing.md "Discovery"): the
  // headless Services whose EndpointSlices name the router's decode and
  // prefill workers (port `http`) and a decode agent's prefill agents (port
  // `kv`), in `discovery_namespace` (default: the pod's own).
  std::string decode_service;
  std::string prefill_service;
  std::string discovery_namespace;
  routing::RouterConfig routing;
  std::chrono::nanoseconds upstream_open_timeout = std::chrono::seconds(10);  // connect; a stream's headers
  // router: a decode worker whose state stream says nothing this long is unresponsive
  std::chrono::nanoseconds worker_stale_after = std::chrono::seconds(2);
  // router: a request only unresponsive decode workers could take fails (503) this long after arrival
  std::chrono::nanoseconds unserved_timeout = std::chrono::seconds(10);
  // router: the planner's routing knobs (a JSON file, re-read every 2 s;
  // agent/router/routing_knobs.h); "" : none
  std::string routing_knobs_file;
  std::string log_level = "info";   // or a spec "info,engine=debug"
  std::string log_format = "text";  // text | json
};

// Parses argv (flags, and the file named by --config). Returns the config,
// or an error naming the flag or the file:line:col and key. `*help` is set
// (and the config meaningless) when --help was given.
absl::StatusOr<AgentConfig> parseAgentConfig(int argc, const char* const* argv, bool* help);

// What parseAgentConfig checks across fields (model_dir set, a role this
// build serves, a prefill peer for role decode), for configs built in code.
absl::Status validateAgentConfig(const AgentConfig& config);

// With kv_cache_bytes set: engine.num_blocks becomes the most blocks of the
// model's KV layout (this rank's KV heads, --kv-dtype) that fit in it; an
// error names the flag when not one block fits. Reads the model's
// config.json. Nothing to do otherwise, or for role router.
absl::Status resolveKvCacheBytes(AgentConfig& config);

// The HTTP listener's options from `config` (the agent's and the router's).
absl::StatusOr<http::ServerOptions> httpServerOptions(const AgentConfig& config, const Clock& clock);

// The --help text.
std::string agentHelp();

}  // namespace tandem::agent
