#pragma once
// The agent: loads the model, runs the engine on its own thread
// (EngineLoop), runs the P/D service of roles prefill and decode (pd.md) and
// serves the OpenAI-compatible API, health and metrics over HTTP
// (DESIGN.md §5: port 8100).
//
//   GET  /healthz               200 while the process runs
//   GET  /readyz                200 when the model is loaded, the engine steps and we are not draining; else 503
//   GET  /metrics               Prometheus text format
//   GET  /v1/models             the one served model
//   POST /v1/completions        OpenAI completions, stream or not
//   POST /v1/chat/completions   OpenAI chat completions, stream or not
//   GET  /internal/v1/events    the worker-state stream routers subscribe to (worker_events.h)
//
// With --api-keys-file the /v1/ routes serve only requests bearing a listed
// API key, within the key's limits (authorizePublic, openai_http.h;
// docs/api-keys.md); /healthz, /readyz and /metrics stay open.
//
// A client that disconnects cancels its request through the engine's one
// cleanup path, so its KV blocks return to the pool. Thread-safe: handlers run
// on the HTTP thread pool and talk to the engine only through EngineLoop.
//
// Time: every deadline and timestamp comes from the Clock given to start(),
// which the engine gets too (SystemClock::instance() only in main).

#include <atomic>
#include <memory>

#include "agent/agent_config.h"
#include "agent/transport/kv_transport.h"
#include "src/common/clock.h"
#include "src/common/status.h"

namespace tandem::agent {

class AgentServer {
 public:
  // Builds the engine, the P/D service (roles prefill, decode) and the HTTP
  // routes, then starts listening. `clock` is not owned and must outlive
  // the server. `kv_transport_factory` starts the KV transport of roles
  // prefill and decode (empty: UCX; the fault-injecting test agent passes
  // its own).
  static absl::StatusOr<std::unique_ptr<AgentServer>> start(const AgentConfig& config, const Clock& clock,
                                                            transport::KvTransportFactory kv_transport_factory = {});
  ~AgentServer();

  int port() const;
  // Roles prefill and decode: the bound UCX KV port (else 0).
  int kvPort() const;
  // Graceful drain: readiness goes false, new requests get 503, in-flight
  // requests may finish for config.drain_grace; then the rest are cancelled.
  void drain();

 private:
  struct Impl;
  explicit AgentServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::agent
