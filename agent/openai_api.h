#pragma once
// The OpenAI-compatible response formats of the agent and the types shared
// with request parsing (openai_request.h), as pure functions (no I/O).
// A streamed response is framed by OpenAiStreamEncoder (openai_stream.h)
// from the chunk bodies below.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/sched/request.h"
#include "src/kvproto/kvproto.h"

namespace tandem::agent {

enum class Endpoint { kCompletions, kChat };

// An error in OpenAI's shape: {"error":{"message","type","param","code"}}.
struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;                                         // empty: null
  std::string code;                                          // empty: null
  std::vector<std::pair<std::string, std::string>> headers;  // e.g. Retry-After

  nlohmann::json toJson() const;
};

// Whether a request ended normally (eos, length, a stop string): it gets a
// completion body or a final chunk; every other finish gets errorForFinish.
bool isNormalFinish(engine::FinishReason reason);

// OpenAI's finish_reason for an engine finish ("stop" for eos and stop strings).
std::string_view openAiFinishReason(engine::FinishReason reason);

// The error to send for a request that ended without a normal finish
// (rejected, cancelled, timeout, preempted, error).
// A typed KV-transfer failure (decode role) becomes a 503 with the failure
// reason as its code (prefill_timeout: 504), so clients and routers can retry.
ApiError errorForFinish(const engine::RequestUpdate& update,
                        std::optional<kvproto::FailureReason> transfer_failure = std::nullopt);

// Response bodies.
struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  nlohmann::json toJson() const;
};
// `tool_calls` (chat): null, or the reply's calls (toolCallJson each); with
// calls, a reply without other text has "content": null.
nlohmann::json completionBody(Endpoint endpoint, const std::string& id, int64_t created, const std::string& model,
                              const std::string& text, std::string_view finish_reason, const Usage& usage,
                              const nlohmann::json& tool_calls = nullptr);
// One tool call of a chat reply: {"id", "type": "function", "function": {"name", "arguments"}}.
nlohmann::json toolCallJson(const std::string& call_id, const std::string& name, const std::string& arguments);
// One streamed chunk. `finish_reason` empty: null. `role_chunk`: the chat
// stream's first chunk, carrying {"role":"assistant"}.
nlohmann::json chunkBody(Endpoint endpoint, const std::string& id, int64_t created, const std::string& model,
                         const std::string& text, std::string_view finish_reason, bool role_chunk, bool include_usage);
// A chat chunk whose delta is {"tool_calls": [tool_call_delta]}.
nlohmann::json toolCallChunkBody(const std::string& id, int64_t created, const std::string& model,
                                 const nlohmann::json& tool_call_delta, bool include_usage);
// The final usage-only chunk of stream_options.include_usage.
nlohmann::json usageChunkBody(Endpoint endpoint, const std::string& id, int64_t created, const std::string& model,
                              const Usage& usage);

}  // namespace tandem::agent
