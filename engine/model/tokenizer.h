#pragma once
// Text <-> token ids.
//
//   TANDEM_ASSIGN_OR_RETURN(auto tokenizer, loadTokenizer(model_dir, config));
//   std::vector<TokenId> prompt = tokenizer->encode("Hello");   // no <s> added
//   IncrementalDecoder stream(*tokenizer, last_prompt_tokens);
//   for (TokenId t : generated) send(stream.push(t));           // complete UTF-8 only
//   send(stream.finish());
//
// Three implementations: ByteTokenizer (the built-in tiny model; byte_tokenizer.cc),
// SentencePieceTokenizer (Llama-2-family tokenizer.model) and BpeTokenizer
// (Hugging Face tokenizer.json, byte-level BPE: Llama 3, Qwen; bpe_tokenizer.h). Chat templates
// live elsewhere. All const methods are thread-safe.

#include <array>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/model_config.h"
#include "src/common/ids.h"
#include "src/common/status.h"

namespace tandem::engine {

namespace spm {
class Processor;
}

// The chat format of a tokenizer's model family. The agent renders chat
// requests in it (agent/chat_template.h); the tokenizer declares it, so the
// choice is made once where the tokenizer is picked, not guessed from its type.
enum class ChatFormat {
  kTandem,  // the built-in tiny model: <|role|> headers
  kLlama2,  // Llama-2 chat: [INST] ... [/INST]
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Text to ids. Never adds <s> or </s>: the caller prepends bosId() when
  // the model expects it. SentencePieceTokenizer and BpeTokenizer turn
  // special-token strings in the text ("<s>", "<|eot_id|>") into their ids,
  // as Hugging Face's tokenizers do by default, so a chat template's
  // rendered text tokenizes as in HF; ByteTokenizer spells them out.
  virtual std::vector<TokenId> encode(std::string_view text) const = 0;
  // Ids to text. Control tokens (<s>, </s>) decode to "". Ids outside the
  // tokenizer's vocabulary (models pad their embedding past it) decode to "".
  virtual std::string decode(std::span<const TokenId> tokens) const = 0;
  virtual int vocabSize() const = 0;
  // -1 when the tokenizer has no such token.
  virtual TokenId bosId() const = 0;
  virtual TokenId eosId() const = 0;
  virtual ChatFormat chatFormat() const = 0;
};

// The built-in tiny model's tokenizer. Exact, fixed mapping (vocab 100):
//
//   0 <unk>   1 <s> (bos)   2 </s> (eos)   3 '\n'   4 '\t'   5..99 bytes 0x20..0x7E
//
// Encoding: every other byte (non-ASCII, other control characters) becomes
// one <unk> per byte, so "é" (2 bytes of UTF-8) is two <unk>.
// Decoding: <s> and </s> give "", <unk> and out-of-range ids give "?".
// Every id decodes to ASCII, so decoded output is always valid UTF-8, one
// token at a time included.
class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr TokenId kUnkId = 0;
  static constexpr TokenId kBosId = 1;
  static constexpr TokenId kEosId = 2;
  static constexpr int kVocabSize = 100;

  std::vector<TokenId> encode(std::string_view text) const override;
  std::string decode(std::span<const TokenId> tokens) const override;
  int vocabSize() const override { return kVocabSize; }
  TokenId bosId() const override { return kBosId; }
  TokenId eosId() const override { return kEosId; }
  ChatFormat chatFormat() const override { return ChatFormat::kTandem; }
};

// tokenizer_config.json "tokenizer_class" that selects ByteTokenizer.
inline constexpr std::string_view kByteTokenizerClass = "TandemByteTokenizer";
// The tokenizer_config.json that writeModelDir puts next to a byte-tokenizer model.
std::string byteTokenizerConfigJson();

// A SentencePiece model file (tokenizer.model of the Llama-2 family: BPE
// with byte fallback), through libsentencepiece. Text the model has no piece
// for is encoded as byte pieces (<0xE4>...) and decodes back exactly.
//
// Control tokens in the text are recognised, as Hugging Face's Llama
// tokenizer does (chat templates write <s> and </s> into the prompt text):
// the model's control pieces (<s>, </s>; Mistral v0.3's [INST]...) and its
// <unk> piece are cut out of the text first, leftmost and longest at a
// position, and become their ids; each run of text between them is encoded
// by SentencePiece on its own, dummy prefix ("▁") included, as HF's
// legacy Llama 2 tokenizer does:
//   "<s>[INST] hi [/INST]" -> <s>, then SentencePiece on "[INST] hi [/INST]"
//                          -> [1, ▁[, INST, ], ▁hi, ▁[, /, INST, ]] (Llama 2)
// Text without control-token strings encodes exactly as libsentencepiece does.
class SentencePieceTokenizer final : public Tokenizer {
 public:
  // Errors when the file is missing or not a SentencePiece model, or when
  // the model has no </s> (the engine needs one to stop).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> open(const std::string& path);
  ~SentencePieceTokenizer() override;

  std::vector<TokenId> encode(std::string_view text) const override;
  std::string decode(std::span<const TokenId> tokens) const override;
  int vocabSize() const override;
  TokenId bosId() const override;
  TokenId eosId() const override;
  ChatFormat chatFormat() const override { return ChatFormat::kLlama2; }

 private:
  struct ControlToken {
    std::string piece;  // "<s>"
    TokenId id;
  };

  explicit SentencePieceTokenizer(std::unique_ptr<spm::Processor> processor);
  // The control token that starts at text[at], the longest if several; null if none.
  const ControlToken* controlTokenAt(std::string_view text, size_t at) const;

  std::unique_ptr<spm::Processor> processor_;
  // The control pieces and <unk>, indexed by their first byte, longest first
  // within each list. Set in the constructor, then read-only.
  std::array<std::vector<ControlToken>, 256> control_by_first_byte_;
};

// Turns a stream of tokens into a stream of text that never splits a UTF-8
// character. A SentencePiece byte-fallback character arrives as 2-4 tokens,
// and a piece like "▁world" decodes differently alone than after other
// text; so each push() decodes a short window of recent tokens and returns
// only the new text, holding it back while it ends in an incomplete UTF-8
// sequence or U+FFFD (what sentencepiece gives for partial byte pieces).
// The concatenation of every push() and finish() equals decode(all tokens)
// (after `context`). Not thread-safe: one decoder per stream. Holds a
// reference to `tokenizer`, which must outlive it.
class IncrementalDecoder {
 public:
  // `context`: the last few tokens before the stream (e.g. up to 6 prompt
  // tokens), so the first generated token gets the leading space it has in
  // context. Their text is not emitted. Call only with complete context
  // (it must not end inside a byte-fallback character).
  explicit IncrementalDecoder(const Tokenizer& tokenizer, std::span<const TokenId> context = {});

  // The text that `token` completes; often "" while a character is pending.
  std::string push(TokenId token);
  // End of stream: whatever was held back, with an incomplete trailing
  // UTF-8 sequence replaced by U+FFFD. The decoder can then be reused.
  std::string finish();

 private:
  const Tokenizer& tokenizer_;
  // Tokens since the start of the last emitted text; window_[0, read_) is
  // text already emitted (or context), window_[read_, end) is pending.
  std::vector<TokenId> window_;
  size_t read_ = 0;
};

// Picks the tokenizer for a model directory, the first that exists:
//   tokenizer.json (+ tokenizer_config.json)              -> BpeTokenizer (bpe_tokenizer.h),
//     unless it is SentencePiece-style (Llama 2, Mistral) and tokenizer.model
//     is there: then tokenizer.model; without it, an error naming the file
//   tokenizer.model                                       -> SentencePieceTokenizer
//   tokenizer_config.json with "tokenizer_class": "TandemByteTokenizer" -> ByteTokenizer
// otherwise an error saying what was looked for and what was found. Also
// checks the tokenizer against `config`: its vocabulary must fit in
// vocab_size, a BpeTokenizer needs tokenizer_config.json's eos_token, and
// the byte tokenizer's <s>/</s> must match bos/eos_token_id.
[[nodiscard]] absl::StatusOr<std::unique_ptr<Tokenizer>> loadTokenizer(const std::string& model_dir,
                                                                       const ModelConfig& config);

}  // namespace tandem::engine
