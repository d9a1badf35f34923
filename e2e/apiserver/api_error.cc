#include "e2e/apiserver/api_error.h"

#include "src/common/strings.h"

namespace tandem::apiserver {

using nlohmann::json;

namespace {

std::string qualified(const std::string& resource, const std::string& group) {
  return group.empty() ? resource : strCat(resource, ".", group);
}

json baseDetails(const std::string& name, const std::string& group, const std::string& kind) {
  json d = json::object();
  if (!name.empty()) d["name"] = name;
  if (!group.empty()) d["group"] = group;
  if (!kind.empty()) d["kind"] = kind;
  return d;
}

// How field.Error prints a value: strings quoted, everything else as JSON.
std::string printValue(const json& value) { return value.dump(); }

}  // namespace

ApiError::ApiError(int code, std::string reason, std::string message)
    : code_(code), reason_(std::move(reason)), message_(std::move(message)) {}

json ApiError::toStatus() const {
  json s = {{"kind", "Status"},    {"apiVersion", "v1"},  {"metadata", json::object()},
            {"status", "Failure"}, {"message", message_}, {"reason", reason_},
            {"code", code_}};
  if (!details.is_null()) s["details"] = details;
  return s;
}

ApiError notFound(const std::string& resource, const std::string& group, const std::string& name) {
  ApiError e(404, "NotFound", strCat(qualified(resource, group), " \"", name, "\" not found"));
  e.details = baseDetails(name, group, resource);
  return e;
}

ApiError alreadyExists(const std::string& resource, const std::string& group, const std::string& name) {
  ApiError e(409, "AlreadyExists", strCat(qualified(resource, group), " \"", name, "\" already exists"));
  e.details = baseDetails(name, group, resource);
  return e;
}

ApiError conflict(const std::string& resource, const std::string& group, const std::string& name,
                  const std::string& why) {
  ApiError e(409, "Conflict",
             strCat("Operation cannot be fulfilled on ", qualified(resource, group), " \"", name, "\": ", why));
  e.details = baseDetails(name, group, resource);
  return e;
}

ApiError staleConflict(const std::string& resource, const std::string& group, const std::string& name) {
  return conflict(resource, group, name,
                  "the object has been modified; please apply your changes to the latest version and try again");
}

ApiError invalid(const std::string& kind, const std::string& group, const std::string& name,
                 const std::vector<StatusCause>& causes) {
  std::string list;
  for (size_t i = 0; i < causes.size(); ++i) {
    if (i > 0) list += ", ";
    list += causes[i].field.empty() ? causes[i].message : strCat(causes[i].field, ": ", causes[i].message);
  }
  if (causes.size() > 1) list = strCat("[", list, "]");
  ApiError e(422, "Invalid", strCat(qualified(kind, group), " \"", name, "\" is invalid: ", list));
  e.details = baseDetails(name, group, kind);
  json c = json::array();
  for (const auto& cause : causes) {
    c.push_back({{"reason", cause.reason}, {"message", cause.message}, {"field", cause.field}});
  }
  e.details["causes"] = c;
  return e;
}

ApiError badRequest(const std::string& message) { return ApiError(400, "BadRequest", message); }
ApiError forbidden(const std::string& message) { return ApiError(403, "Forbidden", message); }
ApiError expired(const std::string& message) { return ApiError(410, "Expired", message); }
ApiError methodNotAllowed() {
  return ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource");
}
ApiError unsupportedMediaType(const std::string& message) { return ApiError(415, "UnsupportedMediaType", message); }
ApiError notAcceptable(const std::string& message) { return ApiError(406, "NotAcceptable", message); }
ApiError internalError(const std::string& message) {
  ApiError e(500, "InternalError", strCat("Internal error occurred: ", message));
  e.details = {{"causes", json::array({{{"message", message}}})}};
  return e;
}
ApiError pathNotFound() {
  ApiError e(404, "NotFound", "the server could not find the requested resource");
  e.details = json::object();
  return e;
}

StatusCause fieldRequired(const std::string& field, const std::string& detail) {
  return {"FieldValueRequired", detail.empty() ? "Required value" : strCat("Required value: ", detail), field};
}
StatusCause fieldInvalid(const std::string& field, const json& value, const std::string& detail) {
  return {"FieldValueInvalid", strCat("Invalid value: ", printValue(value), ": ", detail), field};
}
StatusCause fieldNotSupported(const std::string& field, const json& value, const std::vector<json>& supported) {
  std::string list;
  for (size_t i = 0; i < supported.size(); ++i) list += strCat(i > 0 ? ", " : "", printValue(supported[i]));
  return {"FieldValueNotSupported", strCat("Unsupported value: ", printValue(value), ": supported values: ", list),
          field};
}
StatusCause fieldForbidden(const std::string& field, const std::string& detail) {
  return {"FieldValueForbidden", strCat("Forbidden: ", detail), field};
}
StatusCause fieldTypeInvalid(const std::string& field, const json& value, const std::string& detail) {
  return {"FieldValueTypeInvalid", strCat("Invalid value: ", printValue(value), ": ", detail), field};
}

}  // namespace tandem::apiserver
