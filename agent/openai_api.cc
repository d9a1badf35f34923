#include "agent/openai_api.h"

namespace tandem::agent {

using nlohmann::json;

json ApiError::toJson() const {
  json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return json{{"error", e}};
}

bool isNormalFinish(engine::FinishReason r) {
  return r == engine::FinishReason::kEos || r == engine::FinishReason::kLength || r == engine::FinishReason::kStop;
}

std::string_view openAiFinishReason(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kLength:
      return "length";
    default:
      return "stop";
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
                    const std::string& text, std::string_view finish_reason, const Usage& usage,
                    const json& tool_calls) {
  json choice = {{"index", 0}, {"finish_reason", finish_reason}};
  if (endpoint == Endpoint::kChat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
    if (tool_calls.is_array()) {
      if (text.empty()) choice["message"]["content"] = nullptr;
      choice["message"]["tool_calls"] = tool_calls;
    }
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

json toolCallJson(const std::string& call_id, const std::string& name, const std::string& arguments) {
  return {{"id", call_id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}};
}

json toolCallChunkBody(const std::string& id, int64_t created, const std::string& model, const json& tool_call_delta,
                       bool include_usage) {
  json choice = {{"index", 0}, {"finish_reason", nullptr}, {"delta", {{"tool_calls", json::array({tool_call_delta})}}}};
  json out = {{"id", id},
              {"object", "chat.completion.chunk"},
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
