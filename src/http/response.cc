// Response (server.h): what a handler returns.

#include <nlohmann/json.hpp>

#include "src/common/strings.h"
#include "src/http/error.h"
#include "src/http/server.h"

namespace tandem::http {

Response Response::text(int status, std::string body, std::string contentType) {
  Response r;
  r.status_ = status;
  r.body_ = std::move(body);
  r.headers_["Content-Type"] = std::move(contentType);
  return r;
}

Response Response::json(int status, const nlohmann::json& body) {
  return text(status, body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), "application/json");
}

Response Response::error(int status, std::string_view type, std::string_view message) {
  return text(status, errorBody(status, type, message), "application/json");
}

Response Response::error(const absl::Status& status) {
  int code = httpStatusForStatus(status);
  return error(code, errorTypeForStatus(code), toStd(status.message()));
}

Response Response::sse(SseStart start) {
  Response r;
  r.kind_ = Kind::kSse;
  r.sseStart_ = std::move(start);
  return r;
}

Response Response::deferred(DeferredStart start) {
  Response r;
  r.kind_ = Kind::kDeferred;
  r.deferredStart_ = std::move(start);
  return r;
}

Response& Response::setHeader(std::string name, std::string value) {
  headers_[std::move(name)] = std::move(value);
  return *this;
}

}  // namespace tandem::http
