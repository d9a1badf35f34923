// A model directory whose tokenizer_config.json has a chat_template: the
// agent (in-process, on loopback) renders chat requests with it. The tiny
// model's byte tokenizer makes one token per character, so usage's
// prompt_tokens tells exactly which text the template produced. A Llama 2
// directory (SentencePiece) checks that the template's <s> is the one BOS.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "agent/agent_server.h"
#include "agent/chat_template.h"
#include "engine/model/model_loader.h"
#include "engine/model/tokenizer.h"
#include "engine/model/weights.h"
#include "src/common/clock.h"
#include "src/http/client.h"
#include "tests/agent/agent_process.h"
#include "tests/engine/model/family_tokenizer.h"
#include "tests/engine/model/scratch_dir.h"
#include "tests/engine/model/sentencepiece_train_util.h"

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

// A Llama 2 model directory: tokenizer.model (SentencePiece, trained here),
// and a tokenizer_config.json whose chat template writes {{ bos_token }}
// ("<s>") itself. The agent's prompt has that <s> as the one BOS id, and
// the rest is "[INST] hi [/INST]" as SentencePiece encodes it: "<s>" spelled
// out would take several byte pieces, a second BOS one more token.
TEST(Llama2ChatTemplateAgentTest, TheTemplatesBosIsTheOnlyBos) {
  engine::testing::ScratchDir dir;
  std::string corpus;
  for (int i = 0; i < 300; ++i) corpus += "hi there, tell me more about the cache and the engine.\n";
  engine::testing::writeText(dir.file("corpus.txt"), corpus);
  ASSERT_EQ(engine::testing::trainSentencePiece(
                "--input=" + dir.file("corpus.txt") + " --model_prefix=" + dir.file("tokenizer") +
                " --vocab_size=300 --hard_vocab_limit=false --model_type=bpe --byte_fallback=true"
                " --character_coverage=1.0 --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1 --num_threads=1"
                " --minloglevel=2"),
            "");
  engine::ModelConfig model = engine::tinyModelConfig();
  model.vocab_size = 512;
  ASSERT_TRUE(engine::writeModelDir(dir.path(), *engine::makeRandomWeights(model, 7), engine::DType::kF32).ok());
  const json tokenizer_config = {
      {"tokenizer_class", "LlamaTokenizer"},
      {"bos_token", "<s>"},
      {"eos_token", "</s>"},
      {"chat_template", "{{ bos_token }}{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"}};
  engine::testing::writeText(dir.file("tokenizer_config.json"), tokenizer_config.dump());
  auto tok = engine::SentencePieceTokenizer::open(dir.file("tokenizer.model"));
  ASSERT_TRUE(tok.ok()) << tok.status();
  const int want = 1 + static_cast<int>((*tok)->encode("[INST] hi [/INST]").size());

  AgentConfig c;
  c.model_dir = dir.path();
  c.model_name = "llama";
  c.port = 0;
  c.request_timeout = std::chrono::seconds(5);
  c.engine.seed = 1;
  FakeClock clock;
  auto server = AgentServer::start(c, clock);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string base = "http://127.0.0.1:" + std::to_string((*server)->port());

  auto chat =
      http::httpPost(base + "/v1/chat/completions",
                     {{"model", "llama"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 1}});
  ASSERT_TRUE(chat.ok()) << chat.status();
  ASSERT_EQ(chat->status, 200) << chat->body;
  EXPECT_EQ((*chat->json())["usage"]["prompt_tokens"], want) << chat->body;

  // /v1/completions adds the BOS to plain text: the same prompt.
  auto completion = http::httpPost(base + "/v1/completions",
                                   {{"model", "llama"}, {"prompt", "[INST] hi [/INST]"}, {"max_tokens", 1}});
  ASSERT_TRUE(completion.ok()) << completion.status();
  ASSERT_EQ(completion->status, 200) << completion->body;
  EXPECT_EQ((*completion->json())["usage"]["prompt_tokens"], want) << completion->body;
}

}  // namespace
}  // namespace tandem::agent
