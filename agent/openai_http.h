#pragma once
// The OpenAI API's HTTP answers that the agent (agent_server.cc) and the
// router (router/router_server.cc) give alike, and the one check both make
// before serving a public request (authorizePublic).

#include <variant>

#include "agent/api_keys.h"
#include "agent/openai_api.h"
#include "agent/openai_request.h"
#include "src/http/server.h"

namespace tandem::auth {
class PoolKeySource;
}  // namespace tandem::auth

namespace tandem::agent {

// `e` as an HTTP response: its status, its JSON body and headers.
http::Response apiError(const ApiError& e);

// GET /v1/models: the one served model.
http::Response modelsResponse(const ApiLimits& limits);

// A gate's refusal in OpenAI's shape (docs/api-keys.md):
//   kInvalidApiKey       401 invalid_request_error / invalid_api_key, WWW-Authenticate: Bearer
//   kRateLimited         429 rate_limit_error / rate_limit_exceeded, Retry-After: whole seconds
//                        until the key's next token (at least 1)
//   kConcurrencyLimited  429 rate_limit_error / concurrency_limit_exceeded, Retry-After: 1
ApiError apiKeyError(const ApiKeyRefusal& refusal);

// What a server checks public requests (/v1/...) with; one per server.
// (/healthz, /readyz and /metrics are open; /internal/v1/ is not public.)
struct PublicApiAuth {
  ApiKeyGate* api_keys = nullptr;  // not owned; null: API keys off (no --api-keys-file)
  // Not owned. A request bearing the pool's token (a router forwarding to a
  // decode agent, agent/internal_auth.h) needs no API key: the router
  // checked the client's and applied its limits. Null or insecure: none skips.
  auth::PoolKeySource* pool_keys = nullptr;
};

// The one decision on a public request, on the router and on every agent:
// the grant to hold until the request ends (ApiKeyGrant says when to
// release it), or the error response to answer with. Thread-safe.
std::variant<ApiKeyGrant, http::Response> authorizePublic(const PublicApiAuth& auth, const http::Request& request);

}  // namespace tandem::agent
