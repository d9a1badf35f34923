// A model directory whose tokenizer_config.json has a chat_template: the
// agent (in-process, on loopback) renders chat requests with it. The tiny
// model's byte tokenizer makes one token per character, so usage's
// prompt_tokens tells exactly which text the template produced.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "agent/agent_server.h"
#include "agent/chat_template.h"
#include "src/common/clock.h"
#include "src/http/client.h"
#include "tests/agent/agent_process.h"
#include "tests/engine/model/family_tokenizer.h"
#include "tests/engine/model/scratch_dir.h"

namespace tandem::agent {
namespace {

using nlohmann::json;

// [role:content] per message, then the year from strftime_now (FakeClock:
// 2026), refusing a "forbidden" message as a template would.
constexpr const char* kTemplate =
    "{% for m in messages %}{% if m.content == 'forbidden' %}{{ raise_exception('message ' ~ loop.index ~ ' is "
    "forbidden') }}{% endif %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
    "{% if enable_thinking is defined %}<think={{ enable_thinking }}>{% endif %}"
    "{% if add_generation_prompt %}{{ strftime_now('%Y') }}{% endif %}";

class ChatTemplateAgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    AgentConfig c;
    c.model_dir = testing::tinyModelWithChatTemplate("tiny-with-template", kTemplate);
    c.model_name = "tiny";
    c.port = 0;
    c.request_timeout = std::chrono::seconds(5);
    c.engine.seed = 1;
    auto server = AgentServer::start(c, clock_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    url_ = "http://127.0.0.1:" + std::to_string(server_->port()) + "/v1/chat/completions";
  }

  absl::StatusOr<http::ClientResponse> chat(json messages, json extra = json::object()) {
    json body = {{"model", "tiny"}, {"messages", std::move(messages)}, {"max_tokens", 1}};
    body.update(extra);
    return http::httpPost(url_, body);
  }

  FakeClock clock_;
  std::unique_ptr<AgentServer> server_;
  std::string url_;
};

// A Llama 3 / Qwen2 / Qwen3 model directory whose chat template uses a
// construct the Jinja subset refuses: the model does not load, and the error
// names the file, the field and the construct.
TEST(ChatTemplateLoadTest, UnsupportedConstructIsRefusedForEachFamily) {
  for (std::string_view family : {"llama3", "qwen2", "qwen3"}) {
    engine::testing::ScratchDir dir;
    nlohmann::json config = engine::testing::familyTokenizerConfig(family);
    engine::testing::writeTokenizerFiles(dir.path(), engine::testing::familyTokenizerJson(family), config);
    auto good = loadChatTemplate(dir.path());
    ASSERT_TRUE(good.ok()) << family << ": " << good.status();
    ASSERT_TRUE(good->has_value()) << family;

    config["chat_template"] = "{% macro turn(m) %}" + config["chat_template"].get<std::string>() + "{% endmacro %}";
    engine::testing::writeTokenizerFiles(dir.path(), engine::testing::familyTokenizerJson(family), config);
    auto bad = loadChatTemplate(dir.path());
    ASSERT_FALSE(bad.ok()) << family << " loaded";
    EXPECT_THAT(std::string(bad.status().message()),
                ::testing::HasSubstr(dir.path() + "/tokenizer_config.json: chat_template: "))
        << family;
    EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("the \"macro\" block is not supported"))
        << family;
  }
}

TEST_F(ChatTemplateAgentTest, RendersTheModelsTemplate) {
  auto r = chat({{{"role", "system"}, {"content", "s"}}, {{"role", "user"}, {"content", "hi"}}});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->status, 200) << r->body;
  // "[system:s][user:hi]2026": 23 characters, no <s> (the template writes its own);
  // the built-in format would be "<s>" + "<|system|>\ns\n<|user|>\nhi\n<|assistant|>\n".
  EXPECT_EQ((*r->json())["usage"]["prompt_tokens"], 23) << r->body;
}

TEST_F(ChatTemplateAgentTest, PassesRolesAndKwargsTheTemplateKnows) {
  auto r = chat({{{"role", "user"}, {"content", "q"}}, {{"role", "tool"}, {"content", "r"}}},
                {{"chat_template_kwargs", {{"enable_thinking", false}}}});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->status, 200) << r->body;
  // "[user:q][tool:r]<think=False>2026"
  EXPECT_EQ((*r->json())["usage"]["prompt_tokens"], 33) << r->body;
}

TEST_F(ChatTemplateAgentTest, RaiseExceptionIsA400WithTheTemplatesMessage) {
  auto r = chat({{{"role", "user"}, {"content", "ok"}}, {{"role", "user"}, {"content", "forbidden"}}});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->status, 400) << r->body;
  const json error = (*r->json())["error"];
  EXPECT_EQ(error["param"], "messages");
  EXPECT_NE(error["message"].get<std::string>().find("message 2 is forbidden"), std::string::npos) << r->body;
}

TEST_F(ChatTemplateAgentTest, BadKwargsAreA400) {
  auto r = chat({{{"role", "user"}, {"content", "q"}}}, {{"chat_template_kwargs", "yes"}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_NE(r->body.find("chat_template_kwargs"), std::string::npos) << r->body;
}

// A model directory whose template uses a construct the engine does not
// have: the agent refuses to start, naming the file, the line and column,
// and the construct (a bad model directory gets a clear error, not a
// template that renders something else).
TEST(ChatTemplateModelDirTest, AnUnsupportedConstructStopsTheAgentNamingFileLineAndConstruct) {
  const std::string dir =
      testing::tinyModelWithChatTemplate("tiny-with-macro", "{% for m in messages %}{{ m.content }}{% endfor %}\n"
                                                            "{% macro greet(name) %}hi {{ name }}{% endmacro %}");
  auto loaded = loadChatTemplate(dir);
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find(dir + "/tokenizer_config.json"), std::string::npos) << loaded.status();
  EXPECT_NE(loaded.status().message().find(":2:"), std::string::npos) << loaded.status();
  EXPECT_NE(loaded.status().message().find("\"macro\" block is not supported"), std::string::npos) << loaded.status();
  AgentConfig c;
  c.model_dir = dir;
  c.model_name = "tiny";
  c.port = 0;
  FakeClock clock;
  auto server = AgentServer::start(c, clock);
  ASSERT_FALSE(server.ok());
  EXPECT_NE(server.status().message().find("macro"), std::string::npos) << server.status();
}

}  // namespace
}  // namespace tandem::agent
