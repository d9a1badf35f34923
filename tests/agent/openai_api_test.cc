#include "agent/openai_api.h"

#include <gtest/gtest.h>

#include "agent/chat_template.h"
#include "agent/openai_request.h"

#include "tests/engine/model/scratch_dir.h"
#include "tests/engine/model/sentencepiece_train_util.h"

namespace tandem::agent {
namespace {

using nlohmann::json;

class OpenAiApiTest : public ::testing::Test {
 protected:
  ApiLimits limits{.model_name = "tiny", .max_model_len = 64, .default_max_tokens = 20};
  engine::ByteTokenizer tok;

  std::variant<ParsedRequest, ApiError> parse(Endpoint e, const json& body, std::optional<std::string> session = {}) {
    return parseRequest(e, body, tok, limits, std::move(session));
  }
  ParsedRequest ok(Endpoint e, const json& body) {
    auto r = parse(e, body);
    if (auto* err = std::get_if<ApiError>(&r)) ADD_FAILURE() << err->message;
    return std::get<ParsedRequest>(r);
  }
  // Expects an error with this status, param, and a message containing `needle`.
  void bad(Endpoint e, const json& body, int status, const std::string& param, const std::string& needle) {
    auto r = parse(e, body);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << body.dump();
    const ApiError& err = std::get<ApiError>(r);
    EXPECT_EQ(err.status, status) << body.dump() << " -> " << err.message;
    EXPECT_EQ(err.param, param) << body.dump();
    EXPECT_NE(err.message.find(needle), std::string::npos) << "message: " << err.message;
    json j = err.toJson();
    EXPECT_TRUE(j["error"].contains("message") && j["error"].contains("type") && j["error"].contains("param") &&
                j["error"].contains("code"));
  }
};

TEST_F(OpenAiApiTest, CompletionDefaultsAndFields) {
  ParsedRequest r = ok(Endpoint::kCompletions, {{"model", "tiny"}, {"prompt", "hi"}});
  EXPECT_EQ(r.spec.prompt, (std::vector<TokenId>{1, tok.encode("h")[0], tok.encode("i")[0]}));  // <s> + text
  EXPECT_EQ(r.spec.sampling.max_tokens, 16);  // OpenAI's completions default
  EXPECT_FLOAT_EQ(r.spec.sampling.temperature, 1.0f);
  EXPECT_FALSE(r.stream);

  r = ok(Endpoint::kCompletions, {{"model", "tiny"},
                                  {"prompt", {5, 6, 7}},
                                  {"max_tokens", 3},
                                  {"temperature", 0},
                                  {"top_p", 0.5},
                                  {"top_k", 4},
                                  {"seed", 9},
                                  {"stop", {"a", "b"}},
                                  {"stream", true},
                                  {"stream_options", {{"include_usage", true}}},
                                  {"user", "u1"},
                                  {"n", 1}});
  EXPECT_EQ(r.spec.prompt, (std::vector<TokenId>{5, 6, 7}));
  EXPECT_EQ(r.spec.sampling.max_tokens, 3);
  EXPECT_EQ(r.spec.sampling.temperature, 0.0f);
  EXPECT_FLOAT_EQ(r.spec.sampling.top_p, 0.5f);
  EXPECT_EQ(r.spec.sampling.top_k, 4);
  EXPECT_EQ(r.spec.sampling.seed, 9u);
  EXPECT_EQ(r.spec.sampling.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.spec.session, SessionId("u1"));
  // A batch of one token array, as the SDKs' types allow.
  r = ok(Endpoint::kCompletions, {{"model", "tiny"}, {"prompt", {{5, 6, 7}}}});
  EXPECT_EQ(r.spec.prompt, (std::vector<TokenId>{5, 6, 7}));
}

TEST_F(OpenAiApiTest, SessionHeaderWinsOverUser) {
  auto r = std::get<ParsedRequest>(
      parse(Endpoint::kCompletions, {{"model", "tiny"}, {"prompt", "x"}, {"user", "u"}}, "sess-9"));
  EXPECT_EQ(r.spec.session, SessionId("sess-9"));
}

TEST_F(OpenAiApiTest, ChatRendersDocumentedTemplate) {
  ParsedRequest r = ok(Endpoint::kChat, {{"model", "tiny"},
                                         {"messages",
                                          {{{"role", "system"}, {"content", "be brief"}},
                                           {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "hi"}}}}}}},
                                         {"max_completion_tokens", 5}});
  std::vector<TokenId> expected{1};
  auto t = tok.encode("<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n");
  expected.insert(expected.end(), t.begin(), t.end());
  EXPECT_EQ(r.spec.prompt, expected);
  EXPECT_EQ(r.spec.sampling.max_tokens, 5);
  // Without max_tokens, chat gets the configured default, capped by the context left.
  r = ok(Endpoint::kChat, {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}});
  EXPECT_EQ(r.spec.sampling.max_tokens, 20);
}

TEST_F(OpenAiApiTest, BadInputsGetStatusParamAndMessage) {
  const json base_c = {{"model", "tiny"}, {"prompt", "hello"}};
  const json base_m = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  auto with = [](json j, const std::string& k, json v) {
    j[k] = std::move(v);
    return j;
  };
  bad(Endpoint::kCompletions, json::array({1}), 400, "", "must be a JSON object");
  bad(Endpoint::kCompletions, {{"prompt", "x"}}, 400, "model", "'model' is required");
  bad(Endpoint::kCompletions, with(base_c, "model", "gpt-4"), 404, "model", "does not exist");
  bad(Endpoint::kCompletions, with(base_c, "model", 5), 400, "model", "must be a string");
  // missing prompt / messages, empty ones
  bad(Endpoint::kCompletions, {{"model", "tiny"}}, 400, "prompt", "'prompt' is required");
  bad(Endpoint::kCompletions, with(base_c, "prompt", ""), 400, "prompt", "must not be empty");
  bad(Endpoint::kCompletions, with(base_c, "prompt", json::array()), 400, "prompt", "must not be empty");
  bad(Endpoint::kCompletions, with(base_c, "prompt", {"a", "b"}), 400, "prompt", "batched prompts");
  bad(Endpoint::kCompletions, with(base_c, "prompt", {5, 1000}), 400, "prompt", "not a token id");
  bad(Endpoint::kCompletions, with(base_c, "prompt", 7), 400, "prompt", "must be a string");
  bad(Endpoint::kChat, {{"model", "tiny"}}, 400, "messages", "'messages' is required");
  bad(Endpoint::kChat, with(base_m, "messages", json::array()), 400, "messages", "at least one message");
  bad(Endpoint::kChat, with(base_m, "messages", "hi"), 400, "messages", "must be an array");
  bad(Endpoint::kChat, with(base_m, "messages", {{{"role", "wizard"}, {"content", "x"}}}), 400, "messages[0].role",
      "'wizard'");
  bad(Endpoint::kChat, with(base_m, "messages", {{{"content", "x"}}}), 400, "messages[0].role", "required");
  bad(Endpoint::kChat, with(base_m, "messages", {{{"role", "user"}}}), 400, "messages[0].content", "required");
  bad(Endpoint::kChat, with(base_m, "messages", {{{"role", "user"}, {"content", 5}}}), 400, "messages[0].content",
      "must be a string");
  bad(Endpoint::kChat, with(base_m, "messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}), 400,
      "messages[0].content", "only text");
  // wrong types
  bad(Endpoint::kCompletions, with(base_c, "max_tokens", "5"), 400, "max_tokens", "must be an integer");
  bad(Endpoint::kCompletions, with(base_c, "max_tokens", 2.5), 400, "max_tokens", "must be an integer");
  bad(Endpoint::kCompletions, with(base_c, "temperature", "hot"), 400, "temperature", "must be a number");
  bad(Endpoint::kCompletions, with(base_c, "stream", "yes"), 400, "stream", "must be a boolean");
  bad(Endpoint::kCompletions, with(base_c, "stop", 3), 400, "stop", "string or an array");
  bad(Endpoint::kCompletions, with(base_c, "stop", {"a", "b", "c", "d", "e"}), 400, "stop", "at most 4");
  // ranges
  bad(Endpoint::kCompletions, with(base_c, "max_tokens", -1), 400, "max_tokens", "at least 1");
  bad(Endpoint::kCompletions, with(base_c, "max_tokens", 0), 400, "max_tokens", "at least 1");
  bad(Endpoint::kCompletions, with(base_c, "max_tokens", 1000000000), 400, "max_tokens", "at most");
  bad(Endpoint::kCompletions, with(base_c, "max_tokens", json(18446744073709551615ULL)), 400, "max_tokens",
      "too large");
  bad(Endpoint::kCompletions, with(base_c, "max_tokens", 1e20), 400, "max_tokens", "too large");
  bad(Endpoint::kCompletions, with(base_c, "seed", -1e300), 400, "seed", "too large");
  bad(Endpoint::kChat, with(base_m, "max_completion_tokens", 100), 400, "max_completion_tokens", "at most");
  bad(Endpoint::kCompletions, with(base_c, "temperature", -0.1), 400, "temperature", "between 0 and 2");
  bad(Endpoint::kCompletions, with(base_c, "temperature", 2.5), 400, "temperature", "between 0 and 2");
  bad(Endpoint::kCompletions, with(base_c, "top_p", 0), 400, "top_p", "greater than 0");
  bad(Endpoint::kCompletions, with(base_c, "top_p", 1.5), 400, "top_p", "at most 1");
  bad(Endpoint::kCompletions, with(base_c, "top_k", -2), 400, "top_k", "must not be negative");
  bad(Endpoint::kCompletions, with(base_c, "n", 2), 400, "n", "'n' must be 1");
  bad(Endpoint::kCompletions, with(base_c, "prompt", {json(18446744073709551615ULL)}), 400, "prompt",
      "'prompt[0]' = 18446744073709551615 is not a token id");
  bad(Endpoint::kCompletions, with(base_c, "prompt", {5, -1}), 400, "prompt", "'prompt[1]' = -1 is not a token id");
  bad(Endpoint::kCompletions, with(base_c, "prompt", {{5, 6}, {7}}), 400, "prompt", "batched prompts");
  bad(Endpoint::kCompletions, with(base_c, "prompt", {{5, 100000}}), 400, "prompt", "'prompt[0][1]' = 100000");
  bad(Endpoint::kCompletions, with(base_c, "logprobs", 3), 400, "logprobs", "not supported");
  bad(Endpoint::kCompletions, with(base_c, "logprobs", 1), 400, "logprobs", "not supported");
  bad(Endpoint::kCompletions, with(base_c, "logprobs", 0), 400, "logprobs", "not supported");
  bad(Endpoint::kChat, with(base_m, "logprobs", true), 400, "logprobs", "not supported");
  bad(Endpoint::kCompletions, with(base_c, "best_of", -5), 400, "best_of", "not supported");
  bad(Endpoint::kCompletions, with(base_c, "best_of", 2), 400, "best_of", "not supported");
  bad(Endpoint::kCompletions, with(base_c, "echo", 1), 400, "echo", "not supported");
  bad(Endpoint::kCompletions, with(base_c, "echo", true), 400, "echo", "not supported");
  bad(Endpoint::kChat, with(base_m, "tool_choice", "auto"), 400, "tool_choice", "needs 'tools'");
  bad(Endpoint::kChat, with(base_m, "response_format", {{"type", "json_object"}}), 400, "response_format",
      "not supported");
  bad(Endpoint::kChat, with(base_m, "messages", {{{"role", "user"}, {"content", {{{"type", 5}, {"text", "hi"}}}}}}),
      400, "messages[0].content", "only text");
  bad(Endpoint::kChat,
      with(base_m, "messages", {{{"role", "user"}, {"content", {{{"type", nullptr}, {"text", "hi"}}}}}}), 400,
      "messages[0].content", "only text");
  bad(Endpoint::kCompletions, with(base_c, "stream_options", {{"include_usage", true}}), 400, "stream_options",
      "only allowed");
  // prompt longer than the context
  bad(Endpoint::kCompletions, with(base_c, "prompt", std::string(70, 'a')), 400, "prompt",
      "maximum context length is 64");
  auto r = parse(Endpoint::kCompletions, with(base_c, "prompt", std::string(70, 'a')));
  EXPECT_EQ(std::get<ApiError>(r).code, "context_length_exceeded");
}

TEST_F(OpenAiApiTest, UnsupportedFeaturesLeftOffAreAccepted) {
  // What SDKs send for features left off (defaults, or explicit "none").
  ok(Endpoint::kCompletions, {{"model", "tiny"},
                              {"prompt", "hi"},
                              {"best_of", 1},
                              {"echo", false},
                              {"logprobs", nullptr},
                              {"suffix", ""},
                              {"logit_bias", json::object()}});
  ok(Endpoint::kChat, {{"model", "tiny"},
                       {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                       {"logprobs", false},
                       {"top_logprobs", 0},
                       {"tools", json::array()},
                       {"tool_choice", "none"},
                       {"response_format", {{"type", "text"}}}});
}

TEST_F(OpenAiApiTest, FinishErrorsMapToStatuses) {
  engine::RequestUpdate u;
  u.finished = true;
  u.finish_reason = engine::FinishReason::kRejected;
  u.reject_reason = engine::RejectReason::kQueueFull;
  ApiError e = errorForFinish(u);
  EXPECT_EQ(e.status, 429);
  ASSERT_EQ(e.headers.size(), 1u);
  EXPECT_EQ(e.headers[0].first, "Retry-After");
  u.reject_reason = engine::RejectReason::kDraining;
  EXPECT_EQ(errorForFinish(u).status, 503);
  u.reject_reason = engine::RejectReason::kCapacity;
  EXPECT_EQ(errorForFinish(u).status, 400);
  u.finish_reason = engine::FinishReason::kTimeout;
  EXPECT_EQ(errorForFinish(u).status, 504);
  u.finish_reason = engine::FinishReason::kError;
  EXPECT_EQ(errorForFinish(u).status, 500);
  EXPECT_EQ(openAiFinishReason(engine::FinishReason::kEos), "stop");
  EXPECT_EQ(openAiFinishReason(engine::FinishReason::kStop), "stop");
  EXPECT_EQ(openAiFinishReason(engine::FinishReason::kLength), "length");
}

TEST_F(OpenAiApiTest, ResponseShapes) {
  json c = completionBody(Endpoint::kChat, "chatcmpl-1", 5, "tiny", "hey", "stop", {3, 2});
  EXPECT_EQ(c["object"], "chat.completion");
  EXPECT_EQ(c["choices"][0]["message"]["content"], "hey");
  EXPECT_EQ(c["usage"]["total_tokens"], 5);
  json k = chunkBody(Endpoint::kChat, "chatcmpl-1", 5, "tiny", "", "", true, true);
  EXPECT_EQ(k["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(k["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(k.contains("usage") && k["usage"].is_null());
  json t = chunkBody(Endpoint::kCompletions, "cmpl-1", 5, "tiny", "x", "length", false, false);
  EXPECT_EQ(t["choices"][0]["text"], "x");
  EXPECT_EQ(t["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(t.contains("usage"));
  json u = usageChunkBody(Endpoint::kCompletions, "cmpl-1", 5, "tiny", {3, 4});
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["completion_tokens"], 4);
}

// Llama-2 checkpoints (a SentencePiece tokenizer) get Llama-2's chat format:
// <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>[INST] {user} [/INST]
class Llama2ChatTemplateTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new engine::testing::ScratchDir();
    std::string text;
    for (int i = 0; i < 400; ++i) text += "be brief. hi there, tell me more about the cache and the engine.\n";
    engine::testing::writeText(dir_->file("corpus.txt"), text);
    error_ = new std::string(engine::testing::trainSentencePiece(
        "--input=" + dir_->file("corpus.txt") + " --model_prefix=" + dir_->file("tokenizer") +
        " --vocab_size=400 --hard_vocab_limit=false --model_type=bpe --byte_fallback=true --character_coverage=1.0 "
        "--unk_id=0 --bos_id=1"
        " --eos_id=2 --pad_id=-1 --num_threads=1 --minloglevel=2"));
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete error_;
  }
  void SetUp() override {
    ASSERT_EQ(*error_, "");
    auto t = engine::SentencePieceTokenizer::open(dir_->file("tokenizer.model"));
    ASSERT_TRUE(t.ok()) << t.status();
    tok_ = std::move(t).value();
  }
  std::vector<TokenId> render(const json& messages) {
    // The format is the tokenizer's declaration, as the agent picks it at load.
    ApiLimits limits{
        .model_name = "llama", .max_model_len = 4096, .default_max_tokens = 8, .chat_format = tok_->chatFormat()};
    auto r = parseRequest(Endpoint::kChat, {{"model", "llama"}, {"messages", messages}}, *tok_, limits, {});
    if (auto* e = std::get_if<ApiError>(&r)) {
      ADD_FAILURE() << e->message;
      return {};
    }
    return std::get<ParsedRequest>(r).spec.prompt;
  }
  // <s> (when `bos`) + the encoding of `text`.
  std::vector<TokenId> piece(const std::string& text, bool bos = true) {
    std::vector<TokenId> out;
    if (bos) out.push_back(tok_->bosId());
    auto t = tok_->encode(text);
    out.insert(out.end(), t.begin(), t.end());
    return out;
  }
  static std::vector<TokenId> cat(std::initializer_list<std::vector<TokenId>> parts) {
    std::vector<TokenId> out;
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
  }

  static engine::testing::ScratchDir* dir_;
  static std::string* error_;
  std::unique_ptr<engine::SentencePieceTokenizer> tok_;
};
engine::testing::ScratchDir* Llama2ChatTemplateTest::dir_ = nullptr;
std::string* Llama2ChatTemplateTest::error_ = nullptr;

TEST_F(Llama2ChatTemplateTest, TurnsFollowLlama2Format) {
  const json messages = {{{"role", "system"}, {"content", "be brief"}},
                         {{"role", "user"}, {"content", "hi"}},
                         {{"role", "assistant"}, {"content", "hi there"}},
                         {{"role", "user"}, {"content", "tell me more"}}};
  const std::vector<TokenId> want = cat({piece("[INST] <<SYS>>\nbe brief\n<</SYS>>\n\nhi [/INST]"),
                                         piece(" hi there ", false),
                                         {tok_->eosId()},
                                         piece("[INST] tell me more [/INST]")});
  EXPECT_EQ(render(messages), want);
}

TEST_F(Llama2ChatTemplateTest, SystemPromptAloneStillOpensAnInstructionBlock) {
  const std::vector<TokenId> got = render({{{"role", "system"}, {"content", "be brief"}}});
  EXPECT_EQ(got, piece("[INST] <<SYS>>\nbe brief\n<</SYS>>\n\n [/INST]"));
}

// A Llama 2 model directory with its own chat template: the template writes
// <s> and </s> into the text, which the tokenizer turns into the control ids
// (as HF's apply_chat_template does); no second <s> is added. The template
// writes what the built-in Llama 2 format does, so the prompts are equal.
TEST_F(Llama2ChatTemplateTest, AModelsTemplateWritesBosAndEosOnce) {
  const json config = {{"bos_token", "<s>"},
                       {"eos_token", "</s>"},
                       {"chat_template",
                        "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}"
                        "{% if not loop.first %}{{ bos_token }}{% endif %}[INST] {{ m['content'] }} [/INST]"
                        "{% else %}{{ ' ' + m['content'] + ' ' + eos_token }}{% endif %}{% endfor %}"}};
  auto parsed = parseChatTemplate(config, "tokenizer_config.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_TRUE(parsed->has_value());
  ApiLimits limits{.model_name = "llama",
                   .max_model_len = 4096,
                   .default_max_tokens = 8,
                   .chat_format = tok_->chatFormat(),
                   .chat_template = std::make_shared<const ChatTemplate>(std::move(**parsed))};
  auto render_with_template = [&](const json& messages) -> std::vector<TokenId> {
    auto r = parseRequest(Endpoint::kChat, {{"model", "llama"}, {"messages", messages}}, *tok_, limits, {});
    if (auto* e = std::get_if<ApiError>(&r)) {
      ADD_FAILURE() << e->message;
      return {};
    }
    return std::get<ParsedRequest>(r).spec.prompt;
  };

  const json one = {{{"role", "user"}, {"content", "hi"}}};
  const std::vector<TokenId> got = render_with_template(one);
  EXPECT_EQ(got, piece("[INST] hi [/INST]"));
  ASSERT_GE(got.size(), 2u);
  EXPECT_EQ(got[0], tok_->bosId());
  EXPECT_NE(got[1], tok_->bosId()) << "<s> doubled";
  EXPECT_EQ(tok_->decode(got), "[INST] hi [/INST]") << "no piece spells <s>";

  const json turns = {{{"role", "user"}, {"content", "hi"}},
                      {{"role", "assistant"}, {"content", "hi there"}},
                      {{"role", "user"}, {"content", "tell me more"}}};
  EXPECT_EQ(render_with_template(turns), render(turns));
  EXPECT_EQ(render_with_template(turns), cat({piece("[INST] hi [/INST]"),
                                              piece(" hi there ", false),
                                              {tok_->eosId()},
                                              piece("[INST] tell me more [/INST]")}));
}

// The format comes from ApiLimits (the tokenizer's declaration, read at
// load), not from the tokenizer's type: each tokenizer declares its family,
// and either format renders with any tokenizer.
TEST_F(Llama2ChatTemplateTest, FormatIsDeclaredNotGuessedFromTheType) {
  EXPECT_EQ(tok_->chatFormat(), engine::ChatFormat::kLlama2);
  EXPECT_EQ(engine::ByteTokenizer().chatFormat(), engine::ChatFormat::kTandem);
  const std::vector<ChatMessage> messages = {{"user", "hi"}};
  EXPECT_EQ(renderChat(engine::ChatFormat::kTandem, messages, *tok_), piece("<|user|>\nhi\n<|assistant|>\n"));
  engine::ByteTokenizer byte;
  std::vector<TokenId> want{engine::ByteTokenizer::kBosId};
  for (TokenId t : byte.encode("[INST] hi [/INST]")) want.push_back(t);
  EXPECT_EQ(renderChat(engine::ChatFormat::kLlama2, messages, byte), want);
}

}  // namespace
}  // namespace tandem::agent
