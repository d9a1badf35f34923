#include "engine/model/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <iterator>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "engine/model/weights.h"
#include "src/common/strings.h"
#include "tests/engine/model/scratch_dir.h"
#include "tests/engine/model/sentencepiece_train_util.h"

namespace tandem::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::ScratchDir;

// Feeds `tokens` through an IncrementalDecoder one at a time; every chunk
// must be valid UTF-8 on its own. Returns the chunks, finish() last.
std::vector<std::string> stream(const Tokenizer& tokenizer, const std::vector<TokenId>& tokens,
                                std::span<const TokenId> context = {}) {
  IncrementalDecoder decoder(tokenizer, context);
  std::vector<std::string> chunks;
  for (TokenId t : tokens) chunks.push_back(decoder.push(t));
  chunks.push_back(decoder.finish());
  for (const std::string& chunk : chunks) EXPECT_TRUE(isValidUtf8(chunk)) << "chunk splits a character: " << chunk;
  return chunks;
}

std::string concat(const std::vector<std::string>& chunks) {
  std::string out;
  for (const std::string& c : chunks) out += c;
  return out;
}

// ---- ByteTokenizer ----

TEST(ByteTokenizerTest, ExactMapping) {
  ByteTokenizer tok;
  EXPECT_EQ(tok.vocabSize(), 100);
  EXPECT_EQ(tok.vocabSize(), tinyModelConfig().vocab_size);
  EXPECT_EQ(tok.bosId(), 1);
  EXPECT_EQ(tok.eosId(), 2);
  EXPECT_THAT(tok.encode("\n\t A~"), ElementsAre(3, 4, 5, 5 + 0x41 - 0x20, 99));
  const TokenId specials[] = {1, 2, 0};
  EXPECT_EQ(tok.decode(specials), "?");
}

TEST(ByteTokenizerTest, PrintableTextRoundTrips) {
  ByteTokenizer tok;
  std::string all = "\n\t";
  for (int c = 0x20; c <= 0x7e; ++c) all.push_back(static_cast<char>(c));
  std::vector<TokenId> ids = tok.encode(all);
  ASSERT_EQ(ids.size(), all.size());
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(ids[i], static_cast<TokenId>(i + 3));  // ids 3..99 in order
  EXPECT_EQ(tok.decode(ids), all);
  const std::string text = "def f(x):\n\treturn x * 2  # {ok} ~";
  EXPECT_EQ(tok.decode(tok.encode(text)), text);
}

TEST(ByteTokenizerTest, OtherBytesBecomeUnkAndDecodeAsQuestionMarks) {
  ByteTokenizer tok;
  // "é" is two bytes of UTF-8; \x01 and \r are control characters; \xff is not UTF-8 at all.
  EXPECT_THAT(tok.encode("a\xc3\xa9\x01\r\xff"), ElementsAre(5 + 0x41, 0, 0, 0, 0, 0));
  EXPECT_EQ(tok.decode(tok.encode("caf\xc3\xa9")), "caf??");
}

TEST(ByteTokenizerTest, EveryIdDecodesToValidUtf8) {
  ByteTokenizer tok;
  for (TokenId id = -5; id < 300; ++id) {
    const TokenId one[] = {id};
    std::string text = tok.decode(one);
    EXPECT_TRUE(isValidUtf8(text)) << id;
    if (id == 1 || id == 2)
      EXPECT_EQ(text, "") << id;
    else if (id == 0 || id < 0 || id >= 100)
      EXPECT_EQ(text, "?") << id;
    else
      EXPECT_EQ(text.size(), 1u) << id;
  }
  std::vector<TokenId> ids = {1, 45, 72, 0, 3, 2};
  EXPECT_EQ(concat(stream(tok, ids)), tok.decode(ids));
}

// ---- SentencePieceTokenizer, with a model trained here ----

class SentencePieceTest : public ::testing::Test {
 protected:
  static constexpr int kVocabSize = 400;

  // Trains once for the suite: a Llama-2-style model (BPE, byte fallback,
  // <unk>=0 <s>=1 </s>=2, identity normalisation) on a generated corpus.
  static void SetUpTestSuite() {
    dir_ = new ScratchDir();
    const std::string corpus = dir_->file("corpus.txt");
    {
      const char* words[] = {"the",     "quick",  "brown",   "fox",    "jumps",      "over",  "lazy",
                             "dog",     "model",  "token",   "engine", "serving",    "batch", "cache",
                             "prefill", "decode", "hello",   "world",  "Kubernetes", "agent", "node",
                             "request", "stream", "latency", "memory", "block"};
      std::string text;
      uint64_t state = 12345;
      for (int line = 0; line < 2000; ++line) {
        for (int w = 0; w < 8; ++w) {
          state = state * 6364136223846793005ULL + 1442695040888963407ULL;
          text += words[(state >> 33) % std::size(words)];
          text += (w == 7 ? ".\n" : (state >> 20) % 7 == 0 ? ", " : " ");
        }
      }
      testing::writeText(corpus, text);
    }
    const std::string args = strCat(
        "--input=", corpus, " --model_prefix=", dir_->file("tokenizer"), " --vocab_size=", kVocabSize,
        " --model_type=bpe --byte_fallback=true --character_coverage=1.0 --unk_id=0 --bos_id=1 --eos_id=2"
        " --pad_id=-1 --normalization_rule_name=identity --remove_extra_whitespaces=false --add_dummy_prefix=true"
        " --split_digits=true --num_threads=1 --minloglevel=2");
    train_error_ = new std::string(testing::trainSentencePiece(args));
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete train_error_;
  }

  void SetUp() override {
    ASSERT_EQ(*train_error_, "") << "training a SentencePiece model failed";
    auto tok = SentencePieceTokenizer::open(modelPath());
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = std::move(tok).value();
  }

  static std::string modelPath() { return dir_->file("tokenizer.model"); }

  static ScratchDir* dir_;
  static std::string* train_error_;
  std::unique_ptr<SentencePieceTokenizer> tok_;
};

ScratchDir* SentencePieceTest::dir_ = nullptr;
std::string* SentencePieceTest::train_error_ = nullptr;

TEST_F(SentencePieceTest, SpecialIdsAndVocab) {
  EXPECT_EQ(tok_->vocabSize(), kVocabSize);
  EXPECT_EQ(tok_->bosId(), 1);
  EXPECT_EQ(tok_->eosId(), 2);
  const TokenId specials[] = {1, 2};
  EXPECT_EQ(tok_->decode(specials), "");
}

TEST_F(SentencePieceTest, RoundTrips) {
  for (std::string text : {"the quick brown fox jumps over the lazy dog.", "hello world, serving engine",
                           "Kubernetes  agent\tnode\nrequest 2024", "naïve café — 世界 🙂 Ωmega"}) {
    std::vector<TokenId> ids = tok_->encode(text);
    EXPECT_FALSE(ids.empty());
    for (TokenId id : ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, kVocabSize);
      EXPECT_NE(id, 0) << "byte fallback means no <unk> for: " << text;
    }
    EXPECT_EQ(tok_->decode(ids), text);
  }
  // Frequent words are single pieces, so text compresses below one token per byte.
  EXPECT_LT(tok_->encode("the quick brown fox").size(), 8u);
  // A character outside the corpus is one byte piece per UTF-8 byte.
  EXPECT_EQ(tok_->encode("世").size(), 1u + 3u);  // "▁" + 3 bytes
}

TEST_F(SentencePieceTest, IncrementalDecodeNeverSplitsCharacters) {
  const std::string text = "hello 世界🙂 fox é!";
  std::vector<TokenId> ids = tok_->encode(text);
  std::vector<std::string> chunks = stream(*tok_, ids);
  EXPECT_EQ(concat(chunks), text);
  // The first bytes of 世 (three byte pieces) are held back, then emitted together.
  int empty = 0;
  for (size_t i = 0; i + 1 < chunks.size(); ++i) empty += chunks[i].empty();
  EXPECT_GE(empty, 2 + 1 + 3) << "held back while characters were incomplete";
  EXPECT_NE(std::find(chunks.begin(), chunks.end(), "世"), chunks.end());

  // A decoder that ends mid-character gives U+FFFD rather than broken UTF-8.
  std::vector<TokenId> partial = tok_->encode("世");
  partial.pop_back();
  std::string tail = concat(stream(*tok_, partial));
  ASSERT_FALSE(tail.empty());
  for (size_t i = 0; i < tail.size(); i += 3) EXPECT_EQ(tail.substr(i, 3), "\xEF\xBF\xBD") << "U+FFFD only";
}

TEST_F(SentencePieceTest, IncrementalDecodeKeepsSpacesAfterContext) {
  std::vector<TokenId> ids = tok_->encode("hello world the fox");
  ASSERT_GE(ids.size(), 3u);
  std::span<const TokenId> context(ids.data(), 2);
  std::vector<TokenId> generated(ids.begin() + 2, ids.end());
  const std::string prompt_text = tok_->decode(context);
  const std::string expected = tok_->decode(ids).substr(prompt_text.size());
  EXPECT_EQ(concat(stream(*tok_, generated, context)), expected);
  EXPECT_TRUE(expected.starts_with(" ")) << "the continuation starts a new word: '" << expected << "'";
}

TEST_F(SentencePieceTest, OutOfVocabularyIdsDecodeToNothing) {
  std::vector<TokenId> ids = tok_->encode("fox");
  std::vector<TokenId> padded = ids;
  padded.push_back(kVocabSize + 50);
  padded.insert(padded.begin(), -1);
  EXPECT_EQ(tok_->decode(padded), "fox");
}

// The ids of `parts` in order: a TokenId as is, a string as SentencePiece
// encodes it on its own (dummy prefix included).
std::vector<TokenId> joined(const Tokenizer& tok, std::initializer_list<std::variant<TokenId, std::string>> parts) {
  std::vector<TokenId> out;
  for (const auto& part : parts) {
    if (const TokenId* id = std::get_if<TokenId>(&part)) {
      out.push_back(*id);
    } else {
      std::vector<TokenId> ids = tok.encode(std::get<std::string>(part));
      out.insert(out.end(), ids.begin(), ids.end());
    }
  }
  return out;
}

// A chat template writes <s> and </s> into the prompt text: they become the
// control ids, and each run between them is encoded on its own with its
// dummy prefix, as HF's Llama 2 tokenizer (legacy) does:
// "<s>[INST] hi [/INST]" -> [1, ▁[, INST, ], ▁hi, ▁[, /, INST, ]].
TEST_F(SentencePieceTest, ControlTokensInTextBecomeTheirIds) {
  const TokenId bos = 1, eos = 2, unk = 0;
  EXPECT_EQ(tok_->encode("<s>[INST] hi [/INST]"), joined(*tok_, {bos, "[INST] hi [/INST]"}));
  EXPECT_EQ(tok_->encode("the fox</s> the dog"), joined(*tok_, {"the fox", eos, " the dog"}));
  EXPECT_EQ(tok_->encode("[INST] hi [/INST] hello </s><s>[INST] more [/INST]"),
            joined(*tok_, {"[INST] hi [/INST] hello ", eos, bos, "[INST] more [/INST]"}));
  EXPECT_EQ(tok_->encode("<s>"), std::vector<TokenId>{bos});
  EXPECT_EQ(tok_->encode("<s><s></s>"), (std::vector<TokenId>{bos, bos, eos}));
  EXPECT_EQ(tok_->encode("a<unk>b"), joined(*tok_, {"a", unk, "b"}));

  // The run after a control token starts a word ("▁world"), unlike the same
  // text in the middle of a run.
  const std::vector<TokenId> world = tok_->encode("world");
  const std::vector<TokenId> after = tok_->encode("<s>world");
  EXPECT_EQ(std::vector<TokenId>(after.begin() + 1, after.end()), world);
  EXPECT_NE(tok_->encode("helloworld"), joined(*tok_, {"hello", "world"}));

  // No piece of the encoding spells a control token; decoding drops them.
  for (TokenId id : tok_->encode("<s>hello</s>")) {
    EXPECT_EQ(tok_->decode(std::vector<TokenId>{id}).find('<'), std::string::npos) << id;
  }
  EXPECT_EQ(tok_->decode(tok_->encode("<s>hello world</s>")), "hello world");

  // Near misses are text: SentencePiece encodes them as before (byte pieces
  // for '<', '/', '>'), and they round-trip.
  for (std::string text : {"<s", "s>", "< s>", "<S>", "</s", "<<SYS>>\nbe brief\n<</SYS>>"}) {
    std::vector<TokenId> ids = tok_->encode(text);
    EXPECT_EQ(std::count(ids.begin(), ids.end(), bos) + std::count(ids.begin(), ids.end(), eos), 0) << text;
    EXPECT_EQ(tok_->decode(ids), text);
  }
}

// A model with more control pieces (Mistral v0.3's tokenizer.model has
// [INST] and [/INST]): each is cut out of the text like <s>.
TEST_F(SentencePieceTest, EveryControlPieceOfTheModelIsRecognised) {
  ScratchDir model;
  const std::string error = testing::trainSentencePiece(
      strCat("--input=", dir_->file("corpus.txt"), " --model_prefix=", model.file("tokenizer"),
             " --vocab_size=400 --model_type=bpe --byte_fallback=true --character_coverage=1.0 --unk_id=0 --bos_id=1"
             " --eos_id=2 --pad_id=-1 --control_symbols=[INST],[/INST] --normalization_rule_name=identity"
             " --remove_extra_whitespaces=false --add_dummy_prefix=true --num_threads=1 --minloglevel=2"));
  ASSERT_EQ(error, "");
  auto tok = SentencePieceTokenizer::open(model.file("tokenizer.model"));
  ASSERT_TRUE(tok.ok()) << tok.status();
  // Control symbols follow <unk>, <s>, </s>.
  const TokenId inst = 3, end_inst = 4;
  EXPECT_EQ((*tok)->decode(std::vector<TokenId>{inst, end_inst}), "");
  EXPECT_EQ((*tok)->encode("<s>[INST] hello [/INST] world</s>"),
            joined(**tok, {TokenId{1}, inst, " hello ", end_inst, " world", TokenId{2}}));
}

TEST_F(SentencePieceTest, LoadTokenizerPrefersTokenizerModel) {
  ScratchDir model;
  std::filesystem::copy_file(modelPath(), model.file("tokenizer.model"));
  testing::writeText(model.file("tokenizer_config.json"), byteTokenizerConfigJson());
  ModelConfig config = tinyModelConfig();
  config.vocab_size = 512;  // embedding padded past the tokenizer: fine
  auto tok = loadTokenizer(model.path(), config);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_NE(dynamic_cast<SentencePieceTokenizer*>(tok->get()), nullptr);
  EXPECT_EQ((*tok)->vocabSize(), kVocabSize);

  config.vocab_size = 300;
  auto too_small = loadTokenizer(model.path(), config);
  ASSERT_FALSE(too_small.ok());
  EXPECT_THAT(std::string(too_small.status().message()),
              HasSubstr("tokenizer.model: tokenizer has 400 pieces but config.json vocab_size is 300"));
}

// The tokenizer.json that Hugging Face's Llama 2 and Mistral repos ship
// beside tokenizer.model (converted from it), in miniature: BPE with
// byte_fallback, a normalizer that writes "▁" for spaces, no pre-tokenizer,
// and a decoder that undoes it. Not byte-level BPE.
constexpr std::string_view kLlama2TokenizerJson = R"({
  "version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [
    {"id": 0, "content": "<unk>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 1, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 2, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
  "normalizer": {"type": "Sequence", "normalizers": [
    {"type": "Prepend", "prepend": "▁"},
    {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
  "pre_tokenizer": null,
  "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}}], "pair": [], "special_tokens": {}},
  "decoder": {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
  "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
            "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x00>": 3, "▁": 4, "f": 5, "o": 6, "x": 7, "▁f": 8},
            "merges": ["▁ f"]}
})";

TEST_F(SentencePieceTest, Llama2DirectoryReadsTokenizerModelBesideItsTokenizerJson) {
  ScratchDir model;
  std::filesystem::copy_file(modelPath(), model.file("tokenizer.model"));
  testing::writeText(model.file("tokenizer.json"), std::string(kLlama2TokenizerJson));
  testing::writeText(model.file("tokenizer_config.json"),
                     R"({"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>"})");
  ModelConfig config = tinyModelConfig();
  config.vocab_size = 512;
  auto tok = loadTokenizer(model.path(), config);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_NE(dynamic_cast<SentencePieceTokenizer*>(tok->get()), nullptr);
  EXPECT_EQ((*tok)->vocabSize(), kVocabSize);
  EXPECT_EQ((*tok)->encode("the quick fox"), tok_->encode("the quick fox"));

  // Without tokenizer.model the file is refused, naming it and the step.
  std::filesystem::remove(model.file("tokenizer.model"));
  auto alone = loadTokenizer(model.path(), config);
  ASSERT_FALSE(alone.ok());
  EXPECT_THAT(std::string(alone.status().message()),
              HasSubstr(model.file("tokenizer.json") +
                        ": normalizer.normalizers[0].type: \"Prepend\": a SentencePiece-style tokenizer.json"));
  EXPECT_THAT(std::string(alone.status().message()), HasSubstr("no tokenizer.model (SentencePiece)"));

  // Mistral's newer files: a Metaspace pre-tokenizer and decoder.
  std::filesystem::copy_file(modelPath(), model.file("tokenizer.model"));
  std::string metaspace(kLlama2TokenizerJson);
  const std::string normalizer_start = R"("normalizer": {)";
  const size_t from = metaspace.find(normalizer_start);
  const size_t to = metaspace.find(R"("pre_tokenizer": null,)");
  metaspace.replace(from, to - from, R"("normalizer": null, )");
  metaspace.replace(metaspace.find(R"("pre_tokenizer": null)"), std::string(R"("pre_tokenizer": null)").size(),
                    R"("pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false})");
  testing::writeText(model.file("tokenizer.json"), metaspace);
  tok = loadTokenizer(model.path(), config);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_NE(dynamic_cast<SentencePieceTokenizer*>(tok->get()), nullptr);

  // A byte-level tokenizer.json that is broken stays an error, tokenizer.model or not.
  std::string broken(kLlama2TokenizerJson);
  broken.replace(broken.find(R"("pre_tokenizer": null)"), std::string(R"("pre_tokenizer": null)").size(),
                 R"("pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true})");
  testing::writeText(model.file("tokenizer.json"), broken);
  auto refused = loadTokenizer(model.path(), config);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr(model.file("tokenizer.json") + ": normalizer.normalizers[0].type: \"Prepend\" is not supported"));
}

TEST(LoadTokenizerTest, ByteTokenizerFromTokenizerConfig) {
  ScratchDir model;
  testing::writeText(model.file("tokenizer_config.json"), byteTokenizerConfigJson());
  auto tok = loadTokenizer(model.path(), tinyModelConfig());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_NE(dynamic_cast<ByteTokenizer*>(tok->get()), nullptr);

  ModelConfig wrong_eos = tinyModelConfig();
  wrong_eos.eos_token_ids = {5};
  auto mismatch = loadTokenizer(model.path(), wrong_eos);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_THAT(std::string(mismatch.status().message()), HasSubstr("eos_token_id 5"));

  ModelConfig small = tinyModelConfig();
  small.vocab_size = 50;
  EXPECT_THAT(std::string(loadTokenizer(model.path(), small).status().message()),
              HasSubstr("TandemByteTokenizer needs vocab_size >= 100"));
}

TEST(LoadTokenizerTest, ErrorsSayWhatWasLookedFor) {
  ScratchDir model;
  auto none = loadTokenizer(model.path(), tinyModelConfig());
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(absl::IsNotFound(none.status()));
  EXPECT_THAT(std::string(none.status().message()),
              HasSubstr("no usable tokenizer: looked for tokenizer.json (byte-level BPE), tokenizer.model "
                        "(SentencePiece) and tokenizer_config.json with \"tokenizer_class\": \"TandemByteTokenizer\"; "
                        "neither file exists"));

  testing::writeText(model.file("tokenizer_config.json"), R"({"tokenizer_class": "LlamaTokenizerFast"})");
  std::string error(loadTokenizer(model.path(), tinyModelConfig()).status().message());
  EXPECT_THAT(error, HasSubstr("tokenizer_config.json has tokenizer_class \"LlamaTokenizerFast\""));

  testing::writeText(model.file("tokenizer_config.json"), "{not json");
  EXPECT_THAT(std::string(loadTokenizer(model.path(), tinyModelConfig()).status().message()),
              HasSubstr("tokenizer_config.json: invalid JSON"));

  testing::writeText(model.file("tokenizer.model"), "this is not a protobuf");
  error = std::string(loadTokenizer(model.path(), tinyModelConfig()).status().message());
  EXPECT_THAT(error, HasSubstr("tokenizer.model: not a SentencePiece model"));

  // tokenizer.json comes first, and its errors are its own.
  testing::writeText(model.file("tokenizer.json"), "{}");
  error = std::string(loadTokenizer(model.path(), tinyModelConfig()).status().message());
  EXPECT_THAT(error, HasSubstr("tokenizer.json: pre_tokenizer: missing"));
}

}  // namespace
}  // namespace tandem::engine
