#include "agent/openai_fields.h"

#include <cmath>

#include "src/common/strings.h"

namespace tandem::agent {

using nlohmann::json;

namespace {

// A field of one JSON type (`is_type`, named `kind` in the error).
template <typename T>
std::optional<ApiError> readAs(const json& body, const char* key, bool (json::*is_type)() const noexcept,
                               std::string_view kind, std::optional<T>* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!((*it).*is_type)()) {
    return invalidField(key, strCat("'", key, "' must be ", kind, ", got ", jsonTypeName(*it)));
  }
  *out = it->get<T>();
  return std::nullopt;
}

}  // namespace

ApiError invalidField(std::string param, std::string message, std::string code) {
  ApiError e;
  e.status = 400;
  e.param = std::move(param);
  e.message = std::move(message);
  e.code = std::move(code);
  return e;
}

std::string jsonTypeName(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    case json::value_t::number_float:
      return "a number";
    default:
      return "an integer";
  }
}

std::optional<ApiError> readInt(const json& body, const char* key, std::optional<int64_t>* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    return invalidField(key, strCat("'", key, "' is too large"));
  }
  if (it->is_number_integer()) {
    *out = it->get<int64_t>();
    return std::nullopt;
  }
  if (it->is_number_float() && std::floor(it->get<double>()) == it->get<double>()) {
    // A whole number written as a float (e.g. 1e3); beyond 2^53 it is no longer exact.
    if (std::abs(it->get<double>()) >= 9e15) return invalidField(key, strCat("'", key, "' is too large"));
    *out = static_cast<int64_t>(it->get<double>());
    return std::nullopt;
  }
  return invalidField(key, strCat("'", key, "' must be an integer, got ", jsonTypeName(*it)));
}

std::optional<ApiError> readNumber(const json& body, const char* key, std::optional<double>* out) {
  return readAs(body, key, &json::is_number, "a number", out);
}

std::optional<ApiError> readBool(const json& body, const char* key, std::optional<bool>* out) {
  return readAs(body, key, &json::is_boolean, "a boolean", out);
}

std::optional<ApiError> readString(const json& body, const char* key, std::optional<std::string>* out) {
  return readAs(body, key, &json::is_string, "a string", out);
}

}  // namespace tandem::agent
