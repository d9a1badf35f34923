#include "e2e/apiserver/schema.h"

#include <algorithm>
#include <regex>

#include "e2e/apiserver/cel.h"
#include "src/common/strings.h"

namespace tandem::apiserver {

using nlohmann::json;

namespace {

std::string join(const std::string& path, const std::string& key) {
  return path.empty() ? key : strCat(path, ".", key);
}

bool preserves(const json& schema) {
  return schema.value("x-kubernetes-preserve-unknown-fields", false) ||
         schema.value("x-kubernetes-embedded-resource", false);
}

void prune(const json& schema, json& value, const std::string& path, bool root, std::vector<std::string>& unknown) {
  if (value.is_object()) {
    const json* props = schema.contains("properties") ? &schema["properties"] : nullptr;
    const json* additional = schema.contains("additionalProperties") ? &schema["additionalProperties"] : nullptr;
    for (auto it = value.begin(); it != value.end();) {
      const std::string key = it.key();
      if (root && (key == "apiVersion" || key == "kind" || key == "metadata")) {
        ++it;
        continue;
      }
      if (props != nullptr && props->contains(key)) {
        prune((*props)[key], it.value(), join(path, key), false, unknown);
        ++it;
      } else if (additional != nullptr && additional->is_object()) {
        prune(*additional, it.value(), join(path, key), false, unknown);
        ++it;
      } else if ((additional != nullptr && additional->is_boolean() && additional->get<bool>()) || preserves(schema)) {
        ++it;
      } else {
        unknown.push_back(join(path, key));
        it = value.erase(it);
      }
    }
  } else if (value.is_array() && schema.contains("items")) {
    for (size_t i = 0; i < value.size(); ++i)
      prune(schema["items"], value[i], strCat(path, "[", i, "]"), false, unknown);
  }
}

bool typeMatches(const std::string& type, const json& v) {
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "string") return v.is_string();
  if (type == "integer")
    return v.is_number_integer() ||
           (v.is_number_float() && v.get<double>() == static_cast<double>(static_cast<int64_t>(v.get<double>())));
  if (type == "number") return v.is_number();
  if (type == "boolean") return v.is_boolean();
  return true;
}

void validate(const json& schema, const json& value, const std::string& path, std::vector<StatusCause>& errors);

void validateNumber(const json& schema, const json& value, const std::string& path, std::vector<StatusCause>& errors) {
  double v = value.get<double>();
  if (schema.contains("minimum")) {
    double min = schema["minimum"].get<double>();
    bool exclusive = schema.value("exclusiveMinimum", false);
    if (exclusive ? v <= min : v < min) {
      errors.push_back(fieldInvalid(
          path, value,
          strCat(path, " in body should be greater than ", exclusive ? "" : "or equal to ", schema["minimum"].dump())));
    }
  }
  if (schema.contains("maximum")) {
    double max = schema["maximum"].get<double>();
    bool exclusive = schema.value("exclusiveMaximum", false);
    if (exclusive ? v >= max : v > max) {
      errors.push_back(fieldInvalid(
          path, value,
          strCat(path, " in body should be less than ", exclusive ? "" : "or equal to ", schema["maximum"].dump())));
    }
  }
}

void validateString(const json& schema, const json& value, const std::string& path, std::vector<StatusCause>& errors) {
  const std::string& s = value.get_ref<const std::string&>();
  if (schema.contains("minLength") && s.size() < schema["minLength"].get<size_t>()) {
    errors.push_back(fieldInvalid(
        path, value, strCat(path, " in body should be at least ", schema["minLength"].get<size_t>(), " chars long")));
  }
  if (schema.contains("maxLength") && s.size() > schema["maxLength"].get<size_t>()) {
    errors.push_back({"FieldValueTooLong",
                      strCat("Too long: may not be more than ", schema["maxLength"].get<size_t>(), " bytes"), path});
  }
  if (schema.contains("pattern") && schema["pattern"].is_string()) {
    try {
      if (!std::regex_search(s, std::regex(schema["pattern"].get<std::string>()))) {
        errors.push_back(fieldInvalid(
            path, value, strCat(path, " in body should match '", schema["pattern"].get<std::string>(), "'")));
      }
    } catch (const std::regex_error&) {
    }
  }
}

void validateArray(const json& schema, const json& value, const std::string& path, std::vector<StatusCause>& errors) {
  if (schema.contains("minItems") && value.size() < schema["minItems"].get<size_t>()) {
    errors.push_back(fieldInvalid(
        path, value, strCat(path, " in body should have at least ", schema["minItems"].get<size_t>(), " items")));
  }
  if (schema.contains("maxItems") && value.size() > schema["maxItems"].get<size_t>()) {
    errors.push_back(
        {"FieldValueTooMany",
         strCat("Too many: ", value.size(), ": must have at most ", schema["maxItems"].get<size_t>(), " items"), path});
  }
  if (schema.contains("items")) {
    for (size_t i = 0; i < value.size(); ++i) validate(schema["items"], value[i], strCat(path, "[", i, "]"), errors);
  }
}

void validateObject(const json& schema, const json& value, const std::string& path, std::vector<StatusCause>& errors) {
  if (schema.contains("required") && schema["required"].is_array()) {
    for (const auto& r : schema["required"]) {
      if (r.is_string() && !value.contains(r.get<std::string>()))
        errors.push_back(fieldRequired(join(path, r.get<std::string>())));
    }
  }
  for (auto it = value.begin(); it != value.end(); ++it) {
    if (path.empty() && (it.key() == "apiVersion" || it.key() == "kind" || it.key() == "metadata")) continue;
    if (schema.contains("properties") && schema["properties"].contains(it.key())) {
      validate(schema["properties"][it.key()], it.value(), join(path, it.key()), errors);
    } else if (schema.contains("additionalProperties") && schema["additionalProperties"].is_object()) {
      validate(schema["additionalProperties"], it.value(), join(path, it.key()), errors);
    }
  }
}

void validate(const json& schema, const json& value, const std::string& path, std::vector<StatusCause>& errors) {
  if (value.is_null()) {
    if (!schema.value("nullable", false) && schema.contains("type")) {
      errors.push_back(fieldTypeInvalid(
          path, value, strCat(path, " in body must be of type ", schema["type"].get<std::string>(), ": \"null\"")));
    }
    return;
  }
  if (schema.value("x-kubernetes-int-or-string", false)) {
    if (!value.is_string() && !value.is_number_integer()) {
      errors.push_back(fieldTypeInvalid(path, value, strCat(path, " in body must be of type integer or string")));
    }
    return;
  }
  if (schema.contains("type") && schema["type"].is_string()) {
    const std::string type = schema["type"];
    if (!typeMatches(type, value)) {
      std::string got = value.is_string()           ? "string"
                        : value.is_boolean()        ? "boolean"
                        : value.is_number_integer() ? "integer"
                        : value.is_number()         ? "number"
                        : value.is_array()          ? "array"
                                                    : "object";
      // As apiextensions reports it: the value shown is the type found.
      errors.push_back(fieldTypeInvalid(path, got, strCat(path, " in body must be of type ", type, ": \"", got, "\"")));
      return;
    }
  }
  if (schema.contains("enum") && schema["enum"].is_array()) {
    const json& options = schema["enum"];
    if (std::find(options.begin(), options.end(), value) == options.end()) {
      errors.push_back(fieldNotSupported(path, value, std::vector<json>(options.begin(), options.end())));
    }
  }
  if (value.is_number()) validateNumber(schema, value, path, errors);
  if (value.is_string()) validateString(schema, value, path, errors);
  if (value.is_array()) validateArray(schema, value, path, errors);
  if (value.is_object()) validateObject(schema, value, path, errors);
}

void defaults(const json& schema, json& value) {
  if (value.is_object() && schema.contains("properties")) {
    for (auto it = schema["properties"].begin(); it != schema["properties"].end(); ++it) {
      if (!value.contains(it.key()) && it.value().contains("default")) value[it.key()] = it.value()["default"];
      if (value.contains(it.key())) defaults(it.value(), value[it.key()]);
    }
  } else if (value.is_object() && schema.contains("additionalProperties") &&
             schema["additionalProperties"].is_object()) {
    for (auto& [k, v] : value.items()) defaults(schema["additionalProperties"], v);
  } else if (value.is_array() && schema.contains("items")) {
    for (auto& item : value) defaults(schema["items"], item);
  }
}

}  // namespace

std::vector<std::string> pruneUnknownFields(const json& schema, json& object) {
  std::vector<std::string> unknown;
  prune(schema, object, "", true, unknown);
  return unknown;
}

void applyDefaults(const json& schema, json& object) { defaults(schema, object); }

namespace {

// x-kubernetes-validations at every node of `value` (and `old`, the same
// node before an update; null on a create), as the server evaluates them.
void validateRules(const json& schema, const json& value, const json* old, const std::string& path,
                   std::vector<StatusCause>& errors) {
  if (!schema.is_object() || value.is_null()) return;
  for (const json& rule : schema.value("x-kubernetes-validations", json::array())) {
    if (!rule.is_object() || !rule.contains("rule") || !rule["rule"].is_string()) continue;
    absl::StatusOr<CelProgram> program = CelProgram::compile(rule["rule"].get<std::string>());
    if (!program.ok()) continue;  // refused when the CRD was written
    if (program->usesOldSelf() && old == nullptr) continue;  // a transition rule: updates only
    absl::StatusOr<bool> ok = program->evaluate(value, old);
    const std::string what = value.is_object() ? "object" : value.is_array() ? "array" : value.dump();
    if (!ok.ok()) {
      errors.push_back({"FieldValueInvalid",
                        strCat("Invalid value: \"", what, "\": ", rule["rule"].get<std::string>(), ": ", ok.status().message()),
                        path});
    } else if (!*ok) {
      const std::string message = rule.value("message", strCat("failed rule: ", rule["rule"].get<std::string>()));
      errors.push_back({"FieldValueInvalid", strCat("Invalid value: \"", what, "\": ", message), path});
    }
  }
  if (value.is_object()) {
    for (auto it = value.begin(); it != value.end(); ++it) {
      const json* sub = nullptr;
      if (schema.contains("properties") && schema["properties"].contains(it.key())) {
        sub = &schema["properties"][it.key()];
      } else if (schema.contains("additionalProperties") && schema["additionalProperties"].is_object()) {
        sub = &schema["additionalProperties"];
      }
      if (sub == nullptr) continue;
      const json* old_sub = old != nullptr && old->is_object() && old->contains(it.key()) ? &(*old)[it.key()] : nullptr;
      validateRules(*sub, it.value(), old_sub, join(path, it.key()), errors);
    }
  } else if (value.is_array() && schema.contains("items")) {
    for (size_t i = 0; i < value.size(); ++i) validateRules(schema["items"], value[i], nullptr, strCat(path, "[", i, "]"), errors);
  }
}

void compileRules(const json& schema, const std::string& path, std::vector<StatusCause>& errors) {
  if (!schema.is_object()) return;
  const json rules = schema.value("x-kubernetes-validations", json::array());
  for (size_t i = 0; i < rules.size(); ++i) {
    const std::string p = strCat(path, ".x-kubernetes-validations[", i, "].rule");
    if (!rules[i].is_object() || !rules[i].contains("rule") || !rules[i]["rule"].is_string()) {
      errors.push_back(fieldRequired(p));
      continue;
    }
    const std::string rule = rules[i]["rule"];
    absl::StatusOr<CelProgram> program = CelProgram::compile(rule);
    if (!program.ok()) {
      errors.push_back({"FieldValueInvalid", strCat("Invalid value: ", json(rule).dump(), ": ", program.status().message()), p});
    }
  }
  if (schema.contains("properties") && schema["properties"].is_object()) {
    for (const auto& [k, sub] : schema["properties"].items()) compileRules(sub, strCat(path, ".properties[", k, "]"), errors);
  }
  for (const char* key : {"items", "additionalProperties"}) {
    if (schema.contains(key)) compileRules(schema[key], strCat(path, ".", key), errors);
  }
}

}  // namespace

std::vector<StatusCause> validateSchema(const json& schema, const json& object, const json* old) {
  std::vector<StatusCause> errors;
  validate(schema, object, "", errors);
  if (errors.empty()) validateRules(schema, object, old, "", errors);
  return errors;
}

std::vector<StatusCause> compileValidationRules(const json& schema, const std::string& path) {
  std::vector<StatusCause> errors;
  compileRules(schema, path, errors);
  return errors;
}

}  // namespace tandem::apiserver
