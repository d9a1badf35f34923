#include "agent/openai_api.h"

#include <cmath>
#include <variant>

#include "src/common/strings.h"

namespace tandem::agent {
namespace {

using nlohmann::json;

ApiError invalid(std::string param, std::string message, std::string code = {}) {
  ApiError e;
  e.status = 400;
  e.param = std::move(param);
  e.message = std::move(message);
  e.code = std::move(code);
  return e;
}

std::string typeName(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::number_float: return "a number";
    default: return "an integer";
  }
}

// Typed field readers: absent or null -> nullopt; wrong type -> error.
std::optional<ApiError> readInt(const json& body, const char* key, std::optional<int64_t>* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    return invalid(key, strCat("'", key, "' is too large"));
  }
  if (it->is_number_integer()) {
    *out = it->get<int64_t>();
    return std::nullopt;
  }
  if (it->is_number_float() && std::floor(it->get<double>()) == it->get<double>()) {
    // A whole number written as a float (e.g. 1e3); beyond 2^53 it is no longer exact.
    if (std::abs(it->get<double>()) >= 9e15) return invalid(key, strCat("'", key, "' is too large"));
    *out = static_cast<int64_t>(it->get<double>());
    return std::nullopt;
  }
  return invalid(key, strCat("'", key, "' must be an integer, got ", typeName(*it)));
}

std::optional<ApiError> readNumber(const json& body, const char* key, std::optional<double>* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return invalid(key, strCat("'", key, "' must be a number, got ", typeName(*it)));
  *out = it->get<double>();
  return std::nullopt;
}

std::optional<ApiError> readBool(const json& body, const char* key, std::optional<bool>* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return invalid(key, strCat("'", key, "' must be a boolean, got ", typeName(*it)));
  *out = it->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> readString(const json& body, const char* key, std::optional<std::string>* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) return invalid(key, strCat("'", key, "' must be a string, got ", typeName(*it)));
  *out = it->get<std::string>();
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
  if (key == "tools" || key == "functions") return v.is_array() && v.empty();
  if (key == "logit_bias") return v.is_object() && v.empty();
  if (key == "tool_choice") return isStringEqual(v, "none");
  if (key == "response_format") {
    if (!v.is_object()) return false;
    auto type = v.find("type");
    return v.empty() || (v.size() == 1 && type != v.end() && isStringEqual(*type, "text"));
  }
  return false;
}

// Message content: a string, or an array of {type:"text", text} parts.
std::optional<ApiError> messageText(const json& content, size_t index, std::string* out) {
  std::string param = strCat("messages[", index, "].content");
  if (content.is_string()) {
    *out = content.get<std::string>();
    return std::nullopt;
  }
  if (content.is_array()) {
    out->clear();
    for (size_t i = 0; i < content.size(); ++i) {
      const json& part = content[i];
      if (!part.is_object() || !part.contains("type") || !isStringEqual(part["type"], "text") || !part.contains("text") ||
          !part["text"].is_string()) {
        return invalid(param, strCat("'", param, "[", i, "]' must be {\"type\": \"text\", \"text\": string}; only text content is supported"));
      }
      *out += part["text"].get<std::string>();
    }
    return std::nullopt;
  }
  return invalid(param, strCat("'", param, "' must be a string or an array of text parts, got ", typeName(content)));
}

void appendText(std::vector<TokenId>& out, const engine::Tokenizer& tok, std::string_view text) {
  std::vector<TokenId> t = tok.encode(text);
  out.insert(out.end(), t.begin(), t.end());
}

}  // namespace

json ApiError::toJson() const {
  json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return json{{"error", e}};
}

std::vector<TokenId> renderChat(const std::vector<std::pair<std::string, std::string>>& messages,
                                const engine::Tokenizer& tok) {
  std::vector<TokenId> out;
  const bool llama2 = dynamic_cast<const engine::SentencePieceTokenizer*>(&tok) != nullptr;
  if (!llama2) {
    if (tok.bosId() >= 0) out.push_back(tok.bosId());
    std::string text;
    for (const auto& [role, content] : messages) text += strCat("<|", role, "|>\n", content, "\n");
    text += "<|assistant|>\n";
    appendText(out, tok, text);
    return out;
  }
  // Llama-2 chat: [INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>[INST] ...
  std::string system;
  size_t i = 0;
  if (!messages.empty() && messages[0].first == "system") {
    system = messages[0].second;
    i = 1;
  }
  bool first_user = true;
  for (; i < messages.size(); ++i) {
    const auto& [role, content] = messages[i];
    if (role == "assistant") {
      appendText(out, tok, strCat(" ", content, " "));
      if (tok.eosId() >= 0) out.push_back(tok.eosId());
      continue;
    }
    if (tok.bosId() >= 0) out.push_back(tok.bosId());
    std::string user = content;
    if (first_user && !system.empty()) user = strCat("<<SYS>>\n", system, "\n<</SYS>>\n\n", content);
    first_user = false;
    appendText(out, tok, strCat("[INST] ", user, " [/INST]"));
  }
  if (first_user && !system.empty()) {
    // No user turn: the system prompt still opens an instruction block.
    if (tok.bosId() >= 0) out.push_back(tok.bosId());
    appendText(out, tok, strCat("[INST] <<SYS>>\n", system, "\n<</SYS>>\n\n [/INST]"));
  }
  return out;
}

std::variant<ParsedRequest, ApiError> parseRequest(Endpoint endpoint, const json& body,
                                                   const engine::Tokenizer& tok, const ApiLimits& limits,
                                                   std::optional<std::string> session_header) {
  if (!body.is_object()) return invalid("", strCat("the request body must be a JSON object, got ", typeName(body)));
  ParsedRequest r;
  r.endpoint = endpoint;

  // model
  std::optional<std::string> model;
  if (auto e = readString(body, "model", &model)) return *e;
  if (!model) return invalid("model", "'model' is required");
  if (*model != limits.model_name) {
    ApiError e;
    e.status = 404;
    e.param = "model";
    e.code = "model_not_found";
    e.message = strCat("the model '", *model, "' does not exist here; this server serves '", limits.model_name, "'");
    return e;
  }
  r.model = *model;

  // Unsupported features: refuse rather than ignore.
  for (const char* key : {"best_of", "echo", "logprobs", "top_logprobs", "suffix", "tools", "functions", "logit_bias",
                          "tool_choice", "response_format"}) {
    auto it = body.find(key);
    if (it != body.end() && !isNoOp(key, *it)) return invalid(key, strCat("'", key, "' is not supported by this server"));
  }
  std::optional<int64_t> n;
  if (auto e = readInt(body, "n", &n)) return *e;
  if (n && *n != 1) return invalid("n", strCat("'n' must be 1 (one choice per request), got ", *n));

  // prompt / messages -> tokens
  auto& prompt = r.spec.prompt;
  if (endpoint == Endpoint::kCompletions) {
    auto it = body.find("prompt");
    if (it == body.end() || it->is_null()) return invalid("prompt", "'prompt' is required");
    const json& p = *it;
    if ((p.is_string() && p.get<std::string>().empty()) || (p.is_array() && p.empty()) ||
        (p.is_array() && p.size() == 1 && p[0].is_string() && p[0].get<std::string>().empty())) {
      return invalid("prompt", "'prompt' must not be empty");
    }
    if (p.is_string()) {
      if (tok.bosId() >= 0) prompt.push_back(tok.bosId());
      appendText(prompt, tok, p.get<std::string>());
    } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
      if (tok.bosId() >= 0) prompt.push_back(tok.bosId());
      appendText(prompt, tok, p[0].get<std::string>());
    } else if (const json& ids = p.is_array() && p.size() == 1 && p[0].is_array() ? p[0] : p;  // [ids] or a batch of one
               ids.is_array() && !ids.empty() && ids[0].is_number_integer()) {
      const std::string where = &ids == &p ? "prompt" : "prompt[0]";
      for (size_t i = 0; i < ids.size(); ++i) {
        const json& v = ids[i];
        if (!v.is_number_integer()) return invalid("prompt", strCat("'", where, "[", i, "]' must be a token id (integer)"));
        const uint64_t vocab = static_cast<uint64_t>(tok.vocabSize());
        const bool known = v.is_number_unsigned() ? v.get<uint64_t>() < vocab
                                                  : v.get<int64_t>() >= 0 && static_cast<uint64_t>(v.get<int64_t>()) < vocab;
        if (!known) {
          return invalid("prompt", strCat("'", where, "[", i, "]' = ", v.dump(), " is not a token id of this model (0..",
                                          tok.vocabSize() - 1, ")"));
        }
        prompt.push_back(static_cast<TokenId>(v.get<int64_t>()));
      }
    } else if (p.is_array() && p.size() > 1 && (p[0].is_string() || p[0].is_array())) {
      return invalid("prompt", "batched prompts (several strings or token arrays) are not supported; send one prompt per request");
    } else {
      return invalid("prompt", strCat("'prompt' must be a string, [string] or an array of token ids, got ", typeName(p)));
    }
  } else {
    auto it = body.find("messages");
    if (it == body.end() || it->is_null()) return invalid("messages", "'messages' is required");
    if (!it->is_array()) return invalid("messages", strCat("'messages' must be an array, got ", typeName(*it)));
    if (it->empty()) return invalid("messages", "'messages' must contain at least one message");
    std::vector<std::pair<std::string, std::string>> msgs;
    for (size_t i = 0; i < it->size(); ++i) {
      const json& m = (*it)[i];
      std::string param = strCat("messages[", i, "]");
      if (!m.is_object()) return invalid(param, strCat("'", param, "' must be an object, got ", typeName(m)));
      auto role = m.find("role");
      if (role == m.end() || !role->is_string()) return invalid(param + ".role", strCat("'", param, ".role' is required and must be a string"));
      std::string r_name = role->get<std::string>();
      if (r_name == "developer") r_name = "system";
      if (r_name != "system" && r_name != "user" && r_name != "assistant") {
        return invalid(param + ".role", strCat("'", param, ".role' is '", r_name, "'; expected one of system, user, assistant"));
      }
      auto content = m.find("content");
      if (content == m.end()) return invalid(param + ".content", strCat("'", param, ".content' is required"));
      std::string text;
      if (auto e = messageText(*content, i, &text)) return *e;
      msgs.emplace_back(r_name, std::move(text));
    }
    prompt = renderChat(msgs, tok);
  }
  if (prompt.empty()) return invalid(endpoint == Endpoint::kChat ? "messages" : "prompt", "the prompt is empty after tokenization");
  const int num_prompt = static_cast<int>(prompt.size());
  if (num_prompt >= limits.max_model_len) {
    return invalid(endpoint == Endpoint::kChat ? "messages" : "prompt",
                   strCat("this model's maximum context length is ", limits.max_model_len, " tokens, but the prompt has ",
                          num_prompt, " tokens (at least one token must be left to generate)"),
                   "context_length_exceeded");
  }

  // Sampling.
  auto& s = r.spec.sampling;
  std::optional<int64_t> max_tokens;
  const char* max_key = "max_tokens";
  if (auto e = readInt(body, "max_tokens", &max_tokens)) return *e;
  if (endpoint == Endpoint::kChat) {
    std::optional<int64_t> mct;
    if (auto e = readInt(body, "max_completion_tokens", &mct)) return *e;
    if (mct) {
      max_tokens = mct;
      max_key = "max_completion_tokens";
    }
  }
  const int room = limits.max_model_len - num_prompt;
  if (max_tokens) {
    if (*max_tokens < 1) return invalid(max_key, strCat("'", max_key, "' must be at least 1, got ", *max_tokens));
    if (*max_tokens > room) {
      return invalid(max_key,
                     strCat("this model's maximum context length is ", limits.max_model_len, " tokens; the prompt has ",
                            num_prompt, " tokens, so '", max_key, "' may be at most ", room, ", got ", *max_tokens),
                     "context_length_exceeded");
    }
    s.max_tokens = static_cast<int>(*max_tokens);
  } else {
    s.max_tokens = std::min(room, endpoint == Endpoint::kCompletions ? 16 : limits.default_max_tokens);
  }
  std::optional<double> temperature, top_p;
  if (auto e = readNumber(body, "temperature", &temperature)) return *e;
  if (temperature) {
    if (!(*temperature >= 0 && *temperature <= 2)) return invalid("temperature", strCat("'temperature' must be between 0 and 2, got ", *temperature));
    s.temperature = static_cast<float>(*temperature);
  }
  if (auto e = readNumber(body, "top_p", &top_p)) return *e;
  if (top_p) {
    if (!(*top_p > 0 && *top_p <= 1)) return invalid("top_p", strCat("'top_p' must be greater than 0 and at most 1, got ", *top_p));
    s.top_p = static_cast<float>(*top_p);
  }
  std::optional<int64_t> top_k, seed;
  if (auto e = readInt(body, "top_k", &top_k)) return *e;
  if (top_k) {
    if (*top_k < 0) return invalid("top_k", strCat("'top_k' must not be negative, got ", *top_k));
    s.top_k = static_cast<int>(std::min<int64_t>(*top_k, 1 << 30));
  }
  if (auto e = readInt(body, "seed", &seed)) return *e;
  if (seed) s.seed = static_cast<uint64_t>(*seed);
  std::optional<bool> ignore_eos, stream;
  if (auto e = readBool(body, "ignore_eos", &ignore_eos)) return *e;
  s.ignore_eos = ignore_eos.value_or(false);
  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      s.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      if (it->size() > 4) return invalid("stop", strCat("'stop' may hold at most 4 strings, got ", it->size()));
      for (const json& x : *it) {
        if (!x.is_string()) return invalid("stop", "'stop' must be a string or an array of strings");
        s.stop.push_back(x.get<std::string>());
      }
    } else {
      return invalid("stop", strCat("'stop' must be a string or an array of strings, got ", typeName(*it)));
    }
    for (const auto& x : s.stop) {
      if (x.empty()) return invalid("stop", "'stop' strings must not be empty");
    }
  }
  if (auto e = readBool(body, "stream", &stream)) return *e;
  r.stream = stream.value_or(false);
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return invalid("stream_options", "'stream_options' must be an object");
    if (!r.stream) return invalid("stream_options", "'stream_options' is only allowed when 'stream' is true");
    std::optional<bool> usage;
    if (auto e = readBool(*it, "include_usage", &usage)) {
      e->param = "stream_options.include_usage";
      return *e;
    }
    r.include_usage = usage.value_or(false);
  }
  std::optional<std::string> user;
  if (auto e = readString(body, "user", &user)) return *e;
  if (session_header && !session_header->empty()) r.spec.session = SessionId(*session_header);
  else if (user && !user->empty()) r.spec.session = SessionId(*user);
  return r;
}

std::string_view openAiFinishReason(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kLength: return "length";
    default: return "stop";
  }
}

ApiError errorForFinish(const engine::RequestUpdate& u, std::optional<kvproto::FailureReason> transfer_failure) {
  using engine::FinishReason;
  using engine::RejectReason;
  ApiError e;
  e.message = u.message;
  if (transfer_failure && u.finish_reason == FinishReason::kError) {
    const bool timeout = *transfer_failure == kvproto::FailureReason::kPrefillTimeout;
    e.status = timeout ? 504 : 503;
    e.type = timeout ? "timeout_error" : "service_unavailable_error";
    e.code = std::string(kvproto::failureReasonName(*transfer_failure));
    e.headers.emplace_back("Retry-After", "1");
    return e;
  }
  switch (u.finish_reason) {
    case FinishReason::kRejected:
      switch (u.reject_reason) {
        case RejectReason::kQueueFull:
          e.status = 429;
          e.type = "rate_limit_error";
          e.code = "queue_full";
          e.headers.emplace_back("Retry-After", "1");
          break;
        case RejectReason::kDraining:
          e.status = 503;
          e.type = "service_unavailable_error";
          e.code = "draining";
          break;
        case RejectReason::kPromptTooLong:
          e.code = "context_length_exceeded";
          break;
        case RejectReason::kCapacity:
          e.code = "kv_capacity_exceeded";
          break;
        default:
          break;
      }
      break;
    case FinishReason::kTimeout:
      e.status = 504;
      e.type = "timeout_error";
      e.code = "timeout";
      if (e.message.empty()) e.message = "the request did not finish before its deadline";
      break;
    case FinishReason::kCancelled:
      e.status = 499;  // client closed request (nginx's convention); only seen in logs and traces
      e.type = "invalid_request_error";
      e.code = "cancelled";
      if (e.message.empty()) e.message = "the request was cancelled";
      break;
    case FinishReason::kPreempted:
      e.status = 503;
      e.type = "service_unavailable_error";
      e.code = "preempted";
      e.headers.emplace_back("Retry-After", "1");
      break;
    default:
      e.status = 500;
      e.type = "server_error";
      e.code = "internal_error";
      if (e.message.empty()) e.message = "internal error";
      break;
  }
  return e;
}

json Usage::toJson() const {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

json completionBody(Endpoint endpoint, const std::string& id, int64_t created, const std::string& model,
                    const std::string& text, std::string_view finish_reason, const Usage& usage) {
  json choice = {{"index", 0}, {"finish_reason", finish_reason}};
  if (endpoint == Endpoint::kChat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
    choice["logprobs"] = nullptr;
  }
  return {{"id", id},
          {"object", endpoint == Endpoint::kChat ? "chat.completion" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({choice})},
          {"usage", usage.toJson()}};
}

json chunkBody(Endpoint endpoint, const std::string& id, int64_t created, const std::string& model,
               const std::string& text, std::string_view finish_reason, bool role_chunk, bool include_usage) {
  json choice = {{"index", 0}};
  choice["finish_reason"] = finish_reason.empty() ? json(nullptr) : json(finish_reason);
  if (endpoint == Endpoint::kChat) {
    json delta = json::object();
    if (role_chunk) delta["role"] = "assistant";
    if (role_chunk || !text.empty()) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
    choice["logprobs"] = nullptr;
  }
  json out = {{"id", id},
              {"object", endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", json::array({choice})}};
  if (include_usage) out["usage"] = nullptr;
  return out;
}

json usageChunkBody(Endpoint endpoint, const std::string& id, int64_t created, const std::string& model,
                    const Usage& usage) {
  return {{"id", id},
          {"object", endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array()},
          {"usage", usage.toJson()}};
}

}  // namespace tandem::agent
