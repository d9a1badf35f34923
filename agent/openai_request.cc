#include "agent/openai_request.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "agent/chat_template.h"
#include "agent/openai_fields.h"
#include "agent/openai_tools.h"
#include "src/common/strings.h"

namespace tandem::agent {
namespace {

using nlohmann::json;

// The parts of parseRequest, in the order it calls them. Each reads its
// fields of `body`, writes its part of the request and returns the first
// error it finds.

// `model` must name the one model served here (404 otherwise, as OpenAI does).
std::optional<ApiError> parseModel(const json& body, const ApiLimits& limits, std::string* model) {
  std::optional<std::string> name;
  if (auto e = readString(body, "model", &name)) return e;
  if (!name) return invalidField("model", "'model' is required");
  if (*name != limits.model_name) {
    ApiError e;
    e.status = 404;
    e.param = "model";
    e.code = "model_not_found";
    e.message = strCat("the model '", *name, "' does not exist here; this server serves '", limits.model_name, "'");
    return e;
  }
  *model = std::move(*name);
  return std::nullopt;
}

bool isStringEqual(const json& v, std::string_view want) { return v.is_string() && v.get<std::string>() == want; }

// Whether `v` is the value that leaves unsupported feature `key` off (the
// API's default, or an explicit "none"), so the request means nothing
// this server would ignore.
bool isNoOp(std::string_view key, const json& v) {
  if (v.is_null()) return true;
  if (key == "best_of") return v.is_number_integer() && v == json(1);
  if (key == "echo" || key == "logprobs") return v.is_boolean() && !v.get<bool>();
  if (key == "top_logprobs") return v.is_number_integer() && v == json(0);
  if (key == "suffix") return isStringEqual(v, "");
  if (key == "functions") return v.is_array() && v.empty();
  if (key == "logit_bias") return v.is_object() && v.empty();
  if (key == "response_format") {
    if (!v.is_object()) return false;
    auto type = v.find("type");
    return v.empty() || (v.size() == 1 && type != v.end() && isStringEqual(*type, "text"));
  }
  return false;
}

// Features this server does not have (logprobs, best_of, the legacy
// functions, ...) and n > 1: refused rather than ignored, unless the value
// leaves them off. Tools are chat's (openai_tools.h).
std::optional<ApiError> refuseUnsupported(Endpoint endpoint, const json& body) {
  if (endpoint == Endpoint::kCompletions) {
    for (const char* key : {"tools", "tool_choice"}) {
      auto it = body.find(key);
      if (it != body.end() && !it->is_null() && !(it->is_array() && it->empty()) && !isStringEqual(*it, "none")) {
        return invalidField(key, strCat("'", key, "' is only supported on /v1/chat/completions"));
      }
    }
  }
  for (const char* key :
       {"best_of", "echo", "logprobs", "top_logprobs", "suffix", "functions", "logit_bias", "response_format"}) {
    auto it = body.find(key);
    if (it != body.end() && !isNoOp(key, *it)) {
      return invalidField(key, strCat("'", key, "' is not supported by this server"));
    }
  }
  std::optional<int64_t> n;
  if (auto e = readInt(body, "n", &n)) return e;
  if (n && *n != 1) return invalidField("n", strCat("'n' must be 1 (one choice per request), got ", *n));
  return std::nullopt;
}

// <s> (when the model has one), then `text`.
void appendPromptText(std::vector<TokenId>& out, const engine::Tokenizer& tok, std::string_view text) {
  if (tok.bosId() >= 0) out.push_back(tok.bosId());
  std::vector<TokenId> t = tok.encode(text);
  out.insert(out.end(), t.begin(), t.end());
}

// A prompt given as token ids; each must be in the model's vocabulary.
// `where` names the array in messages ("prompt" or "prompt[0]").
std::optional<ApiError> parseTokenIds(const json& ids, const std::string& where, const engine::Tokenizer& tok,
                                      std::vector<TokenId>* prompt) {
  const uint64_t vocab = static_cast<uint64_t>(tok.vocabSize());
  for (size_t i = 0; i < ids.size(); ++i) {
    const json& v = ids[i];
    if (!v.is_number_integer()) {
      return invalidField("prompt", strCat("'", where, "[", i, "]' must be a token id (integer)"));
    }
    const bool known = v.is_number_unsigned()
                           ? v.get<uint64_t>() < vocab
                           : v.get<int64_t>() >= 0 && static_cast<uint64_t>(v.get<int64_t>()) < vocab;
    if (!known) {
      return invalidField("prompt", strCat("'", where, "[", i, "]' = ", v.dump(),
                                           " is not a token id of this model (0..", tok.vocabSize() - 1, ")"));
    }
    prompt->push_back(static_cast<TokenId>(v.get<int64_t>()));
  }
  return std::nullopt;
}

// Completions' `prompt`: a string, [string], token ids or [token ids].
std::optional<ApiError> parsePrompt(const json& body, const engine::Tokenizer& tok, std::vector<TokenId>* prompt) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) return invalidField("prompt", "'prompt' is required");
  const json& p = *it;
  if ((p.is_string() && p.get<std::string>().empty()) || (p.is_array() && p.empty()) ||
      (p.is_array() && p.size() == 1 && p[0].is_string() && p[0].get<std::string>().empty())) {
    return invalidField("prompt", "'prompt' must not be empty");
  }
  if (p.is_string()) {
    appendPromptText(*prompt, tok, p.get<std::string>());
    return std::nullopt;
  }
  if (p.is_array() && p.size() == 1 && p[0].is_string()) {
    appendPromptText(*prompt, tok, p[0].get<std::string>());
    return std::nullopt;
  }
  const bool batch_of_one = p.is_array() && p.size() == 1 && p[0].is_array();  // [[ids]], as the SDKs' types allow
  const json& ids = batch_of_one ? p[0] : p;
  if (ids.is_array() && !ids.empty() && ids[0].is_number_integer()) {
    return parseTokenIds(ids, batch_of_one ? "prompt[0]" : "prompt", tok, prompt);
  }
  if (p.is_array() && p.size() > 1 && (p[0].is_string() || p[0].is_array())) {
    return invalidField(
        "prompt", "batched prompts (several strings or token arrays) are not supported; send one prompt per request");
  }
  return invalidField("prompt",
                      strCat("'prompt' must be a string, [string] or an array of token ids, got ", jsonTypeName(p)));
}

// Message content: a string, or an array of {type:"text", text} parts.
std::optional<ApiError> parseMessageText(const json& content, size_t index, std::string* out) {
  std::string param = strCat("messages[", index, "].content");
  if (content.is_string()) {
    *out = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array()) {
    return invalidField(
        param, strCat("'", param, "' must be a string or an array of text parts, got ", jsonTypeName(content)));
  }
  out->clear();
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    if (!part.is_object() || !part.contains("type") || !isStringEqual(part["type"], "text") || !part.contains("text") ||
        !part["text"].is_string()) {
      return invalidField(param,
                          strCat("'", param, "[", i,
                                 "]' must be {\"type\": \"text\", \"text\": string}; only text content is supported"));
    }
    *out += part["text"].get<std::string>();
  }
  return std::nullopt;
}

// One message of `messages`: its role (developer counts as system) and text.
std::optional<ApiError> parseMessage(const json& m, size_t index, ChatMessage* out) {
  std::string param = strCat("messages[", index, "]");
  if (!m.is_object()) return invalidField(param, strCat("'", param, "' must be an object, got ", jsonTypeName(m)));
  auto role = m.find("role");
  if (role == m.end() || !role->is_string()) {
    return invalidField(param + ".role", strCat("'", param, ".role' is required and must be a string"));
  }
  out->role = role->get<std::string>();
  if (out->role == "developer") out->role = "system";
  if (out->role != "system" && out->role != "user" && out->role != "assistant") {
    return invalidField(param + ".role",
                        strCat("'", param, ".role' is '", out->role, "'; expected one of system, user, assistant"));
  }
  auto content = m.find("content");
  if (content == m.end()) return invalidField(param + ".content", strCat("'", param, ".content' is required"));
  return parseMessageText(*content, index, &out->content);
}

// Chat's `messages` through the model's own template (openai_request.h):
// passed as given, so the template decides which roles and fields it
// knows; what it refuses (raise_exception) or fails on is a 400.
std::optional<ApiError> renderWithTemplate(const json& body, const nlohmann::ordered_json* ordered,
                                           const engine::Tokenizer& tok, const ApiLimits& limits,
                                           const ToolRequest& tools, std::vector<TokenId>* prompt) {
  const json& messages = body["messages"];
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string param = strCat("messages[", i, "]");
    if (!m.is_object()) return invalidField(param, strCat("'", param, "' must be an object, got ", jsonTypeName(m)));
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return invalidField(param + ".role", strCat("'", param, ".role' is required and must be a string"));
    }
  }
  auto kwargs = body.find("chat_template_kwargs");
  if (kwargs != body.end() && !kwargs->is_null() && !kwargs->is_object()) {
    return invalidField("chat_template_kwargs",
                        strCat("'chat_template_kwargs' must be an object, got ", jsonTypeName(*kwargs)));
  }
  // The client's key order when the caller kept it, else sorted keys.
  auto field = [&](const char* key) -> nlohmann::ordered_json {
    if (ordered != nullptr && ordered->is_object()) {
      auto it = ordered->find(key);
      return it == ordered->end() ? nlohmann::ordered_json() : *it;
    }
    auto it = body.find(key);
    return it == body.end() ? nlohmann::ordered_json() : nlohmann::ordered_json(*it);
  };
  nlohmann::ordered_json ordered_messages = field("messages");
  if (auto e = prepareToolMessages(&ordered_messages)) return e;
  const WallTime now = limits.clock != nullptr ? limits.clock->wallNow() : WallTime();
  absl::StatusOr<std::string> text = renderChatTemplate(*limits.chat_template, ordered_messages,
                                                        tools.give_tools ? field("tools") : nlohmann::ordered_json(),
                                                        field("chat_template_kwargs"), now);
  if (!text.ok()) {
    return invalidField("messages", strCat("the model's chat template refused the messages: ", text.status().message()));
  }
  // The template wrote <s> and the other special tokens itself (HF's
  // apply_chat_template): no BOS is added here.
  *prompt = tok.encode(*text);
  return std::nullopt;
}

// Chat's `messages`, rendered with the model's chat template, else in the
// tokenizer's chat format.
std::optional<ApiError> parseMessages(const json& body, const nlohmann::ordered_json* ordered,
                                      const engine::Tokenizer& tok, const ApiLimits& limits, const ToolRequest& tools,
                                      std::vector<TokenId>* prompt) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) return invalidField("messages", "'messages' is required");
  if (!it->is_array()) return invalidField("messages", strCat("'messages' must be an array, got ", jsonTypeName(*it)));
  if (it->empty()) return invalidField("messages", "'messages' must contain at least one message");
  if (limits.chat_template) return renderWithTemplate(body, ordered, tok, limits, tools, prompt);
  const engine::ChatFormat format = limits.chat_format;
  std::vector<ChatMessage> messages(it->size());
  for (size_t i = 0; i < it->size(); ++i) {
    if (auto e = parseMessage((*it)[i], i, &messages[i])) return e;
  }
  *prompt = renderChat(format, messages, tok);
  return std::nullopt;
}

// The prompt must leave at least one token of the context to generate.
std::optional<ApiError> checkPromptLength(Endpoint endpoint, const std::vector<TokenId>& prompt,
                                          const ApiLimits& limits) {
  const char* param = endpoint == Endpoint::kChat ? "messages" : "prompt";
  if (prompt.empty()) return invalidField(param, "the prompt is empty after tokenization");
  const int num_prompt = static_cast<int>(prompt.size());
  if (num_prompt >= limits.max_model_len) {
    return invalidField(
        param,
        strCat("this model's maximum context length is ", limits.max_model_len, " tokens, but the prompt has ",
               num_prompt, " tokens (at least one token must be left to generate)"),
        "context_length_exceeded");
  }
  return std::nullopt;
}

// max_tokens (chat: max_completion_tokens wins), at most the context left
// after the prompt. Default: completions 16 (OpenAI's), chat
// limits.default_max_tokens, both capped by the context left.
std::optional<ApiError> parseMaxTokens(Endpoint endpoint, const json& body, const ApiLimits& limits, int num_prompt,
                                       engine::SamplingParams* s) {
  std::optional<int64_t> max_tokens;
  const char* key = "max_tokens";
  if (auto e = readInt(body, "max_tokens", &max_tokens)) return e;
  if (endpoint == Endpoint::kChat) {
    std::optional<int64_t> mct;
    if (auto e = readInt(body, "max_completion_tokens", &mct)) return e;
    if (mct) {
      max_tokens = mct;
      key = "max_completion_tokens";
    }
  }
  const int room = limits.max_model_len - num_prompt;
  if (!max_tokens) {
    s->max_tokens = std::min(room, endpoint == Endpoint::kCompletions ? 16 : limits.default_max_tokens);
    return std::nullopt;
  }
  if (*max_tokens < 1) return invalidField(key, strCat("'", key, "' must be at least 1, got ", *max_tokens));
  if (*max_tokens > room) {
    return invalidField(
        key,
        strCat("this model's maximum context length is ", limits.max_model_len, " tokens; the prompt has ", num_prompt,
               " tokens, so '", key, "' may be at most ", room, ", got ", *max_tokens),
        "context_length_exceeded");
  }
  s->max_tokens = static_cast<int>(*max_tokens);
  return std::nullopt;
}

// temperature, top_p, top_k, seed, ignore_eos.
std::optional<ApiError> parseSampling(const json& body, engine::SamplingParams* s) {
  std::optional<double> temperature, top_p;
  if (auto e = readNumber(body, "temperature", &temperature)) return e;
  if (temperature) {
    if (!(*temperature >= 0 && *temperature <= 2)) {
      return invalidField("temperature", strCat("'temperature' must be between 0 and 2, got ", *temperature));
    }
    s->temperature = static_cast<float>(*temperature);
  }
  if (auto e = readNumber(body, "top_p", &top_p)) return e;
  if (top_p) {
    if (!(*top_p > 0 && *top_p <= 1)) {
      return invalidField("top_p", strCat("'top_p' must be greater than 0 and at most 1, got ", *top_p));
    }
    s->top_p = static_cast<float>(*top_p);
  }
  std::optional<int64_t> top_k, seed;
  if (auto e = readInt(body, "top_k", &top_k)) return e;
  if (top_k) {
    if (*top_k < 0) return invalidField("top_k", strCat("'top_k' must not be negative, got ", *top_k));
    s->top_k = static_cast<int>(std::min<int64_t>(*top_k, 1 << 30));
  }
  if (auto e = readInt(body, "seed", &seed)) return e;
  if (seed) s->seed = static_cast<uint64_t>(*seed);
  std::optional<bool> ignore_eos;
  if (auto e = readBool(body, "ignore_eos", &ignore_eos)) return e;
  s->ignore_eos = ignore_eos.value_or(false);
  return std::nullopt;
}

// `stop`: a string or up to 4 strings, none empty.
std::optional<ApiError> parseStop(const json& body, std::vector<std::string>* stop) {
  auto it = body.find("stop");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) {
    stop->push_back(it->get<std::string>());
  } else if (it->is_array()) {
    if (it->size() > 4) return invalidField("stop", strCat("'stop' may hold at most 4 strings, got ", it->size()));
    for (const json& x : *it) {
      if (!x.is_string()) return invalidField("stop", "'stop' must be a string or an array of strings");
      stop->push_back(x.get<std::string>());
    }
  } else {
    return invalidField("stop", strCat("'stop' must be a string or an array of strings, got ", jsonTypeName(*it)));
  }
  for (const auto& x : *stop) {
    if (x.empty()) return invalidField("stop", "'stop' strings must not be empty");
  }
  return std::nullopt;
}

// `stream` and `stream_options.include_usage` (only with stream).
std::optional<ApiError> parseStreaming(const json& body, ParsedRequest* r) {
  std::optional<bool> stream;
  if (auto e = readBool(body, "stream", &stream)) return e;
  r->stream = stream.value_or(false);
  auto it = body.find("stream_options");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) return invalidField("stream_options", "'stream_options' must be an object");
  if (!r->stream) return invalidField("stream_options", "'stream_options' is only allowed when 'stream' is true");
  std::optional<bool> usage;
  if (auto e = readBool(*it, "include_usage", &usage)) {
    e->param = "stream_options.include_usage";
    return e;
  }
  r->include_usage = usage.value_or(false);
  return std::nullopt;
}

// Why `id` cannot be a session id (openai_request.h), or nullopt.
std::optional<std::string> badSessionId(std::string_view id) {
  if (id.size() > kMaxSessionIdBytes) {
    return strCat("is ", id.size(), " bytes long; a session id may have at most ", kMaxSessionIdBytes);
  }
  for (char ch : id) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f) return strCat("contains the control character ", static_cast<int>(c));
  }
  return std::nullopt;
}

// The session: the x-session-id header, else `user`. Only the one in use
// is checked, so a `user` next to a session header stays free-form.
std::optional<ApiError> parseSession(const json& body, const std::optional<std::string>& session_header,
                                     std::optional<SessionId>* session) {
  std::optional<std::string> user;
  if (auto e = readString(body, "user", &user)) return e;
  const bool from_header = session_header && !session_header->empty();
  const std::optional<std::string>& id = from_header ? session_header : user;
  if (!id || id->empty()) return std::nullopt;
  if (auto why = badSessionId(*id)) {
    const char* param = from_header ? "x-session-id" : "user";
    return invalidField(param, strCat("'", param, "' is the session id and ", *why));
  }
  *session = SessionId(*id);
  return std::nullopt;
}

}  // namespace

std::variant<ParsedRequest, ApiError> parseRequest(Endpoint endpoint, const json& body, const engine::Tokenizer& tok,
                                                   const ApiLimits& limits, std::optional<std::string> session_header,
                                                   const nlohmann::ordered_json* ordered_body) {
  if (!body.is_object()) {
    return invalidField("", strCat("the request body must be a JSON object, got ", jsonTypeName(body)));
  }
  ParsedRequest r;
  r.endpoint = endpoint;
  engine::RequestSpec& spec = r.spec;
  if (auto e = parseModel(body, limits, &r.model)) return *e;
  if (auto e = refuseUnsupported(endpoint, body)) return *e;
  ToolRequest tools;
  if (endpoint == Endpoint::kChat) {
    if (auto e = parseToolRequest(body, limits.chat_template != nullptr, &tools)) return *e;
    r.tools = tools.rules;
    r.tool_call_format = limits.chat_template ? limits.chat_template->tool_call_format : ToolCallFormat::kNone;
  }
  if (auto e = endpoint == Endpoint::kCompletions
                   ? parsePrompt(body, tok, &spec.prompt)
                   : parseMessages(body, ordered_body, tok, limits, tools, &spec.prompt)) {
    return *e;
  }
  if (auto e = checkPromptLength(endpoint, spec.prompt, limits)) return *e;
  if (auto e = parseMaxTokens(endpoint, body, limits, static_cast<int>(spec.prompt.size()), &spec.sampling)) return *e;
  if (auto e = parseSampling(body, &spec.sampling)) return *e;
  if (auto e = parseStop(body, &spec.sampling.stop)) return *e;
  if (auto e = parseStreaming(body, &r)) return *e;
  if (auto e = parseSession(body, session_header, &spec.session)) return *e;
  return r;
}

}  // namespace tandem::agent
