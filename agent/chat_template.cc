#include "agent/chat_template.h"

#include <filesystem>

#include "engine/model/files.h"
#include "src/common/strings.h"

namespace tandem::agent {
namespace {

void appendText(std::vector<TokenId>& out, const engine::Tokenizer& tok, std::string_view text) {
  std::vector<TokenId> t = tok.encode(text);
  out.insert(out.end(), t.begin(), t.end());
}

void appendBos(std::vector<TokenId>& out, const engine::Tokenizer& tok) {
  if (tok.bosId() >= 0) out.push_back(tok.bosId());
}

std::vector<TokenId> renderTandem(const std::vector<ChatMessage>& messages, const engine::Tokenizer& tok) {
  std::vector<TokenId> out;
  appendBos(out, tok);
  std::string text;
  for (const ChatMessage& m : messages) text += strCat("<|", m.role, "|>\n", m.content, "\n");
  text += "<|assistant|>\n";
  appendText(out, tok, text);
  return out;
}

// [INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>[INST] ...
std::vector<TokenId> renderLlama2(const std::vector<ChatMessage>& messages, const engine::Tokenizer& tok) {
  std::vector<TokenId> out;
  std::string system;
  size_t i = 0;
  if (!messages.empty() && messages[0].role == "system") {
    system = messages[0].content;
    i = 1;
  }
  bool first_user = true;
  for (; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "assistant") {
      appendText(out, tok, strCat(" ", m.content, " "));
      if (tok.eosId() >= 0) out.push_back(tok.eosId());
      continue;
    }
    appendBos(out, tok);
    std::string user = m.content;
    if (first_user && !system.empty()) user = strCat("<<SYS>>\n", system, "\n<</SYS>>\n\n", m.content);
    first_user = false;
    appendText(out, tok, strCat("[INST] ", user, " [/INST]"));
  }
  if (first_user && !system.empty()) {
    // No user turn: the system prompt still opens an instruction block.
    appendBos(out, tok);
    appendText(out, tok, strCat("[INST] <<SYS>>\n", system, "\n<</SYS>>\n\n [/INST]"));
  }
  return out;
}

// bos_token / eos_token: a string, or an added-token object {"content": ...}.
std::string specialToken(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  return "";
}

absl::StatusOr<std::shared_ptr<const jinja::Template>> parseTemplate(const nlohmann::json& source,
                                                                     std::string_view where, std::string_view what) {
  if (!source.is_string()) {
    return absl::InvalidArgumentError(strCat(where, ": ", what, " must be a string, got ", source.type_name()));
  }
  auto t = jinja::Template::parse(source.get_ref<const std::string&>(), {.name = "chat_template"});
  if (!t.ok()) return absl::InvalidArgumentError(strCat(where, ": ", what, ": ", t.status().message()));
  return std::shared_ptr<const jinja::Template>(std::move(*t));
}

}  // namespace

absl::StatusOr<std::optional<ChatTemplate>> parseChatTemplate(const nlohmann::json& config, std::string_view where) {
  if (!config.is_object()) return absl::InvalidArgumentError(strCat(where, ": not a JSON object"));
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return std::nullopt;
  ChatTemplate t;
  std::string tools_source;  // the source of the template that renders tools
  if (it->is_string()) {
    TANDEM_ASSIGN_OR_RETURN(t.default_template, parseTemplate(*it, where, "chat_template"));
    tools_source = it->get<std::string>();
  } else if (it->is_array()) {
    // [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
    for (size_t i = 0; i < it->size(); ++i) {
      const nlohmann::json& e = (*it)[i];
      const std::string what = strCat("chat_template[", i, "]");
      if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("template")) {
        return absl::InvalidArgumentError(strCat(where, ": ", what, " must be {\"name\": string, \"template\": string}"));
      }
      const std::string name = e["name"].get<std::string>();
      if (name != "default" && name != "tool_use") continue;
      TANDEM_ASSIGN_OR_RETURN(auto parsed, parseTemplate(e["template"], where, strCat(what, " (", name, ")")));
      (name == "default" ? t.default_template : t.tool_use_template) = std::move(parsed);
      if (name == "tool_use" || tools_source.empty()) tools_source = e["template"].get<std::string>();
    }
    if (!t.default_template) {
      return absl::InvalidArgumentError(strCat(where, ": chat_template lists no template named \"default\""));
    }
  } else {
    return absl::InvalidArgumentError(
        strCat(where, ": chat_template must be a string or a list of named templates, got ", it->type_name()));
  }
  t.bos_token = specialToken(config, "bos_token");
  t.eos_token = specialToken(config, "eos_token");
  t.tool_call_format = toolCallFormatOf(tools_source);
  return t;
}

absl::StatusOr<std::optional<ChatTemplate>> loadChatTemplate(const std::string& model_dir) {
  const std::string path = strCat(model_dir, "/tokenizer_config.json");
  if (!std::filesystem::exists(path)) return std::nullopt;
  TANDEM_ASSIGN_OR_RETURN(std::string text, engine::readFile(path));
  auto config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) return absl::InvalidArgumentError(strCat(path, ": invalid JSON"));
  return parseChatTemplate(config, path);
}

absl::StatusOr<std::string> renderChatTemplate(const ChatTemplate& chat_template, const nlohmann::ordered_json& messages,
                                               const nlohmann::ordered_json& tools,
                                               const nlohmann::ordered_json& kwargs, WallTime now) {
  const bool has_tools = !tools.is_null() && !(tools.is_array() && tools.empty());
  const jinja::Template& t = has_tools && chat_template.tool_use_template ? *chat_template.tool_use_template
                                                                          : *chat_template.default_template;
  jinja::Object vars;
  vars.items.reserve(6 + (kwargs.is_object() ? kwargs.size() : 0));
  vars.set("messages", jinja::Value::fromJson(messages));
  if (has_tools) vars.set("tools", jinja::Value::fromJson(tools));
  vars.set("add_generation_prompt", jinja::Value(true));
  vars.set("bos_token", jinja::Value(chat_template.bos_token));
  vars.set("eos_token", jinja::Value(chat_template.eos_token));
  if (kwargs.is_object()) {
    for (auto it = kwargs.begin(); it != kwargs.end(); ++it) vars.set(it.key(), jinja::Value::fromJson(it.value()));
  }
  return t.render(vars, {.now = now});
}

std::vector<TokenId> renderChat(engine::ChatFormat format, const std::vector<ChatMessage>& messages,
                                const engine::Tokenizer& tokenizer) {
  switch (format) {
    case engine::ChatFormat::kLlama2:
      return renderLlama2(messages, tokenizer);
    case engine::ChatFormat::kTandem:
      break;
  }
  return renderTandem(messages, tokenizer);
}

}  // namespace tandem::agent
