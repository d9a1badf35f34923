#pragma once
// The bytes of one streamed OpenAI response (Server-Sent Events), as pure
// code: the HTTP handler feeds it what the engine reports and writes the
// bytes it returns to the stream unchanged. A normal stream:
//
//   data: {"choices":[{"delta":{"role":"assistant","content":""}, ...}]}   chat only, before the first text
//   data: {"choices":[{"delta":{"content":"Hel"}, ...}]}                   one chunk per text delta
//   data: {"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_…","type":"function",
//          "function":{"name":"f","arguments":""}}]}, ...}]}              a tool call's first chunk (chat)
//   data: {"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{…}"}}]}, ...}]}
//   data: {"choices":[{"delta":{}, "finish_reason":"stop"}], ...}          the finish chunk ("tool_calls" after calls)
//   data: {"choices":[], "usage":{...}}                                    with stream_options.include_usage
//   data: [DONE]
//
// (each event followed by a blank line; completions chunks carry "text"
// instead of "delta"). A request that fails after the stream opened (the 200
// status line is out) ends with its error as one event, as OpenAI's API does:
//
//   data: {"error":{"message", "type", "param", "code"}}
//   data: [DONE]
//
// Every ending call (finish, fail, done) returns the final [DONE]; after it
// every call returns "". Not thread-safe: one encoder per stream, fed in order.

#include <cstdint>
#include <string>
#include <string_view>

#include "agent/openai_api.h"

namespace tandem::agent {

class OpenAiStreamEncoder {
 public:
  struct Options {
    Endpoint endpoint = Endpoint::kCompletions;
    std::string id;       // cmpl-… / chatcmpl-…
    int64_t created = 0;  // Unix seconds
    std::string model;
    bool include_usage = false;  // stream_options.include_usage: "usage": null on every chunk, then a usage chunk
  };

  explicit OpenAiStreamEncoder(Options options) : options_(std::move(options)) {}

  // Newly generated text; "" for empty text. A chat stream's first text is
  // preceded by its role chunk.
  std::string text(std::string_view delta);
  // Chat: tool call number `index` (0, 1, ... in order), as OpenAI streams
  // one: a chunk with its id, type and name, then its arguments.
  std::string toolCall(int index, const std::string& call_id, const std::string& name, const std::string& arguments);
  // A normal end (isNormalFinish(reason)): the role chunk if none was sent
  // yet (chat), the finish chunk, the usage chunk (include_usage), [DONE].
  std::string finish(engine::FinishReason reason, const Usage& usage);
  // The same with OpenAI's finish_reason given ("tool_calls").
  std::string finish(std::string_view finish_reason, const Usage& usage);
  // An end by failure: the error event, [DONE].
  std::string fail(const ApiError& error);
  // An end with nothing left to tell (the client is gone): [DONE] only.
  std::string done();

  bool ended() const { return ended_; }

 private:
  // The role chunk, once, on a chat stream.
  std::string roleChunk();
  std::string chunk(std::string_view text, std::string_view finish_reason);

  Options options_;
  bool role_sent_ = false;
  bool ended_ = false;
};

}  // namespace tandem::agent
