// Tool calling through /v1/chat/completions (agent/openai_tools.h,
// agent/tool_calls.h): the agent runs in-process on loopback with the tiny
// model, a Hermes-style chat template written into a copy of its
// tokenizer_config.json, and the --scripted-output test hook, so every
// reply is the tool call below, decoded and streamed on the normal path.
// The byte tokenizer makes one token per character, so usage's
// prompt_tokens tells exactly which text the template produced.

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "agent/agent_server.h"
#include "agent/openai_request.h"
#include "engine/model/tokenizer.h"
#include "src/common/clock.h"
#include "src/http/client.h"
#include "tests/agent/agent_process.h"

namespace tandem::agent {
namespace {

using nlohmann::json;

// Tools as <tools>name;...</tools>, then [role:content<tool_call>name(arguments)</tool_call>] per message.
constexpr const char* kTemplate =
    "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools>{% endif %}"
    "{% for m in messages %}[{{ m.role }}:{{ m.content }}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function.name }}({{ c.function.arguments | tojson "
    "}})</tool_call>{% endfor %}{% endif %}]{% endfor %}";

constexpr const char* kReply =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

json weatherTool() {
  return json::parse(R"({"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})");
}

json timeTool() { return {{"type", "function"}, {"function", {{"name", "get_time"}}}}; }

class ToolCallingAgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::filesystem::path script = testing::testScratchDir() / "tool-reply.txt";
    std::ofstream(script) << kReply;

    AgentConfig c;
    c.model_dir = testing::tinyModelWithChatTemplate("tiny-with-tools", kTemplate);
    c.model_name = "tiny";
    c.port = 0;
    c.request_timeout = std::chrono::seconds(10);
    c.engine.seed = 1;
    c.allow_test_hooks = true;
    c.scripted_output_file = script.string();
    auto server = AgentServer::start(c, clock_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    url_ = "http://127.0.0.1:" + std::to_string(server_->port()) + "/v1/chat/completions";
  }

  static json request(json extra = json::object()) {
    json body = {{"model", "tiny"},
                 {"messages", {{{"role", "user"}, {"content", "weather?"}}}},
                 {"tools", {weatherTool(), timeTool()}}};
    body.update(extra);
    return body;
  }

  absl::StatusOr<http::ClientResponse> post(const json& body) { return http::httpPost(url_, body); }

  // A 400 whose error names `param`, its message containing `says`.
  void expectRefused(const json& body, const std::string& param, const std::string& says) {
    SCOPED_TRACE(body.dump());
    auto r = post(body);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->status, 400) << r->body;
    const json error = (*r->json())["error"];
    EXPECT_EQ(error["param"], param) << r->body;
    EXPECT_NE(error["message"].get<std::string>().find(says), std::string::npos) << r->body;
  }

  FakeClock clock_;
  std::unique_ptr<AgentServer> server_;
  std::string url_;
};

TEST_F(ToolCallingAgentTest, ReplyIsReadAsToolCalls) {
  auto r = post(request());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->status, 200) << r->body;
  const json body = *r->json();
  const json& choice = body["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls") << r->body;
  EXPECT_TRUE(choice["message"]["content"].is_null()) << r->body;
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u) << r->body;
  const json& call = choice["message"]["tool_calls"][0];
  EXPECT_TRUE(call["id"].get<std::string>().starts_with("call_")) << r->body;
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}})) << r->body;
  // "<tools>get_weather;get_time;</tools>[user:weather?]"
  EXPECT_EQ(body["usage"]["prompt_tokens"], 51) << r->body;
}

TEST_F(ToolCallingAgentTest, StreamedToolCallChunks) {
  auto r = post(request({{"stream", true}}));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->status, 200) << r->body;
  std::vector<json> chunks;
  std::istringstream lines(r->body);
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with("data: {")) chunks.push_back(json::parse(line.substr(6)));
  }
  ASSERT_GE(chunks.size(), 4u) << r->body;
  std::string content, arguments, name, id;
  std::string finish;
  for (const json& c : chunks) {
    const json& choice = c["choices"][0];
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
    const json& delta = choice["delta"];
    if (delta.contains("content")) content += delta["content"].get<std::string>();
    if (!delta.contains("tool_calls")) continue;
    const json& tc = delta["tool_calls"][0];
    EXPECT_EQ(tc["index"], 0) << r->body;
    if (tc.contains("id")) {
      EXPECT_TRUE(id.empty()) << "one first chunk per call: " << r->body;
      id = tc["id"];
      EXPECT_EQ(tc["type"], "function");
      name = tc["function"]["name"];
    }
    arguments += tc["function"]["arguments"].get<std::string>();
  }
  EXPECT_EQ(content, "") << "the call is held back, not streamed as text: " << r->body;
  EXPECT_TRUE(id.starts_with("call_")) << r->body;
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(json::parse(arguments), json({{"city", "Paris"}})) << r->body;
  EXPECT_EQ(finish, "tool_calls") << r->body;
}

TEST_F(ToolCallingAgentTest, HistoryWithToolCallsAndResultsReachesTheTemplate) {
  json messages = {{{"role", "user"}, {"content", "w?"}},
                   {{"role", "assistant"},
                    {"content", nullptr},
                    {"tool_calls",
                     {{{"id", "call_1"},
                       {"type", "function"},
                       {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Oslo\"}"}}}}}}},
                   {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "rain"}}};
  auto r = post(request({{"messages", messages}, {"tool_choice", "none"}}));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->status, 200) << r->body;
  const json body = *r->json();
  // No tools under tool_choice "none"; the arguments string became an object
  // (tojson prints it as JSON, not as a quoted string):
  // [user:w?][assistant:None<tool_call>get_weather({"city": "Oslo"})</tool_call>][tool:rain]
  EXPECT_EQ(body["usage"]["prompt_tokens"], 88) << r->body;
  // Nor is the reply read as calls: the scripted call is plain text.
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop") << r->body;
  EXPECT_EQ(body["choices"][0]["message"]["content"], kReply) << r->body;
  EXPECT_FALSE(body["choices"][0]["message"].contains("tool_calls")) << r->body;
}

TEST_F(ToolCallingAgentTest, ACallTheRequestDoesNotAllowIsText) {
  // get_weather is not among the tools; under a forced get_time it is not allowed either.
  json only_time = json::object(), forced_time = json::object(), required_time = json::object();
  only_time["tools"] = json::array({timeTool()});
  forced_time["tool_choice"] = json::parse(R"({"type": "function", "function": {"name": "get_time"}})");
  required_time["tools"] = json::array({timeTool()});
  required_time["tool_choice"] = "required";
  for (const json& extra : {only_time, forced_time, required_time}) {
    SCOPED_TRACE(extra.dump());
    auto r = post(request(extra));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->status, 200) << r->body;
    const json choice = (*r->json())["choices"][0];
    EXPECT_EQ(choice["finish_reason"], "stop") << r->body;
    EXPECT_EQ(choice["message"]["content"], kReply) << r->body;
  }
}

TEST_F(ToolCallingAgentTest, BadToolsAreRefusedNamingTheField) {
  expectRefused(request({{"tools", "get_weather"}}), "tools", "must be an array");
  expectRefused(request({{"tools", {weatherTool(), 3}}}), "tools[1]", "must be an object");
  expectRefused(request({{"tools", {weatherTool(), {{"type", "retrieval"}, {"function", {{"name", "x"}}}}}}}),
                "tools[1].type", "must be \"function\"");
  expectRefused(request({{"tools", {weatherTool(), {{"type", "function"}}}}}), "tools[1].function", "required");
  expectRefused(request({{"tools", {weatherTool(), {{"type", "function"}, {"function", {{"description", "d"}}}}}}}),
                "tools[1].function.name", "tools[1].function.name: required");
  expectRefused(request({{"tools", {{{"type", "function"}, {"function", {{"name", "get weather"}}}}}}}),
                "tools[0].function.name", "a-z, A-Z, 0-9");
  expectRefused(request({{"tools", {weatherTool(), weatherTool()}}}), "tools[1].function.name", "already");
  expectRefused(request({{"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", "object"}}}}}}}),
                "tools[0].function.parameters", "JSON Schema object");
  expectRefused(request({{"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"description", 1}}}}}}}),
                "tools[0].function.description", "must be a string");
}

TEST_F(ToolCallingAgentTest, BadToolChoiceIsRefusedNamingTheField) {
  expectRefused(request({{"tool_choice", "any"}}), "tool_choice", "\"auto\", \"none\", \"required\"");
  expectRefused(request({{"tool_choice", 1}}), "tool_choice", "must be a string or an object");
  expectRefused(request({{"tool_choice", {{"type", "function"}, {"function", {{"name", "get_stock"}}}}}}),
                "tool_choice.function.name", "not one of 'tools'");
  expectRefused(request({{"tool_choice", {{"type", "function"}}}}), "tool_choice.function", "required");
  expectRefused(request({{"tool_choice", {{"type", "tool"}, {"function", {{"name", "get_time"}}}}}}),
                "tool_choice.type", "must be \"function\"");
  json no_tools = request({{"tool_choice", "required"}});
  no_tools.erase("tools");
  expectRefused(no_tools, "tool_choice", "needs 'tools'");
  expectRefused(request({{"parallel_tool_calls", "yes"}}), "parallel_tool_calls", "must be a boolean");
}

TEST_F(ToolCallingAgentTest, BadToolMessagesAreRefusedNamingTheField) {
  auto assistant = [](json call) {
    return json{{{"role", "user"}, {"content", "w?"}}, {{"role", "assistant"}, {"tool_calls", {std::move(call)}}}};
  };
  const json fn = {{"name", "get_weather"}, {"arguments", "{\"city\": "}};
  expectRefused(request({{"messages", assistant({{"id", "c"}, {"type", "function"}, {"function", fn}})}}),
                "messages[1].tool_calls[0].function.arguments", "JSON object");
  expectRefused(request({{"messages", assistant({{"type", "function"}, {"function", fn}})}}),
                "messages[1].tool_calls[0].id", "required");
  expectRefused(
      request({{"messages",
                {{{"role", "user"}, {"content", "w?"}}, {{"role", "tool"}, {"content", "r"}, {"tool_call_id", 7}}}}}),
      "messages[1].tool_call_id", "must be a string");
}

// A model without a chat template (the tiny model's built-in format, Llama
// 2's) cannot render tools: refused, not silently dropped.
TEST(ToolCallingWithoutTemplateTest, ToolsAreRefused) {
  engine::ByteTokenizer tok;
  ApiLimits limits{.model_name = "tiny", .max_model_len = 256};
  const json body = {
      {"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"tools", {weatherTool()}}};
  auto r = parseRequest(Endpoint::kChat, body, tok, limits, std::nullopt);
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  const ApiError& e = std::get<ApiError>(r);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "tools");
  EXPECT_NE(e.message.find("cannot render tools"), std::string::npos) << e.message;
  // tool_choice "none" without tools, as some clients send, is fine.
  json none = body;
  none.erase("tools");
  none["tool_choice"] = "none";
  EXPECT_TRUE(std::holds_alternative<ParsedRequest>(parseRequest(Endpoint::kChat, none, tok, limits, std::nullopt)));
}

}  // namespace
}  // namespace tandem::agent
