#pragma once
// Errors as the Kubernetes API server reports them: a metav1.Status body
//
//   {"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
//    "message":"configmaps \"x\" not found","reason":"NotFound",
//    "details":{"name":"x","kind":"configmaps"},"code":404}
//
// with the HTTP status equal to `code`. The factories below build the
// messages, reasons and details the way k8s.io/apimachinery/pkg/api/errors
// does, so that kubectl prints what it prints against a real cluster.
//
// Inside the emulator an ApiError is thrown from the depth of a request's
// handling and caught at the one HTTP entry point (Router::serve), which turns it
// into the response; it never crosses that boundary.

#include <exception>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tandem::apiserver {

// One entry of details.causes (a field error for 422 Invalid).
struct StatusCause {
  std::string reason;   // "FieldValueInvalid", "FieldValueRequired", ...
  std::string message;  // "Invalid value: -1: ... should be greater than or equal to 0"
  std::string field;    // "spec.decode.replicas"
};

class ApiError : public std::exception {
 public:
  ApiError(int code, std::string reason, std::string message);

  // The metav1.Status body.
  nlohmann::json toStatus() const;
  const char* what() const noexcept override { return message_.c_str(); }

  int code() const { return code_; }
  const std::string& reason() const { return reason_; }
  const std::string& message() const { return message_; }

  nlohmann::json details;  // null: no details
 private:
  int code_;
  std::string reason_;
  std::string message_;
};

// `resource` is the plural ("configmaps"), `group` empty for the core group.
ApiError notFound(const std::string& resource, const std::string& group, const std::string& name);
ApiError alreadyExists(const std::string& resource, const std::string& group, const std::string& name);
// 409 Conflict: "Operation cannot be fulfilled on <resource> "<name>": <why>".
ApiError conflict(const std::string& resource, const std::string& group, const std::string& name,
                  const std::string& why);
// The usual stale-resourceVersion conflict.
ApiError staleConflict(const std::string& resource, const std::string& group, const std::string& name);
// 422 Invalid. `kind` is the Kind ("InferencePool"); each cause carries a field.
ApiError invalid(const std::string& kind, const std::string& group, const std::string& name,
                 const std::vector<StatusCause>& causes);
ApiError badRequest(const std::string& message);
ApiError forbidden(const std::string& message);
ApiError expired(const std::string& message);  // 410 Expired (watch history gone)
ApiError methodNotAllowed();
ApiError unsupportedMediaType(const std::string& message);
ApiError notAcceptable(const std::string& message);
ApiError internalError(const std::string& message);
// 404 for a path that names no resource at all.
ApiError pathNotFound();

// Field error causes, with the message prefixes of apimachinery's field.Error.
StatusCause fieldRequired(const std::string& field, const std::string& detail = "");
StatusCause fieldInvalid(const std::string& field, const nlohmann::json& value, const std::string& detail);
StatusCause fieldNotSupported(const std::string& field, const nlohmann::json& value,
                              const std::vector<nlohmann::json>& supported);
StatusCause fieldForbidden(const std::string& field, const std::string& detail);
StatusCause fieldTypeInvalid(const std::string& field, const nlohmann::json& value, const std::string& detail);

}  // namespace tandem::apiserver
