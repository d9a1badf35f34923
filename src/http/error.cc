#include "src/http/error.h"

#include <nlohmann/json.hpp>

namespace tandem::http {

std::string errorBody(int status, std::string_view type, std::string_view message) {
  nlohmann::json body = {{"error", {{"message", std::string(message)}, {"type", std::string(type)}, {"code", status}}}};
  // `replace` keeps dump() from throwing on invalid UTF-8 in the message.
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string invalidJsonMessage(std::string_view what) {
  if (size_t end = what.find("] "); what.starts_with("[json.exception.") && end != std::string_view::npos) {
    what.remove_prefix(end + 2);
  }
  return "request body is not valid JSON: " + std::string(what);
}

std::string_view errorTypeForStatus(int status) {
  if (status == 429) return kRateLimitError;
  if (status == 503) return kUnavailableError;
  if (status == 504) return kTimeoutError;
  if (status >= 400 && status < 500) return kInvalidRequestError;
  return kServerError;
}

int httpStatusForStatus(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;  // nginx's "client closed request"
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

absl::StatusCode statusCodeForHttpStatus(int status) {
  if (status >= 200 && status < 300) return absl::StatusCode::kOk;
  switch (status) {
    case 400:
    case 413:
      return absl::StatusCode::kInvalidArgument;
    case 401:
      return absl::StatusCode::kUnauthenticated;
    case 403:
      return absl::StatusCode::kPermissionDenied;
    case 404:
      return absl::StatusCode::kNotFound;
    case 405:
    case 501:
      return absl::StatusCode::kUnimplemented;
    case 409:
      return absl::StatusCode::kAlreadyExists;
    case 429:
      return absl::StatusCode::kResourceExhausted;
    case 499:
      return absl::StatusCode::kCancelled;
    case 503:
      return absl::StatusCode::kUnavailable;
    case 504:
      return absl::StatusCode::kDeadlineExceeded;
    default:
      return status >= 400 && status < 500 ? absl::StatusCode::kFailedPrecondition : absl::StatusCode::kInternal;
  }
}

}  // namespace tandem::http
