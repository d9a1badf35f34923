#pragma once
// The OpenAI API's HTTP answers that the agent (agent_server.cc) and the
// router (router/router_server.cc) give alike.

#include "agent/openai_api.h"
#include "agent/openai_request.h"
#include "src/http/server.h"

namespace tandem::agent {

// `e` as an HTTP response: its status, its JSON body and headers.
http::Response apiError(const ApiError& e);

// GET /v1/models: the one served model.
http::Response modelsResponse(const ApiLimits& limits);

}  // namespace tandem::agent
