#include "src/k8s/errors.h"

#include <array>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/cord.h"
#include "src/common/strings.h"

namespace tandem::k8s {

namespace {

// The payload type URL under which the parsed Status travels.
constexpr char kPayloadUrl[] = "type.tandem.dev/k8s.metav1.Status";
// Non-Status error bodies are quoted up to this many bytes.
constexpr size_t kMaxQuotedBody = 512;

constexpr std::array<std::pair<K8sErrorReason, std::string_view>, 18> kNames = {{
    {K8sErrorReason::kUnauthorized, "Unauthorized"},
    {K8sErrorReason::kForbidden, "Forbidden"},
    {K8sErrorReason::kNotFound, "NotFound"},
    {K8sErrorReason::kAlreadyExists, "AlreadyExists"},
    {K8sErrorReason::kConflict, "Conflict"},
    {K8sErrorReason::kGone, "Gone"},
    {K8sErrorReason::kExpired, "Expired"},
    {K8sErrorReason::kInvalid, "Invalid"},
    {K8sErrorReason::kServerTimeout, "ServerTimeout"},
    {K8sErrorReason::kTimeout, "Timeout"},
    {K8sErrorReason::kTooManyRequests, "TooManyRequests"},
    {K8sErrorReason::kBadRequest, "BadRequest"},
    {K8sErrorReason::kMethodNotAllowed, "MethodNotAllowed"},
    {K8sErrorReason::kNotAcceptable, "NotAcceptable"},
    {K8sErrorReason::kRequestEntityTooLarge, "RequestEntityTooLarge"},
    {K8sErrorReason::kUnsupportedMediaType, "UnsupportedMediaType"},
    {K8sErrorReason::kInternalError, "InternalError"},
    {K8sErrorReason::kServiceUnavailable, "ServiceUnavailable"},
}};

absl::StatusCode canonicalCode(K8sErrorReason reason, int httpCode) {
  switch (reason) {
    case K8sErrorReason::kUnauthorized:
      return absl::StatusCode::kUnauthenticated;
    case K8sErrorReason::kForbidden:
      return absl::StatusCode::kPermissionDenied;
    case K8sErrorReason::kNotFound:
      return absl::StatusCode::kNotFound;
    case K8sErrorReason::kAlreadyExists:
      return absl::StatusCode::kAlreadyExists;
    case K8sErrorReason::kConflict:
      return absl::StatusCode::kAborted;
    case K8sErrorReason::kGone:
    case K8sErrorReason::kExpired:
      return absl::StatusCode::kOutOfRange;
    case K8sErrorReason::kInvalid:
    case K8sErrorReason::kBadRequest:
    case K8sErrorReason::kNotAcceptable:
    case K8sErrorReason::kRequestEntityTooLarge:
    case K8sErrorReason::kUnsupportedMediaType:
      return absl::StatusCode::kInvalidArgument;
    case K8sErrorReason::kServerTimeout:
    case K8sErrorReason::kTimeout:
      return absl::StatusCode::kDeadlineExceeded;
    case K8sErrorReason::kTooManyRequests:
      return absl::StatusCode::kResourceExhausted;
    case K8sErrorReason::kMethodNotAllowed:
      return absl::StatusCode::kUnimplemented;
    case K8sErrorReason::kInternalError:
      return absl::StatusCode::kInternal;
    case K8sErrorReason::kServiceUnavailable:
      return absl::StatusCode::kUnavailable;
    case K8sErrorReason::kUnknown:
      break;
  }
  if (httpCode >= 500) return absl::StatusCode::kInternal;
  return absl::StatusCode::kUnknown;
}

std::string stringField(const nlohmann::json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_string()) return "";
  return it->get<std::string>();
}

}  // namespace

std::string_view k8sErrorReasonName(K8sErrorReason reason) {
  for (const auto& [r, name] : kNames) {
    if (r == reason) return name;
  }
  return "";
}

K8sErrorReason parseK8sErrorReason(std::string_view name) {
  for (const auto& [r, n] : kNames) {
    if (n == name) return r;
  }
  return K8sErrorReason::kUnknown;
}

K8sErrorReason reasonForHttpCode(int code) {
  switch (code) {
    case 400:
      return K8sErrorReason::kBadRequest;
    case 401:
      return K8sErrorReason::kUnauthorized;
    case 403:
      return K8sErrorReason::kForbidden;
    case 404:
      return K8sErrorReason::kNotFound;
    case 405:
      return K8sErrorReason::kMethodNotAllowed;
    case 406:
      return K8sErrorReason::kNotAcceptable;
    case 409:
      return K8sErrorReason::kConflict;
    case 410:
      return K8sErrorReason::kGone;
    case 413:
      return K8sErrorReason::kRequestEntityTooLarge;
    case 415:
      return K8sErrorReason::kUnsupportedMediaType;
    case 422:
      return K8sErrorReason::kInvalid;
    case 429:
      return K8sErrorReason::kTooManyRequests;
    case 500:
      return K8sErrorReason::kInternalError;
    case 503:
      return K8sErrorReason::kServiceUnavailable;
    case 504:
      return K8sErrorReason::kServerTimeout;
    default:
      return K8sErrorReason::kUnknown;
  }
}

nlohmann::json K8sError::toJson() const {
  nlohmann::json details = nlohmann::json::object();
  if (!name.empty()) details["name"] = name;
  if (!group.empty()) details["group"] = group;
  if (!kind.empty()) details["kind"] = kind;
  if (retryAfterSeconds > 0) details["retryAfterSeconds"] = retryAfterSeconds;
  if (!causes.empty()) {
    details["causes"] = nlohmann::json::array();
    for (const StatusCause& c : causes) {
      details["causes"].push_back({{"reason", c.reason}, {"message", c.message}, {"field", c.field}});
    }
  }
  return {{"kind", "Status"},
          {"apiVersion", "v1"},
          {"metadata", nlohmann::json::object()},
          {"status", "Failure"},
          {"message", message},
          {"reason", std::string(k8sErrorReasonName(reason))},
          {"details", std::move(details)},
          {"code", code}};
}

K8sError parseStatusObject(const nlohmann::json& status) {
  K8sError out;
  if (!status.is_object()) return out;
  if (auto it = status.find("code"); it != status.end() && it->is_number_integer()) out.code = it->get<int>();
  out.message = stringField(status, "message");
  std::string reason = stringField(status, "reason");
  out.reason = reason.empty() ? reasonForHttpCode(out.code) : parseK8sErrorReason(reason);
  if (out.reason == K8sErrorReason::kUnknown) out.reason = reasonForHttpCode(out.code);
  if (auto it = status.find("details"); it != status.end() && it->is_object()) {
    const nlohmann::json& d = *it;
    out.name = stringField(d, "name");
    out.group = stringField(d, "group");
    out.kind = stringField(d, "kind");
    if (auto ra = d.find("retryAfterSeconds"); ra != d.end() && ra->is_number_integer()) {
      out.retryAfterSeconds = ra->get<int>();
    }
    if (auto causes = d.find("causes"); causes != d.end() && causes->is_array()) {
      for (const nlohmann::json& c : *causes) {
        if (!c.is_object()) continue;
        out.causes.push_back({stringField(c, "reason"), stringField(c, "message"), stringField(c, "field")});
      }
    }
  }
  return out;
}

absl::Status statusFromK8sError(const K8sError& error, std::string_view what) {
  std::string message = strCat(what, what.empty() ? "" : ": ", "HTTP ", error.code);
  std::string_view reasonName = k8sErrorReasonName(error.reason);
  if (!reasonName.empty()) message = strCat(message, " ", reasonName);
  if (!error.message.empty()) message = strCat(message, ": ", error.message);
  absl::Status status(canonicalCode(error.reason, error.code), message);
  status.SetPayload(kPayloadUrl, absl::Cord(error.toJson().dump()));
  return status;
}

absl::Status statusFromResponse(int httpCode, std::string_view body, std::string_view what) {
  K8sError error;
  bool parsed = false;
  try {
    nlohmann::json j = nlohmann::json::parse(body);
    if (j.is_object() && stringField(j, "kind") == "Status") {
      error = parseStatusObject(j);
      parsed = true;
    }
  } catch (const nlohmann::json::exception&) {
    // Not JSON: keep the raw body as the message.
  }
  if (!parsed) {
    error.reason = reasonForHttpCode(httpCode);
    error.message = std::string(body.substr(0, kMaxQuotedBody));
  }
  // The HTTP code wins over the body's (a proxy may answer for the server).
  if (error.code == 0 || !parsed) error.code = httpCode;
  return statusFromK8sError(error, what);
}

std::optional<K8sError> k8sError(const absl::Status& status) {
  if (status.ok()) return std::nullopt;
  auto payload = status.GetPayload(kPayloadUrl);
  if (!payload) return std::nullopt;
  try {
    return parseStatusObject(nlohmann::json::parse(std::string(*payload)));
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

K8sErrorReason k8sReason(const absl::Status& status) {
  std::optional<K8sError> e = k8sError(status);
  return e ? e->reason : K8sErrorReason::kUnknown;
}

}  // namespace tandem::k8s
