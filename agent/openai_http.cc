#include "agent/openai_http.h"

#include <algorithm>
#include <cmath>

#include "agent/internal_auth.h"
#include "src/common/strings.h"

namespace tandem::agent {

http::Response apiError(const ApiError& e) {
  http::Response r = http::Response::json(e.status, e.toJson());
  for (const auto& [k, v] : e.headers) r.setHeader(k, v);
  return r;
}

http::Response modelsResponse(const ApiLimits& limits) {
  nlohmann::json model = {{"id", limits.model_name},
                          {"object", "model"},
                          {"created", 0},
                          {"owned_by", "tandem"},
                          {"max_model_len", limits.max_model_len}};
  return http::Response::json(200, nlohmann::json{{"object", "list"}, {"data", nlohmann::json::array({model})}});
}

ApiError apiKeyError(const ApiKeyRefusal& refusal) {
  if (refusal.reason == ApiKeyRejection::kInvalidApiKey) {
    return {.status = 401,
            .message = refusal.message,
            .code = "invalid_api_key",
            .headers = {{"WWW-Authenticate", "Bearer"}}};
  }
  // Whole seconds, rounded up: a client that waits this long finds a token.
  const double seconds = std::chrono::duration<double>(refusal.retry_after).count();
  const int64_t retry_after = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(seconds)));
  return {
      .status = 429,
      .type = "rate_limit_error",
      .message = refusal.message,
      .code = refusal.reason == ApiKeyRejection::kRateLimited ? "rate_limit_exceeded" : "concurrency_limit_exceeded",
      .headers = {{"Retry-After", strCat(retry_after)}}};
}

std::variant<ApiKeyGrant, http::Response> authorizePublic(const PublicApiAuth& auth, const http::Request& request) {
  if (!auth.api_keys) return ApiKeyGrant();
  if (auth.pool_keys && internalCaller(*auth.pool_keys, request) == InternalCaller::kAuthenticated) {
    return ApiKeyGrant();
  }
  std::optional<std::string> header = request.header("Authorization");
  std::variant<ApiKeyGrant, ApiKeyRefusal> decision =
      auth.api_keys->authorize(header ? std::optional<std::string_view>(*header) : std::nullopt);
  if (auto* refused = std::get_if<ApiKeyRefusal>(&decision)) return apiError(apiKeyError(*refused));
  return std::get<ApiKeyGrant>(std::move(decision));
}

}  // namespace tandem::agent
