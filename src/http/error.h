#pragma once
// The JSON error body of every Tandem HTTP endpoint, in OpenAI's shape so
// OpenAI clients show our messages:
//
//   {"error":{"message":"request body is not valid JSON: ...","type":"invalid_request_error","code":400}}
//
// `code` is the HTTP status as a number. `type` is one of the k...Error names
// below; clients branch on the HTTP status and `type`, never on the message.

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace tandem::http {

// 4xx: the request is wrong (bad JSON, not UTF-8, too large, unknown path or method).
inline constexpr std::string_view kInvalidRequestError = "invalid_request_error";
// 500: a bug or an unexpected failure on our side.
inline constexpr std::string_view kServerError = "server_error";
// 504: no response before the request's deadline.
inline constexpr std::string_view kTimeoutError = "timeout_error";
// 503: shutting down, or not ready.
inline constexpr std::string_view kUnavailableError = "service_unavailable_error";
// 429: over capacity; retry later.
inline constexpr std::string_view kRateLimitError = "rate_limit_error";

// The error body above. Never throws: invalid UTF-8 in `message` (a parser
// quoting the bad input) is replaced with U+FFFD.
std::string errorBody(int status, std::string_view type, std::string_view message);

// "request body is not valid JSON: parse error at line 1, column 2: ...":
// the message for a nlohmann::json exception's what(), without the library's
// "[json.exception.parse_error.101] " prefix.
std::string invalidJsonMessage(std::string_view what);

// The `type` that goes with an HTTP status when nothing more specific applies.
std::string_view errorTypeForStatus(int status);

// The HTTP status for a Status a handler failed with: InvalidArgument and
// FailedPrecondition 400, NotFound 404, AlreadyExists 409, ResourceExhausted
// 429, Unimplemented 501, Unavailable 503, DeadlineExceeded 504, Cancelled
// 499 (the client went away), everything else 500. OK is 200.
int httpStatusForStatus(const absl::Status& status);

// The reverse, for clients that turn an error response into a Status.
absl::StatusCode statusCodeForHttpStatus(int status);

}  // namespace tandem::http
