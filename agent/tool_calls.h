#pragma once
// A model's tool calls, read back out of its generated text, as pure
// functions (no I/O). Which format a model writes follows from its chat
// template (toolCallFormatOf), since the template is what taught it:
//
//   kHermes (Qwen2.5, Qwen3, Hermes): any number of blocks, text around them
//     allowed:
//       <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>
//   kLlamaJson (Llama 3.1, 3.2, 3.3): the whole reply is one JSON object,
//     optionally after <|python_tag|>; "parameters" (Meta's key) or
//     "arguments":
//       {"name": "get_weather", "parameters": {"city": "Paris"}}
//
// A call is valid when its JSON parses, "name" is one of the request's
// tools (the named one under tool_choice {"function": ...}) and the
// arguments are an object (absent: {}). Output with any invalid call, or
// with several calls when parallel_tool_calls is false, is no tool call at
// all: the caller returns it as plain text, so a model's malformed attempt
// reaches the client as it was written, never as a guessed call.
// Thread-safe (no shared state).

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::agent {

enum class ToolCallFormat {
  kNone,       // the template renders no tools we know how to read back
  kHermes,     // <tool_call>{json}</tool_call> blocks
  kLlamaJson,  // the reply is one {"name", "parameters"} object
};

// The format of a chat template's source: it mentions <tool_call> → kHermes;
// Llama 3's header tokens (<|start_header_id|>) and tools → kLlamaJson.
ToolCallFormat toolCallFormatOf(std::string_view template_source);

// What the request allows the model to call.
struct ToolRules {
  std::vector<std::string> names;  // the request's tools; empty: no call is ever read back
  std::string forced_name;         // tool_choice {"type":"function", ...}: only this one; "" any
  bool parallel = true;            // parallel_tool_calls: more than one call per reply
};

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object, serialized (OpenAI's function.arguments)
};

// `text` split into the calls it holds and the text outside them.
struct ToolCallOutput {
  std::vector<ToolCall> calls;  // in the order written; empty: no call
  std::string content;          // the text outside the calls, pieces trimmed and joined by "\n"; "" when none
};

// The calls in a whole reply. nullopt when `text` holds no call, or a call
// that is not valid (bad JSON, a name not in `tool_names`, arguments that
// are not an object, see ToolRules): the reply is then plain text.
std::optional<ToolCallOutput> parseToolCalls(ToolCallFormat format, std::string_view text, const ToolRules& rules);

// Whether `text` has the shape of a tool call in `format` (a <tool_call>
// tag; a reply starting with "{" or <|python_tag|>), valid or not: what a
// caller logs when parseToolCalls found none in it.
bool looksLikeToolCall(ToolCallFormat format, std::string_view text);

// Streaming: decides, delta by delta, which text can go out as content now
// and which must wait because it may be (the start of) a tool call. kHermes
// holds back from "<tool_call>" on (and a tail that could begin it, and
// the whitespace before);
// kLlamaJson holds the whole reply back when it begins with "{" or
// <|python_tag|> (after whitespace). At the end, finish() parses what was
// held. Not thread-safe: one per stream, fed in order.
class ToolCallStream {
 public:
  ToolCallStream(ToolCallFormat format, ToolRules rules) : format_(format), rules_(std::move(rules)) {}

  // The text of `delta` (with any earlier held text) that can be sent as
  // content now; may be "".
  std::string feed(std::string_view delta);

  // At the end of the reply: the calls, if what was held is valid tool-call
  // output (content: the held text outside them), else nullopt and
  // `*rest` is the held text, to be sent as content.
  std::optional<ToolCallOutput> finish(std::string* rest);

 private:
  // kUndecided: only whitespace (or part of <|python_tag|>) so far
  // (kLlamaJson); kText: content, released as it comes (kHermes keeps
  // looking for a call); kCall: a call may have begun, everything is held.
  enum class State { kUndecided, kText, kCall };

  ToolCallFormat format_;
  ToolRules rules_;
  State state_ = State::kUndecided;
  std::string held_;  // text not released yet
};

}  // namespace tandem::agent
