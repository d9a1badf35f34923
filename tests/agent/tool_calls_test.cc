// Reading tool calls back out of model output (agent/tool_calls.h): each
// family's format, several calls, text around them, and the malformed
// output that must stay text.

#include "agent/tool_calls.h"

#include <gtest/gtest.h>

namespace tandem::agent {
namespace {

const ToolRules kRules{.names = {"get_weather", "get_time"}};

std::optional<ToolCallOutput> hermes(std::string_view text, const ToolRules& rules = kRules) {
  return parseToolCalls(ToolCallFormat::kHermes, text, rules);
}

std::optional<ToolCallOutput> llama(std::string_view text, const ToolRules& rules = kRules) {
  return parseToolCalls(ToolCallFormat::kLlamaJson, text, rules);
}

TEST(ToolCallFormatTest, ChosenFromTheTemplateText) {
  EXPECT_EQ(toolCallFormatOf("{% for t in tools %}...<tool_call>\\n{\"name\": ...}</tool_call>{% endfor %}"),
            ToolCallFormat::kHermes);
  EXPECT_EQ(toolCallFormatOf("<|start_header_id|>system<|end_header_id|>{% if tools is not none %}..."),
            ToolCallFormat::kLlamaJson);
  EXPECT_EQ(toolCallFormatOf("<|start_header_id|>{{ m.content }}"), ToolCallFormat::kNone);  // Llama 3.0: no tools
  EXPECT_EQ(toolCallFormatOf("[{{ m.role }}:{{ m.content }}]"), ToolCallFormat::kNone);
}

TEST(HermesToolCallsTest, OneCall) {
  auto out = hermes("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
  ASSERT_TRUE(out);
  ASSERT_EQ(out->calls.size(), 1u);
  EXPECT_EQ(out->calls[0].name, "get_weather");
  EXPECT_EQ(out->calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(out->content, "");
}

TEST(HermesToolCallsTest, SeveralCallsInOrderWithTextAround) {
  auto out = hermes(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\nDone.");
  ASSERT_TRUE(out);
  ASSERT_EQ(out->calls.size(), 2u);
  EXPECT_EQ(out->calls[0].name, "get_weather");
  EXPECT_EQ(out->calls[1].name, "get_time");
  EXPECT_EQ(out->calls[1].arguments, "{}");
  EXPECT_EQ(out->content, "Let me check.\nDone.");  // each piece trimmed, joined by newlines
}

TEST(HermesToolCallsTest, AnUnclosedLastCallStillEnds) {
  auto out = hermes("<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}");
  ASSERT_TRUE(out);
  EXPECT_EQ(out->calls[0].arguments, R"({"tz":"UTC"})");
}

TEST(HermesToolCallsTest, MissingArgumentsAreAnEmptyObject) {
  auto out = hermes("<tool_call>{\"name\": \"get_time\"}</tool_call>");
  ASSERT_TRUE(out);
  EXPECT_EQ(out->calls[0].arguments, "{}");
}

TEST(HermesToolCallsTest, MalformedOutputIsText) {
  EXPECT_FALSE(hermes("just words"));
  EXPECT_FALSE(hermes("<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\n</tool_call>"));    // bad JSON
  EXPECT_FALSE(hermes("<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>"));         // unknown tool
  EXPECT_FALSE(hermes("<tool_call>{\"name\": \"get_time\", \"arguments\": \"{}\"}</tool_call>"));  // a string
  EXPECT_FALSE(hermes("<tool_call>{\"name\": \"get_time\", \"arguments\": [1]}</tool_call>"));
  EXPECT_FALSE(hermes("<tool_call>[\"get_time\"]</tool_call>"));
  EXPECT_FALSE(hermes("<tool_call>{\"arguments\": {}}</tool_call>"));  // no name
  // One bad call makes the whole reply text: no partial set of calls.
  EXPECT_FALSE(hermes("<tool_call>{\"name\": \"get_time\"}</tool_call><tool_call>{oops}</tool_call>"));
}

TEST(HermesToolCallsTest, RulesOfTheRequest) {
  const std::string two =
      "<tool_call>{\"name\": \"get_time\"}</tool_call><tool_call>{\"name\": \"get_weather\"}</tool_call>";
  EXPECT_FALSE(hermes(two, ToolRules{.names = kRules.names, .parallel = false}));
  EXPECT_TRUE(hermes(two, ToolRules{.names = kRules.names, .parallel = true}));
  EXPECT_FALSE(hermes(two, ToolRules{.names = kRules.names, .forced_name = "get_time"}));
  EXPECT_TRUE(hermes("<tool_call>{\"name\": \"get_time\"}</tool_call>",
                     ToolRules{.names = kRules.names, .forced_name = "get_time"}));
  EXPECT_FALSE(hermes("<tool_call>{\"name\": \"get_time\"}</tool_call>", ToolRules{}));  // no tools: never calls
}

TEST(LlamaToolCallsTest, TheWholeReplyIsOneCall) {
  auto out = llama("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}");
  ASSERT_TRUE(out);
  ASSERT_EQ(out->calls.size(), 1u);
  EXPECT_EQ(out->calls[0].name, "get_weather");
  EXPECT_EQ(out->calls[0].arguments, R"({"city":"Rome"})");
  EXPECT_EQ(out->content, "");
}

TEST(LlamaToolCallsTest, AfterPythonTagAndWithArgumentsKey) {
  auto out = llama("<|python_tag|>{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}");
  ASSERT_TRUE(out);
  EXPECT_EQ(out->calls[0].arguments, R"({"tz":"CET"})");
  EXPECT_TRUE(llama("  \n{\"name\": \"get_time\", \"parameters\": {}}\n"));
}

TEST(LlamaToolCallsTest, MalformedOrSurroundedOutputIsText) {
  EXPECT_FALSE(llama("The weather is fine."));
  EXPECT_FALSE(llama("Sure: {\"name\": \"get_time\", \"parameters\": {}}"));  // text before: not a call
  EXPECT_FALSE(llama("{\"name\": \"get_time\", \"parameters\": {}} and more"));
  EXPECT_FALSE(llama("{\"name\": \"get_time\", \"parameters\": 3}"));
  EXPECT_FALSE(llama("{\"name\": \"nope\", \"parameters\": {}}"));
  EXPECT_FALSE(llama("{\"name\": \"get_time\", \"parameters\": {"));
}

// Feeds `deltas` one by one; returns the content released along the way.
std::string feedAll(ToolCallStream& s, std::initializer_list<std::string_view> deltas) {
  std::string out;
  for (std::string_view d : deltas) out += s.feed(d);
  return out;
}

TEST(ToolCallStreamTest, HermesHoldsBackFromTheTagAndParsesAtTheEnd) {
  ToolCallStream s(ToolCallFormat::kHermes, kRules);
  // "<tool" could begin a call: held until it is clear.
  EXPECT_EQ(feedAll(s, {"Checking", " <tool"}), "Checking");  // the space may precede a call: held too
  EXPECT_EQ(feedAll(s, {"_call>\n{\"name\": \"get_time\", ", "\"arguments\": {}}\n</tool_call>"}), "");
  std::string rest;
  auto out = s.finish(&rest);
  ASSERT_TRUE(out);
  EXPECT_EQ(out->calls[0].name, "get_time");
  EXPECT_EQ(rest, "");
}

TEST(ToolCallStreamTest, HermesReleasesATailThatTurnsOutToBeText) {
  ToolCallStream s(ToolCallFormat::kHermes, kRules);
  EXPECT_EQ(feedAll(s, {"a <to"}), "a");
  EXPECT_EQ(feedAll(s, {"ol> b"}), " <tool> b");
  EXPECT_EQ(feedAll(s, {"\n"}), "");  // trailing whitespace waits for what follows
  std::string rest;
  EXPECT_FALSE(s.finish(&rest));
  EXPECT_EQ(rest, "\n");
}

TEST(ToolCallStreamTest, MalformedHeldTextComesBackAsRest) {
  ToolCallStream s(ToolCallFormat::kHermes, kRules);
  EXPECT_EQ(feedAll(s, {"<tool_call>{\"name\": \"nope\"}</tool_call>"}), "");
  std::string rest;
  EXPECT_FALSE(s.finish(&rest));
  EXPECT_EQ(rest, "<tool_call>{\"name\": \"nope\"}</tool_call>");
}

TEST(ToolCallStreamTest, LlamaDecidesOnTheFirstCharacter) {
  ToolCallStream text(ToolCallFormat::kLlamaJson, kRules);
  EXPECT_EQ(feedAll(text, {"  ", "Hi", " there"}), "  Hi there");
  ToolCallStream call(ToolCallFormat::kLlamaJson, kRules);
  EXPECT_EQ(feedAll(call, {"<|python", "_tag|>{\"name\": \"get_time\",", " \"parameters\": {}}"}), "");
  std::string rest;
  auto out = call.finish(&rest);
  ASSERT_TRUE(out);
  EXPECT_EQ(out->calls[0].name, "get_time");
}

TEST(ToolCallStreamTest, WithoutToolsEverythingPassesThrough) {
  ToolCallStream s(ToolCallFormat::kHermes, ToolRules{});
  EXPECT_EQ(feedAll(s, {"<tool_call>{\"name\": \"get_time\"}</tool_call>"}),
            "<tool_call>{\"name\": \"get_time\"}</tool_call>");
  std::string rest;
  EXPECT_FALSE(s.finish(&rest));
}

}  // namespace
}  // namespace tandem::agent
