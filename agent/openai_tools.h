#pragma once
// The tool-calling fields of a chat request, checked and prepared for the
// model's chat template, as pure functions (no I/O); parseRequest
// (openai_request.h) calls them. Accepted:
//
//   tools: [{"type": "function", "function": {"name": "a-z A-Z 0-9 _ -, 1..64",
//            "description": string?, "parameters": JSON Schema object?, "strict": bool?}}]
//   tool_choice: "auto" | "none" | "required" | {"type": "function", "function": {"name": <one of tools>}}
//   parallel_tool_calls: bool
//   messages: assistant {"tool_calls": [{"id", "type": "function",
//               "function": {"name", "arguments": "<a JSON object, as a string>"}}]},
//             tool {"tool_call_id" (a string, optional), "content"}
//
// Each bad value is a 400 naming the field (param and message both), e.g.
// "tools[1].function.name: required". Tools need a chat template that
// renders them: a model without one refuses them.

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "agent/openai_api.h"
#include "agent/tool_calls.h"

namespace tandem::agent {

// What a chat request asks of tools.
struct ToolRequest {
  // What the template is given: the request's tools, or null (none sent,
  // or tool_choice "none").
  bool give_tools = false;
  // What the reply's calls are checked against (empty names: the reply is
  // never read as calls, as with tool_choice "none").
  ToolRules rules;
};

// tools, tool_choice and parallel_tool_calls of `body` (chat only).
// `has_chat_template`: whether the model can render tools at all.
std::optional<ApiError> parseToolRequest(const nlohmann::json& body, bool has_chat_template, ToolRequest* out);

// Checks the tool_calls and tool_call_id of `messages` (the request's, in
// its key order) and rewrites each function.arguments string into the
// object it holds, as Hugging Face chat templates expect
// (`tool_call.arguments | tojson`).
std::optional<ApiError> prepareToolMessages(nlohmann::ordered_json* messages);

}  // namespace tandem::agent
