#pragma once
// Byte-level BPE from a Hugging Face `tokenizer.json` (Llama 3.x, Qwen2.5/3).
//
// What a file may use; anything else is refused by name, with the file and
// the JSON path (`tokenizer.json: model.type: "WordPiece" is not supported
// (supported: BPE)`):
//
//   normalizer     null | NFC | NFD | NFKC | NFKD | Sequence of those (ICU)
//   pre_tokenizer  Split (a Regex or String pattern, behavior Isolated, not
//                  inverted) ... then ByteLevel (add_prefix_space false;
//                  use_regex true adds the GPT-2 split), alone or in a Sequence
//   model          BPE: vocab, merges ("a b" or ["a", "b"]), byte_fallback,
//                  ignore_merges, unk_token; no dropout, no subword prefix/suffix
//   added_tokens   matched in the raw text before anything else (the
//                  normalized ones after normalization), leftmost-longest,
//                  honouring lstrip, rstrip and single_word
//   decoder        ByteLevel
//   post_processor ignored: encode() never adds special tokens (the caller
//                  prepends bosId()); ByteLevel, TemplateProcessing,
//                  RobertaProcessing, BertProcessing and Sequence are accepted
//
// The model directory's tokenizer_config.json, when there is one, names
// bos_token and eos_token (a string or {"content": ...}).
//
// Decoding follows Hugging Face's decode(..., skip_special_tokens=True):
// added tokens marked "special" (<|eot_id|>, <|im_start|>) decode to "";
// other added tokens (Qwen's <think>, <tool_call>) decode to their text.
// Bytes that do not form UTF-8 become U+FFFD, one per maximal invalid
// subsequence (Rust's String::from_utf8_lossy), so IncrementalDecoder holds a
// character split across tokens back until its last byte arrives.
//
// Thread-safe: encode() and decode() may run concurrently (the word cache is
// behind a mutex).

#include <array>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/tokenizer.h"
#include "src/common/ids.h"
#include "src/common/status.h"

namespace tandem::engine {

// GPT-2's byte <-> unicode mapping that ByteLevel uses: every byte becomes
// one printable character (bytes 0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF stand for
// themselves; the other 68 become U+0100.. in byte order, so ' ' is 'Ġ').
namespace bytelevel {
// UTF-8 of the character that stands for each byte.
const std::array<std::string, 256>& byteToChar();
// Every byte of `bytes` as its character.
std::string encode(std::string_view bytes);
// The inverse; false (and `out` unspecified) when `text` holds a character
// that stands for no byte.
bool decode(std::string_view text, std::string* out);
}  // namespace bytelevel

class BpeTokenizer final : public Tokenizer {
 public:
  // `tokenizer_json`: the tokenizer.json to read. `tokenizer_config`: the
  // tokenizer_config.json beside it, or "" for none (then bosId() and eosId()
  // are -1). Errors name the file and the JSON path of what is wrong;
  // FailedPrecondition (and no other error) says the file is a
  // SentencePiece-style one (Llama 2, Mistral: a Prepend, Metaspace or
  // ByteFallback step and no ByteLevel one), which loadTokenizer reads from
  // tokenizer.model instead.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<BpeTokenizer>> open(const std::string& tokenizer_json,
                                                                          const std::string& tokenizer_config = "");
  ~BpeTokenizer() override;

  std::vector<TokenId> encode(std::string_view text) const override;
  std::string decode(std::span<const TokenId> tokens) const override;
  // One past the largest id of the vocabulary and the added tokens.
  int vocabSize() const override;
  TokenId bosId() const override;
  TokenId eosId() const override;
  // The format used only when tokenizer_config.json has no "chat_template":
  // the agent renders a model's own template when it has one
  // (agent/chat_template.h), as every Llama 3 / Qwen release does.
  ChatFormat chatFormat() const override { return ChatFormat::kTandem; }

  // The id of a vocabulary entry or added token, as written in the file
  // ("Ġthe", "<|eot_id|>"); -1 when there is none.
  TokenId tokenId(std::string_view token) const;
  // True for added tokens marked "special" (they decode to "").
  bool isSpecial(TokenId id) const;

  struct Impl;  // defined in bpe_tokenizer.cc only

 private:
  explicit BpeTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::engine
