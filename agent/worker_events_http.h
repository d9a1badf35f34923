#pragma once
// The worker-state stream on the agent's HTTP server: GET
// /internal/v1/events serves a WorkerEventsPublisher as Server-Sent Events,
// one message (worker_events_json.h) per `data:` event. A client that hangs
// up is forgotten at once (the call's cancellation); the server's own
// `: keepalive` comments may appear between events and carry nothing.

#include "agent/agent_config.h"
#include "agent/worker_events.h"
#include "src/http/server.h"

namespace tandem::agent {

// The route's handler. `publisher` must outlive the server's calls.
http::Response serveWorkerEvents(WorkerEventsPublisher& publisher);

// The publisher's options for this agent and its engine (before the engine
// loop takes the engine): names, role, block size, hash root, context,
// initial load, and the events.* settings of the config.
WorkerEventsOptions workerEventsOptions(const AgentConfig& config, const engine::Engine& engine, const Clock& clock);

}  // namespace tandem::agent
