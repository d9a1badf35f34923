// ByteTokenizer (tokenizer.h), the built-in tiny model's tokenizer. Apart
// from tokenizer.cc so that a program can have it without SentencePiece and
// model loading: the request-parser fuzzer (tests/agent/openai_request_fuzz.cc)
// compiles this file on its own.

#include "engine/model/tokenizer.h"

#include <nlohmann/json.hpp>

namespace tandem::engine {
namespace {

constexpr TokenId kNewlineId = 3;
constexpr TokenId kTabId = 4;
constexpr TokenId kFirstPrintableId = 5;  // byte 0x20
constexpr unsigned char kFirstPrintable = 0x20;
constexpr unsigned char kLastPrintable = 0x7e;

}  // namespace

std::vector<TokenId> ByteTokenizer::encode(std::string_view text) const {
  std::vector<TokenId> ids;
  ids.reserve(text.size());
  for (char ch : text) {
    const auto b = static_cast<unsigned char>(ch);
    if (b == '\n')
      ids.push_back(kNewlineId);
    else if (b == '\t')
      ids.push_back(kTabId);
    else if (b >= kFirstPrintable && b <= kLastPrintable)
      ids.push_back(kFirstPrintableId + (b - kFirstPrintable));
    else
      ids.push_back(kUnkId);
  }
  return ids;
}

std::string ByteTokenizer::decode(std::span<const TokenId> tokens) const {
  std::string text;
  text.reserve(tokens.size());
  for (TokenId id : tokens) {
    if (id == kBosId || id == kEosId) continue;
    if (id == kNewlineId)
      text.push_back('\n');
    else if (id == kTabId)
      text.push_back('\t');
    else if (id >= kFirstPrintableId && id < kVocabSize)
      text.push_back(static_cast<char>(kFirstPrintable + (id - kFirstPrintableId)));
    else
      text.push_back('?');  // <unk> and ids outside the vocabulary
  }
  return text;
}

std::string byteTokenizerConfigJson() {
  nlohmann::ordered_json j;
  j["tokenizer_class"] = kByteTokenizerClass;
  j["unk_token"] = "<unk>";
  j["bos_token"] = "<s>";
  j["eos_token"] = "</s>";
  j["add_bos_token"] = true;
  j["add_eos_token"] = false;
  return j.dump(2) + "\n";
}

}  // namespace tandem::engine
