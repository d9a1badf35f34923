#include "agent/openai_tools.h"

#include <algorithm>

#include "agent/openai_fields.h"
#include "src/common/strings.h"

namespace tandem::agent {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

// A 400 naming `path` in param and message: "tools[1].function.name: required".
ApiError fieldError(const std::string& path, std::string_view what) {
  return invalidField(path, strCat(path, ": ", what));
}

// OpenAI's rule for function names: a-z, A-Z, 0-9, _ and -, at most 64.
bool isFunctionName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

std::optional<ApiError> parseTool(const json& tool, size_t i, std::vector<std::string>* names) {
  const std::string path = strCat("tools[", i, "]");
  if (!tool.is_object()) return fieldError(path, strCat("must be an object, got ", jsonTypeName(tool)));
  auto type = tool.find("type");
  if (type == tool.end() || type->is_null()) return fieldError(path + ".type", "required");
  if (!type->is_string() || type->get<std::string>() != "function") {
    return fieldError(path + ".type", strCat("must be \"function\", got ", type->dump()));
  }
  auto fn = tool.find("function");
  if (fn == tool.end() || fn->is_null()) return fieldError(path + ".function", "required");
  if (!fn->is_object()) return fieldError(path + ".function", strCat("must be an object, got ", jsonTypeName(*fn)));
  auto name = fn->find("name");
  if (name == fn->end() || name->is_null()) return fieldError(path + ".function.name", "required");
  if (!name->is_string() || !isFunctionName(name->get<std::string>())) {
    return fieldError(path + ".function.name", strCat("must be 1 to 64 of a-z, A-Z, 0-9, _ and -, got ", name->dump()));
  }
  const std::string n = name->get<std::string>();
  if (std::find(names->begin(), names->end(), n) != names->end()) {
    return fieldError(path + ".function.name", strCat("\"", n, "\" is already the name of an earlier tool"));
  }
  auto description = fn->find("description");
  if (description != fn->end() && !description->is_null() && !description->is_string()) {
    return fieldError(path + ".function.description", strCat("must be a string, got ", jsonTypeName(*description)));
  }
  auto parameters = fn->find("parameters");
  if (parameters != fn->end() && !parameters->is_null() && !parameters->is_object()) {
    return fieldError(path + ".function.parameters",
                      strCat("must be a JSON Schema object, got ", jsonTypeName(*parameters)));
  }
  auto strict = fn->find("strict");
  if (strict != fn->end() && !strict->is_null() && !strict->is_boolean()) {
    return fieldError(path + ".function.strict", strCat("must be a boolean, got ", jsonTypeName(*strict)));
  }
  names->push_back(n);
  return std::nullopt;
}

// tool_choice into `out`, given the tools' names.
std::optional<ApiError> parseToolChoice(const json& body, ToolRequest* out) {
  auto it = body.find("tool_choice");
  if (it == body.end() || it->is_null()) return std::nullopt;
  const json& c = *it;
  if (c.is_string()) {
    const std::string v = c.get<std::string>();
    if (v == "none") {
      out->give_tools = false;
      out->rules.names.clear();
      return std::nullopt;
    }
    if (v != "auto" && v != "required") {
      return fieldError("tool_choice",
                        strCat("must be \"auto\", \"none\", \"required\" or a function, got ", c.dump()));
    }
    if (out->rules.names.empty()) return fieldError("tool_choice", strCat("\"", v, "\" needs 'tools'"));
    return std::nullopt;
  }
  if (!c.is_object()) {
    return fieldError("tool_choice", strCat("must be a string or an object, got ", jsonTypeName(c)));
  }
  auto type = c.find("type");
  if (type == c.end() || !type->is_string() || type->get<std::string>() != "function") {
    return fieldError("tool_choice.type", "must be \"function\"");
  }
  auto fn = c.find("function");
  if (fn == c.end() || !fn->is_object()) return fieldError("tool_choice.function", "required (an object)");
  auto name = fn->find("name");
  if (name == fn->end() || !name->is_string()) return fieldError("tool_choice.function.name", "required");
  const std::string n = name->get<std::string>();
  if (std::find(out->rules.names.begin(), out->rules.names.end(), n) == out->rules.names.end()) {
    return fieldError("tool_choice.function.name", strCat("\"", n, "\" is not one of 'tools'"));
  }
  out->rules.forced_name = n;
  return std::nullopt;
}

std::optional<ApiError> prepareToolCall(ordered_json* call, const std::string& path) {
  if (!call->is_object()) return fieldError(path, "must be an object");
  auto id = call->find("id");
  if (id == call->end() || !id->is_string()) return fieldError(path + ".id", "required (a string)");
  auto type = call->find("type");
  if (type != call->end() && !type->is_null() && !(type->is_string() && type->get<std::string>() == "function")) {
    return fieldError(path + ".type", "must be \"function\"");
  }
  auto fn = call->find("function");
  if (fn == call->end() || !fn->is_object()) return fieldError(path + ".function", "required (an object)");
  auto name = fn->find("name");
  if (name == fn->end() || !name->is_string()) return fieldError(path + ".function.name", "required (a string)");
  auto args = fn->find("arguments");
  if (args == fn->end() || !args->is_string()) {
    return fieldError(path + ".function.arguments", "required (a JSON object, as a string)");
  }
  ordered_json parsed = ordered_json::parse(args->get<std::string>(), nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object()) return fieldError(path + ".function.arguments", "must be a JSON object, as a string");
  *args = std::move(parsed);
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parseToolRequest(const json& body, bool has_chat_template, ToolRequest* out) {
  *out = ToolRequest{};
  auto tools = body.find("tools");
  if (tools != body.end() && !tools->is_null()) {
    if (!tools->is_array()) return fieldError("tools", strCat("must be an array, got ", jsonTypeName(*tools)));
    for (size_t i = 0; i < tools->size(); ++i) {
      if (auto e = parseTool((*tools)[i], i, &out->rules.names)) return e;
    }
  }
  std::optional<bool> parallel;
  if (auto e = readBool(body, "parallel_tool_calls", &parallel)) return e;
  out->rules.parallel = parallel.value_or(true);
  out->give_tools = !out->rules.names.empty();
  if (auto e = parseToolChoice(body, out)) return e;
  if (!out->rules.names.empty() && !has_chat_template) {
    return fieldError("tools",
                      "this model has no chat template (tokenizer_config.json chat_template), so its prompt format "
                      "cannot render tools");
  }
  return std::nullopt;
}

std::optional<ApiError> prepareToolMessages(ordered_json* messages) {
  if (!messages->is_array()) return std::nullopt;
  for (size_t i = 0; i < messages->size(); ++i) {
    ordered_json& m = (*messages)[i];
    if (!m.is_object()) continue;
    const std::string path = strCat("messages[", i, "]");
    auto role = m.find("role");
    const std::string r = role != m.end() && role->is_string() ? role->get<std::string>() : "";
    // Optional: not every template reads it (Llama 3.1's does not).
    auto id = m.find("tool_call_id");
    if (id != m.end() && !id->is_null() && !id->is_string())
      return fieldError(path + ".tool_call_id", "must be a string");
    auto calls = m.find("tool_calls");
    if (calls == m.end() || calls->is_null()) continue;
    if (r != "assistant") return fieldError(path + ".tool_calls", "only assistant messages have tool calls");
    if (!calls->is_array()) return fieldError(path + ".tool_calls", "must be an array");
    for (size_t j = 0; j < calls->size(); ++j) {
      if (auto e = prepareToolCall(&(*calls)[j], strCat(path, ".tool_calls[", j, "]"))) return e;
    }
  }
  return std::nullopt;
}

}  // namespace tandem::agent
