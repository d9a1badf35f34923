#pragma once
// Chat messages -> prompt tokens, in the chat format of the served model.
// The format is picked once, when the model loads, from what its tokenizer
// declares (engine::Tokenizer::chatFormat()), and handed to the request
// parser in ApiLimits; nothing here looks at the tokenizer's type.
//
//   kTandem (the built-in byte-tokenizer model), one block per message, then
//   the assistant header the model continues:
//     <s><|system|>\n{content}\n<|user|>\n{content}\n ... <|assistant|>\n
//   kLlama2 (SentencePiece, Llama-2 family), <s>/</s> around each exchange:
//     <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>[INST] {user} [/INST]
//     A system message with no user turn still opens an instruction block.
//
// A model whose tokenizer_config.json has a `chat_template` (Llama 3,
// Qwen, ...) is rendered with that template instead (ChatTemplate below),
// by the Jinja subset in src/jinja, byte-identical to Hugging Face's
// apply_chat_template. Pure functions; thread-safe.

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/tool_calls.h"
#include "engine/model/tokenizer.h"
#include "src/common/clock.h"
#include "src/common/status.h"
#include "src/jinja/template.h"

namespace tandem::agent {

// One message of a chat request, its role already one of system, user, assistant.
struct ChatMessage {
  std::string role;
  std::string content;
};

// The prompt tokens of `messages` in `format`, <s> included.
std::vector<TokenId> renderChat(engine::ChatFormat format, const std::vector<ChatMessage>& messages,
                                const engine::Tokenizer& tokenizer);

// A model's own chat template, parsed once when the model loads and shared
// read-only by every request (rendering is thread-safe).
struct ChatTemplate {
  // tokenizer_config.json's `chat_template`: the string, or from the list
  // form [{name, template}] the one named "default".
  std::shared_ptr<const jinja::Template> default_template;
  // The list form's "tool_use" template, used when the request has tools;
  // null: default_template serves those too.
  std::shared_ptr<const jinja::Template> tool_use_template;
  // bos_token / eos_token (a string or {"content": ...}); "" when absent.
  std::string bos_token;
  std::string eos_token;
  // How the model writes tool calls, read off the template that renders
  // tools (tool_use_template, else default_template): tool_calls.h.
  ToolCallFormat tool_call_format = ToolCallFormat::kNone;
};

// The chat template of a parsed tokenizer_config.json; nullopt when it has
// none (the model keeps the tokenizer's ChatFormat). `where` names the file
// in errors: a template that does not parse, a chat_template of the wrong
// type, a list without "default".
[[nodiscard]] absl::StatusOr<std::optional<ChatTemplate>> parseChatTemplate(const nlohmann::json& tokenizer_config,
                                                                            std::string_view where);

// parseChatTemplate of `model_dir`/tokenizer_config.json; nullopt also when
// the directory has no such file (a tokenizer.model-only Llama 2).
[[nodiscard]] absl::StatusOr<std::optional<ChatTemplate>> loadChatTemplate(const std::string& model_dir);

// The prompt text of a chat request, as Hugging Face's apply_chat_template
// renders it: the template sees `messages` as given (role, content as a
// string or parts, tool_calls, tool_call_id, name, reasoning_content...),
// `tools` (undefined when null or empty), add_generation_prompt=true,
// bos_token, eos_token, and each key of `kwargs` (the request's
// chat_template_kwargs, e.g. enable_thinking; an object or null).
// strftime_now() formats `now` in UTC. Keys keep their order (ordered_json),
// so `tools | tojson` prints the client's key order, as Python would.
// Errors (InvalidArgument): the template's raise_exception message as is
// (payload jinja::kRaisedPayload), or "chat_template:line:col: ..." for
// anything else the template failed on. The text still has to be
// tokenized (special tokens recognized, no BOS added: the template writes it).
[[nodiscard]] absl::StatusOr<std::string> renderChatTemplate(const ChatTemplate& chat_template,
                                                             const nlohmann::ordered_json& messages,
                                                             const nlohmann::ordered_json& tools,
                                                             const nlohmann::ordered_json& kwargs, WallTime now);

}  // namespace tandem::agent
