#pragma once
// The router role (`tandem-agent --role router`, DESIGN.md §1-2,
// docs/routing.md): the OpenAI-compatible front door on port 8000. It
// tokenizes each request with the model's tokenizer, hashes the prompt's
// blocks with the workers' chain, asks the routing policy for a decode
// worker (and a prefill worker, or the direct path), and relays the
// request to D with the decision in headers; D streams the answer back
// through it. It holds no engine.
//
//   GET  /healthz  /readyz  /metrics  /v1/models
//   POST /v1/completions  /v1/chat/completions
//
// With --api-keys-file the /v1/ routes serve only requests bearing a listed
// API key, within the key's limits (authorizePublic, openai_http.h;
// docs/api-keys.md); the key is not forwarded to D.
//
// /readyz is ready once a decode worker's state snapshot arrived. A request
// that D refuses before any token (a typed reason another worker could
// serve: capacity, queue full, draining, a failed prefill) or that cannot
// reach D goes to one other worker; never after a token was streamed.
//
// Thread-safe. Each routed request is served on its own thread (the
// upstream HTTP calls block); drain() waits for them.

#include <memory>

#include "agent/agent_config.h"
#include "src/common/clock.h"
#include "src/common/status.h"

namespace tandem::agent {

class RouterServer {
 public:
  // Loads the tokenizer, subscribes to every configured worker's state
  // stream and starts listening. `clock` must outlive the server.
  static absl::StatusOr<std::unique_ptr<RouterServer>> start(const AgentConfig& config, const Clock& clock);
  ~RouterServer();

  int port() const;
  // Readiness goes false, new requests get 503, requests in flight may
  // finish for config.drain_grace.
  void drain();

  struct Impl;

 private:
  explicit RouterServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::agent
