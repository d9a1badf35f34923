#include "agent/openai_stream.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "src/http/sse.h"

namespace tandem::agent {
namespace {

using nlohmann::json;

OpenAiStreamEncoder encoder(Endpoint endpoint, bool include_usage = false) {
  return OpenAiStreamEncoder(
      {.endpoint = endpoint, .id = "id-1", .created = 7, .model = "tiny", .include_usage = include_usage});
}

// The data payloads of `bytes`, which must be whole SSE events.
std::vector<std::string> events(const std::string& bytes) {
  http::SseParser parser;
  std::vector<std::string> out;
  for (const http::SseEvent& e : parser.feed(bytes)) out.push_back(e.data);
  return out;
}

TEST(OpenAiStreamEncoderTest, ToolCallsAsOpenAiStreamsThem) {
  OpenAiStreamEncoder enc = encoder(Endpoint::kChat);
  std::string bytes = enc.toolCall(0, "call_a", "get_time", R"({"tz":"UTC"})");
  bytes += enc.toolCall(1, "call_b", "get_weather", "{}");
  bytes += enc.finish("tool_calls", {3, 9});
  std::vector<std::string> got = events(bytes);
  ASSERT_EQ(got.size(), 7u) << bytes;  // role, two chunks per call, finish, [DONE]
  EXPECT_EQ(json::parse(got[0])["choices"][0]["delta"], (json{{"role", "assistant"}, {"content", ""}}));
  EXPECT_EQ(json::parse(got[1])["choices"][0]["delta"],
            json::parse(R"({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                            "function": {"name": "get_time", "arguments": ""}}]})"));
  EXPECT_EQ(json::parse(got[2])["choices"][0]["delta"],
            json::parse(R"({"tool_calls": [{"index": 0, "function": {"arguments": "{\"tz\":\"UTC\"}"}}]})"));
  EXPECT_EQ(json::parse(got[3])["choices"][0]["delta"]["tool_calls"][0]["index"], 1);
  EXPECT_EQ(json::parse(got[3])["choices"][0]["delta"]["tool_calls"][0]["id"], "call_b");
  EXPECT_EQ(json::parse(got[5])["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(got[6], "[DONE]");
}

TEST(OpenAiStreamEncoderTest, ChatStreamStartsWithRoleAndEndsWithFinishThenDone) {
  OpenAiStreamEncoder enc = encoder(Endpoint::kChat);
  std::string bytes = enc.text("Hel");
  bytes += enc.text("");  // a step that produced no complete character
  bytes += enc.text("lo");
  EXPECT_FALSE(enc.ended());
  bytes += enc.finish(engine::FinishReason::kLength, {3, 2});
  EXPECT_TRUE(enc.ended());
  std::vector<std::string> got = events(bytes);
  ASSERT_EQ(got.size(), 5u) << bytes;
  json role = json::parse(got[0]);
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["id"], "id-1");
  EXPECT_EQ(role["created"], 7);
  EXPECT_EQ(role["model"], "tiny");
  EXPECT_EQ(role["choices"][0]["delta"], (json{{"role", "assistant"}, {"content", ""}}));
  EXPECT_EQ(json::parse(got[1])["choices"][0]["delta"], (json{{"content", "Hel"}}));
  EXPECT_EQ(json::parse(got[2])["choices"][0]["delta"], (json{{"content", "lo"}}));
  json last = json::parse(got[3]);
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(last.contains("usage"));
  EXPECT_EQ(got[4], "[DONE]");
}

TEST(OpenAiStreamEncoderTest, ChatWithoutTextStillSendsTheRoleBeforeTheFinish) {
  OpenAiStreamEncoder enc = encoder(Endpoint::kChat);
  std::vector<std::string> got = events(enc.finish(engine::FinishReason::kEos, {3, 1}));
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(json::parse(got[0])["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(json::parse(got[1])["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(got[2], "[DONE]");
}

TEST(OpenAiStreamEncoderTest, CompletionsWithUsage) {
  OpenAiStreamEncoder enc = encoder(Endpoint::kCompletions, /*include_usage=*/true);
  std::string bytes = enc.text("a");
  bytes += enc.finish(engine::FinishReason::kStop, {4, 1});
  std::vector<std::string> got = events(bytes);
  ASSERT_EQ(got.size(), 4u) << bytes;  // no role chunk on completions
  json first = json::parse(got[0]);
  EXPECT_EQ(first["object"], "text_completion");
  EXPECT_EQ(first["choices"][0]["text"], "a");
  EXPECT_TRUE(first.contains("usage") && first["usage"].is_null());
  EXPECT_EQ(json::parse(got[1])["choices"][0]["finish_reason"], "stop");
  json usage = json::parse(got[2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"], (json{{"prompt_tokens", 4}, {"completion_tokens", 1}, {"total_tokens", 5}}));
  EXPECT_EQ(got[3], "[DONE]");
}

TEST(OpenAiStreamEncoderTest, FailureIsOneErrorEventThenDone) {
  OpenAiStreamEncoder enc = encoder(Endpoint::kChat);
  std::string bytes = enc.text("x");
  bytes += enc.fail({.status = 504, .type = "timeout_error", .message = "too slow", .code = "timeout"});
  std::vector<std::string> got = events(bytes);
  ASSERT_EQ(got.size(), 4u) << bytes;
  json error = json::parse(got[2]);
  EXPECT_EQ(error["error"]["code"], "timeout");
  EXPECT_EQ(error["error"]["message"], "too slow");
  EXPECT_EQ(got[3], "[DONE]");
}

TEST(OpenAiStreamEncoderTest, WireBytesAndNothingAfterTheEnd) {
  OpenAiStreamEncoder enc = encoder(Endpoint::kCompletions);
  std::string chunk = enc.text("hi");
  EXPECT_TRUE(chunk.starts_with("data: {")) << chunk;
  EXPECT_TRUE(chunk.ends_with("}\n\n")) << chunk;
  EXPECT_EQ(enc.done(), "data: [DONE]\n\n");  // a client gone: no error event
  EXPECT_EQ(enc.text("more"), "");
  EXPECT_EQ(enc.finish(engine::FinishReason::kEos, {}), "");
  EXPECT_EQ(enc.fail({.message = "late"}), "");
  EXPECT_EQ(enc.done(), "");
}

}  // namespace
}  // namespace tandem::agent
