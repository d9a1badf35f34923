#include "agent/internal_auth.h"

#include <nlohmann/json.hpp>

namespace tandem::agent {
namespace {

std::optional<std::string> bearerToken(const http::Request& req) {
  std::optional<std::string> h = req.header("Authorization");
  if (!h) return std::nullopt;
  constexpr std::string_view kBearer = "Bearer ";
  if (h->size() < kBearer.size() || !std::equal(kBearer.begin(), kBearer.end(), h->begin(), [](char a, char b) {
        return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
      })) {
    return std::nullopt;
  }
  return h->substr(kBearer.size());
}

}  // namespace

InternalCaller internalCaller(auth::PoolKeySource& keys, const http::Request& req) {
  if (!keys.secure()) return InternalCaller::kInsecure;
  std::optional<std::string> token = bearerToken(req);
  if (!token) return InternalCaller::kMissing;
  return keys.keys()->acceptsInternalToken(*token) ? InternalCaller::kAuthenticated : InternalCaller::kWrong;
}

std::optional<http::Response> refuseInternal(auth::PoolKeySource& keys, const http::Request& req) {
  const InternalCaller c = internalCaller(keys, req);
  if (c == InternalCaller::kInsecure || c == InternalCaller::kAuthenticated) return std::nullopt;
  const std::string message =
      c == InternalCaller::kMissing
          ? "the internal API requires the pool's token (Authorization: Bearer <token derived from the pool key>)"
          : "the token is not derived from this pool's key (another pool, or a key rotated out)";
  http::Response r = http::Response::json(401, {{"error",
                                                 {{"message", message},
                                                  {"type", "invalid_request_error"},
                                                  {"param", nullptr},
                                                  {"code", "invalid_internal_token"}}}});
  r.setHeader("WWW-Authenticate", "Bearer");
  return r;
}

std::string internalAuthorization(auth::PoolKeySource& keys) {
  if (!keys.secure()) return {};
  return "Bearer " + keys.keys()->internalToken();
}

}  // namespace tandem::agent
