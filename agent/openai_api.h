#pragma once
// The OpenAI-compatible request and response formats of the agent, as pure
// functions (no I/O), so every bad-input case is testable without a server.
//
// Supported request fields (both endpoints unless noted):
//   model (required), prompt (completions: string, [string] or [token ids]),
//   messages (chat: [{role: system|user|assistant, content: string | [{type:"text", text}]}]),
//   max_tokens / max_completion_tokens (chat), temperature [0, 2], top_p (0, 1],
//   top_k (extension, >= 0), seed, stop (string or up to 4 strings), user,
//   n (only 1), stream, stream_options.include_usage, ignore_eos (extension).
// Known-but-unsupported fields with non-default values (best_of > 1, echo,
// logprobs, top_logprobs, suffix, tools, functions, logit_bias) are refused
// with 400 rather than silently ignored. Other unknown fields are ignored, as
// most OpenAI-compatible servers do.
//
// The session id for KV residency comes from the x-session-id header, else
// from `user`.

#include <cstdint>
#include <optional>
#include <variant>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/model/tokenizer.h"
#include "engine/sched/request.h"
#include "src/kvproto/kvproto.h"

namespace tandem::agent {

enum class Endpoint { kCompletions, kChat };

// An error in OpenAI's shape: {"error":{"message","type","param","code"}}.
struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;  // empty: null
  std::string code;   // empty: null
  std::vector<std::pair<std::string, std::string>> headers;  // e.g. Retry-After

  nlohmann::json toJson() const;
};

struct ApiLimits {
  std::string model_name;       // the one model this agent serves
  int max_model_len = 0;        // context in tokens
  int default_max_tokens = 256; // chat without max_tokens: min(this, context left)
};

struct ParsedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;
  engine::RequestSpec spec;  // prompt tokens (BOS included), sampling, session
  bool stream = false;
  bool include_usage = false;
};

// Parses and validates a request body against the model and limits. The
// tokenizer turns prompt text (or rendered chat) into tokens.
// `session_header` is the x-session-id header value, if any.
// On error returns the ApiError to send (status, message naming the field).
std::variant<ParsedRequest, ApiError> parseRequest(Endpoint endpoint, const nlohmann::json& body,
                                                   const engine::Tokenizer& tokenizer, const ApiLimits& limits,
                                                   std::optional<std::string> session_header);

// The prompt text a chat renders to. The built-in byte-tokenizer model uses
//   <|system|>\n{content}\n<|user|>\n{content}\n ... <|assistant|>\n
// (one block per message, then the assistant header the model continues).
// SentencePiece (Llama-2 family) models use Llama-2's [INST] format, with
// <s>/</s> around each exchange: renderChat returns the token ids directly.
std::vector<TokenId> renderChat(const std::vector<std::pair<std::string, std::string>>& messages,
                                const engine::Tokenizer& tokenizer);

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
nlohmann::json completionBody(Endpoint endpoint, const std::string& id, int64_t created, const std::string& model,
                              const std::string& text, std::string_view finish_reason, const Usage& usage);
// One streamed chunk. `finish_reason` empty: null. `role_chunk`: the chat
// stream's first chunk, carrying {"role":"assistant"}.
nlohmann::json chunkBody(Endpoint endpoint, const std::string& id, int64_t created, const std::string& model,
                         const std::string& text, std::string_view finish_reason, bool role_chunk, bool include_usage);
// The final usage-only chunk of stream_options.include_usage.
nlohmann::json usageChunkBody(Endpoint endpoint, const std::string& id, int64_t created, const std::string& model,
                              const Usage& usage);

}  // namespace tandem::agent
