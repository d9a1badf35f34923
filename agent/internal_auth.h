#pragma once
// The pool key on HTTP (docs/security.md): the bearer token derived from
// it (auth::PoolKeys::internalToken) is what /internal/v1/ requires, what a
// router's subscriptions and forwarded requests bear, and what makes a
// decode agent honour a router's decision headers (routing_headers.h).
// Without a pool key (insecure) nothing is checked and nothing is sent.

#include <optional>
#include <string>

#include "src/auth/pool_key.h"
#include "src/http/server.h"

namespace tandem::agent {

enum class InternalCaller {
  kInsecure,       // no pool key here: nothing to check
  kAuthenticated,  // bears the token of a key this agent accepts
  kMissing,        // no `Authorization: Bearer` token
  kWrong,          // a token, but not one of this pool's
};
InternalCaller internalCaller(auth::PoolKeySource& keys, const http::Request& req);

// 401 (OpenAI error shape, code invalid_internal_token) unless the caller
// is authenticated or the agent insecure.
std::optional<http::Response> refuseInternal(auth::PoolKeySource& keys, const http::Request& req);

// The Authorization header's value to send ("Bearer tandem-pool...."), or
// "" when insecure.
std::string internalAuthorization(auth::PoolKeySource& keys);

}  // namespace tandem::agent
