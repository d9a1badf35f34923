#pragma once
// Parsing an OpenAI-compatible request body into an engine request, as a
// pure function (no I/O), so every bad-input case is testable without a server.
//
// Supported request fields (both endpoints unless noted):
//   model (required), prompt (completions: string, [string] or [token ids]),
//   messages (chat: [{role: system|user|assistant, content: string | [{type:"text", text}]}];
//   with a chat template, whatever roles and fields it renders),
//   tools, tool_choice, parallel_tool_calls (chat; openai_tools.h),
//   max_tokens / max_completion_tokens (chat), temperature [0, 2], top_p (0, 1],
//   top_k (extension, >= 0), seed, stop (string or up to 4 strings), user,
//   n (only 1), stream, stream_options.include_usage, ignore_eos (extension).
// Known-but-unsupported fields with non-default values (best_of > 1, echo,
// logprobs, top_logprobs, suffix, functions, logit_bias) are refused
// with 400 rather than silently ignored. Other unknown fields are ignored, as
// most OpenAI-compatible servers do.
//
// The session id for KV residency comes from the x-session-id header, else
// from `user`. The router forwards it to the decode agent as x-session-id,
// so it must be a header value that cannot end the header early: the one
// in use is refused (400) when it holds a control character (CR and LF
// would inject headers, or a whole request, into the router's request to D)
// or is longer than kMaxSessionIdBytes.
//
// Errors are checked in a fixed order (model, unsupported features, tools, prompt or
// messages, context length, max_tokens, sampling, stop, streaming, user), so a
// body with several problems always gets the same one reported.

#include <memory>
#include <optional>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

#include "agent/chat_template.h"
#include "agent/openai_api.h"
#include "engine/model/tokenizer.h"
#include "engine/sched/request.h"

namespace tandem::agent {

// What this agent serves, fixed at load.
struct ApiLimits {
  std::string model_name;        // the one model this agent serves
  int max_model_len = 0;         // context in tokens
  int default_max_tokens = 256;  // chat without max_tokens: min(this, context left)
  // How chat messages become a prompt: the served tokenizer's chatFormat(),
  // read once at load (chat_template.h).
  engine::ChatFormat chat_format = engine::ChatFormat::kTandem;
  // The model's own chat template (tokenizer_config.json), when it has one:
  // chat requests are rendered with it (renderChatTemplate) instead of
  // chat_format, and may use the roles it knows (tool, ...) and
  // chat_template_kwargs. Null: chat_format.
  std::shared_ptr<const ChatTemplate> chat_template;
  // strftime_now's clock for chat templates; not owned, set with chat_template.
  const Clock* clock = nullptr;
};

// The longest session id accepted: ample for any client's ids (UUIDs,
// hashes), far below the 64 KiB a header block may have.
inline constexpr size_t kMaxSessionIdBytes = 1024;

struct ParsedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;
  // Prompt tokens (BOS included), sampling, session (when set: 1 to
  // kMaxSessionIdBytes bytes, no control characters).
  engine::RequestSpec spec;
  bool stream = false;
  bool include_usage = false;
  // Chat: which tool calls the reply may hold, and how the model writes
  // them (tool_calls.h); rules.names empty: the reply is plain text.
  ToolRules tools;
  ToolCallFormat tool_call_format = ToolCallFormat::kNone;
};

// Parses and validates a request body against the model and limits. The
// tokenizer turns prompt text (or rendered chat) into tokens.
// `session_header` is the x-session-id header value, if any.
// On error returns the ApiError to send (status, message naming the field).
// `ordered_body`, when given, is the same body parsed with its key order
// kept: a chat template then sees messages and tools in the client's order
// (`tools | tojson` prints them as Python would); without it keys are sorted.
std::variant<ParsedRequest, ApiError> parseRequest(Endpoint endpoint, const nlohmann::json& body,
                                                   const engine::Tokenizer& tokenizer, const ApiLimits& limits,
                                                   std::optional<std::string> session_header,
                                                   const nlohmann::ordered_json* ordered_body = nullptr);

}  // namespace tandem::agent
