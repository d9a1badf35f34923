#pragma once
// Typed Kubernetes API errors.
//
// A failed API call answers with a metav1.Status body:
//   {"kind":"Status","apiVersion":"v1","status":"Failure","message":"...",
//    "reason":"NotFound","details":{"name":"x","group":"g","kind":"k",
//    "causes":[{"reason":"FieldValueRequired","message":"...","field":"spec.x"}]},"code":404}
//
// statusFromResponse() turns it into an absl::Status whose canonical code
// follows the HTTP code (404 → NotFound, 409 Conflict → Aborted, 409
// AlreadyExists → AlreadyExists, 422 → InvalidArgument, ...) and which carries
// the parsed K8sError as a payload. Callers branch on k8sReason(status) or the
// is…() helpers, never on the message text.
//
// Thread-safety: everything here is a pure function.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/status.h"

namespace tandem::k8s {

// metav1.StatusReason, plus kUnknown for errors that carried no Status
// (connection failures, malformed responses).
enum class K8sErrorReason {
  kUnknown,
  kUnauthorized,           // 401
  kForbidden,              // 403
  kNotFound,               // 404
  kAlreadyExists,          // 409 on create
  kConflict,               // 409 on a stale resourceVersion
  kGone,                   // 410
  kExpired,                // 410: resourceVersion too old for watch/list
  kInvalid,                // 422, with causes
  kServerTimeout,          // 500/504: the server could not finish in time; retry
  kTimeout,                // 504: the request timed out
  kTooManyRequests,        // 429
  kBadRequest,             // 400
  kMethodNotAllowed,       // 405
  kNotAcceptable,          // 406
  kRequestEntityTooLarge,  // 413
  kUnsupportedMediaType,   // 415
  kInternalError,          // 500
  kServiceUnavailable,     // 503
};

// The wire name ("NotFound"); "" for kUnknown.
std::string_view k8sErrorReasonName(K8sErrorReason reason);
// Parses a wire name; kUnknown for names this client does not know.
K8sErrorReason parseK8sErrorReason(std::string_view name);
// The reason client-go assumes when a Status names none (by HTTP code).
K8sErrorReason reasonForHttpCode(int code);

struct StatusCause {
  std::string reason;  // "FieldValueRequired", "FieldValueInvalid", ...
  std::string message;
  std::string field;  // "spec.replicas"
};

struct K8sError {
  K8sErrorReason reason = K8sErrorReason::kUnknown;
  int code = 0;  // HTTP status code
  std::string message;
  // details
  std::string name;
  std::string group;
  std::string kind;
  std::vector<StatusCause> causes;
  int retryAfterSeconds = 0;

  nlohmann::json toJson() const;  // the metav1.Status shape
};

// Parses a metav1.Status object (from an error body or a watch ERROR event).
// Missing reason → reasonForHttpCode(code).
K8sError parseStatusObject(const nlohmann::json& status);

// The absl::Status for an HTTP error response. `body` may be a Status,
// something else, or empty: the message then quotes the body (cut short).
// `what` ("GET /api/v1/...") prefixes the message.
absl::Status statusFromResponse(int httpCode, std::string_view body, std::string_view what);
// The absl::Status for an already parsed K8sError.
absl::Status statusFromK8sError(const K8sError& error, std::string_view what);

// The K8sError an absl::Status carries, if it came from the API server.
std::optional<K8sError> k8sError(const absl::Status& status);
// Its reason; kUnknown for OK, transport errors and foreign statuses.
K8sErrorReason k8sReason(const absl::Status& status);

inline bool isNotFound(const absl::Status& s) { return k8sReason(s) == K8sErrorReason::kNotFound; }
inline bool isAlreadyExists(const absl::Status& s) { return k8sReason(s) == K8sErrorReason::kAlreadyExists; }
inline bool isConflict(const absl::Status& s) { return k8sReason(s) == K8sErrorReason::kConflict; }
inline bool isInvalid(const absl::Status& s) { return k8sReason(s) == K8sErrorReason::kInvalid; }
// 410: the resourceVersion is too old (reason Expired or Gone).
inline bool isResourceExpired(const absl::Status& s) {
  K8sErrorReason r = k8sReason(s);
  return r == K8sErrorReason::kExpired || r == K8sErrorReason::kGone;
}

}  // namespace tandem::k8s
