#include "engine/model/tokenizer.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "engine/model/bpe_tokenizer.h"
#include "engine/model/files.h"
#include "engine/model/sentencepiece_shim.h"
#include "src/common/strings.h"

namespace tandem::engine {
namespace {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Number of bytes at the end of `s` that start a UTF-8 sequence the string
// does not finish (0 when it ends on a character boundary).
size_t incompleteUtf8Tail(std::string_view s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = 1;
    if ((c & 0xE0) == 0xC0)
      need = 2;
    else if ((c & 0xF0) == 0xE0)
      need = 3;
    else if ((c & 0xF8) == 0xF0)
      need = 4;
    return need > back ? back : 0;
  }
  return 0;
}

bool endsIncomplete(std::string_view s) {
  return incompleteUtf8Tail(s) > 0 || (s.size() >= kReplacementChar.size() && s.ends_with(kReplacementChar));
}

}  // namespace

// ---- SentencePieceTokenizer ----

SentencePieceTokenizer::SentencePieceTokenizer(std::unique_ptr<spm::Processor> processor)
    : processor_(std::move(processor)) {
  // Hugging Face's conversion of a SentencePiece model makes every control
  // piece, and <unk>, a special added token: those are what its tokenizer
  // cuts out of text. User-defined pieces libsentencepiece matches itself.
  const int size = processor_->pieceSize();
  for (int id = 0; id < size; ++id) {
    if (!processor_->isControl(id) && id != processor_->unkId()) continue;
    std::string piece = processor_->idToPiece(id);
    if (piece.empty()) continue;
    const auto first = static_cast<unsigned char>(piece[0]);
    control_by_first_byte_[first].push_back({std::move(piece), id});
  }
  for (auto& list : control_by_first_byte_) {
    std::stable_sort(list.begin(), list.end(),
                     [](const ControlToken& a, const ControlToken& b) { return a.piece.size() > b.piece.size(); });
  }
}
SentencePieceTokenizer::~SentencePieceTokenizer() = default;

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::open(const std::string& path) {
  if (!fileExists(path)) return absl::NotFoundError(strCat(path, ": no such file"));
  std::string error;
  auto processor = spm::Processor::load(path, &error);
  if (processor == nullptr) {
    return absl::InvalidArgumentError(strCat(path, ": not a SentencePiece model: ", error));
  }
  if (processor->eosId() < 0) {
    return absl::InvalidArgumentError(strCat(path, ": SentencePiece model has no </s> piece (eos_id is -1)"));
  }
  return std::unique_ptr<SentencePieceTokenizer>(new SentencePieceTokenizer(std::move(processor)));
}

const SentencePieceTokenizer::ControlToken* SentencePieceTokenizer::controlTokenAt(std::string_view text,
                                                                                   size_t at) const {
  for (const ControlToken& c : control_by_first_byte_[static_cast<unsigned char>(text[at])]) {
    if (text.substr(at).starts_with(c.piece)) return &c;
  }
  return nullptr;
}

std::vector<TokenId> SentencePieceTokenizer::encode(std::string_view text) const {
  std::vector<TokenId> out;
  // Each run between control tokens is encoded on its own, so it gets
  // SentencePiece's dummy prefix as in HF's (legacy) Llama tokenizer.
  auto appendRun = [&](std::string_view run) {
    if (run.empty()) return;
    std::vector<int> ids = processor_->encode(run);
    out.insert(out.end(), ids.begin(), ids.end());
  };
  size_t run_start = 0;
  for (size_t i = 0; i < text.size();) {
    const ControlToken* control = controlTokenAt(text, i);
    if (control == nullptr) {
      ++i;
      continue;
    }
    appendRun(text.substr(run_start, i - run_start));
    out.push_back(control->id);
    i += control->piece.size();
    run_start = i;
  }
  appendRun(text.substr(run_start));
  return out;
}

std::string SentencePieceTokenizer::decode(std::span<const TokenId> tokens) const {
  std::vector<int> ids;
  ids.reserve(tokens.size());
  const int size = processor_->pieceSize();
  for (TokenId id : tokens) {
    // sentencepiece rejects the whole call on one bad id; padding ids past
    // the tokenizer's vocabulary have no text.
    if (id >= 0 && id < size) ids.push_back(id);
  }
  return processor_->decode(ids);
}

int SentencePieceTokenizer::vocabSize() const { return processor_->pieceSize(); }
TokenId SentencePieceTokenizer::bosId() const { return processor_->bosId(); }
TokenId SentencePieceTokenizer::eosId() const { return processor_->eosId(); }

// ---- IncrementalDecoder ----

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, std::span<const TokenId> context)
    : tokenizer_(tokenizer), window_(context.begin(), context.end()), read_(context.size()) {}

std::string IncrementalDecoder::push(TokenId token) {
  window_.push_back(token);
  const std::string before = tokenizer_.decode(std::span<const TokenId>(window_.data(), read_));
  const std::string all = tokenizer_.decode(window_);
  if (all.size() <= before.size() || endsIncomplete(all)) return "";
  // The emitted tokens become the next window's context: short, and enough
  // to decode the next piece's leading space correctly.
  window_.erase(window_.begin(), window_.begin() + static_cast<std::ptrdiff_t>(read_));
  read_ = window_.size();
  return all.substr(before.size());
}

std::string IncrementalDecoder::finish() {
  const std::string before = tokenizer_.decode(std::span<const TokenId>(window_.data(), read_));
  std::string all = tokenizer_.decode(window_);
  window_.clear();
  read_ = 0;
  if (all.size() <= before.size()) return "";
  std::string rest = all.substr(before.size());
  if (size_t tail = incompleteUtf8Tail(rest); tail > 0) {
    rest.resize(rest.size() - tail);
    rest += kReplacementChar;
  }
  return rest;
}

// ---- loadTokenizer ----

absl::StatusOr<std::unique_ptr<Tokenizer>> loadTokenizer(const std::string& model_dir, const ModelConfig& config) {
  const std::string json_path = strCat(model_dir, "/tokenizer.json");
  const std::string sp_path = strCat(model_dir, "/tokenizer.model");
  const std::string config_path = strCat(model_dir, "/tokenizer_config.json");

  // Llama 2 and Mistral repos ship a SentencePiece-style tokenizer.json next
  // to tokenizer.model: that one is read from tokenizer.model. Any other
  // tokenizer.json, broken or not, is the model's tokenizer.
  if (fileExists(json_path)) {
    absl::StatusOr<std::unique_ptr<BpeTokenizer>> bpe =
        BpeTokenizer::open(json_path, fileExists(config_path) ? config_path : "");
    if (absl::IsFailedPrecondition(bpe.status())) {
      if (!fileExists(sp_path)) {
        return absl::InvalidArgumentError(
            strCat(bpe.status().message(), "; the directory has no tokenizer.model (SentencePiece) to read instead"));
      }
    } else {
      if (!bpe.ok()) return bpe.status();
      if ((*bpe)->vocabSize() > config.vocab_size) {
        return absl::InvalidArgumentError(strCat(json_path, ": tokenizer has ", (*bpe)->vocabSize(),
                                                 " ids but config.json vocab_size is ", config.vocab_size));
      }
      if ((*bpe)->eosId() < 0) {
        return absl::InvalidArgumentError(
            strCat(config_path, ": eos_token: missing (the engine needs an end-of-sequence token to stop)"));
      }
      return std::unique_ptr<Tokenizer>(std::move(*bpe));
    }
  }
  if (fileExists(sp_path)) {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<SentencePieceTokenizer> sp, SentencePieceTokenizer::open(sp_path));
    if (sp->vocabSize() > config.vocab_size) {
      return absl::InvalidArgumentError(strCat(sp_path, ": tokenizer has ", sp->vocabSize(),
                                               " pieces but config.json vocab_size is ", config.vocab_size));
    }
    return std::unique_ptr<Tokenizer>(std::move(sp));
  }

  std::string found = "neither file exists";
  if (fileExists(config_path)) {
    TANDEM_ASSIGN_OR_RETURN(std::string text, readFile(config_path));
    auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError(strCat(config_path, ": invalid JSON (expected an object)"));
    }
    auto cls = j.find("tokenizer_class");
    if (cls != j.end() && cls->is_string() && cls->get_ref<const std::string&>() == kByteTokenizerClass) {
      if (config.vocab_size < ByteTokenizer::kVocabSize) {
        return absl::InvalidArgumentError(strCat(config_path, ": ", kByteTokenizerClass, " needs vocab_size >= ",
                                                 ByteTokenizer::kVocabSize, ", config.json has ", config.vocab_size));
      }
      if (config.bos_token_id != ByteTokenizer::kBosId || config.eos_token_ids.front() != ByteTokenizer::kEosId) {
        return absl::InvalidArgumentError(strCat(config_path, ": ", kByteTokenizerClass,
                                                 " has <s> = 1 and </s> = 2, but config.json says bos_token_id ",
                                                 config.bos_token_id, ", eos_token_id ", config.eos_token_ids.front()));
      }
      return std::unique_ptr<Tokenizer>(std::make_unique<ByteTokenizer>());
    }
    found = strCat("tokenizer_config.json has tokenizer_class ", cls == j.end() ? std::string("(none)") : cls->dump());
  }
  return absl::NotFoundError(strCat(model_dir, ": no usable tokenizer: looked for tokenizer.json (byte-level BPE), ",
                                    "tokenizer.model (SentencePiece) and tokenizer_config.json with ",
                                    "\"tokenizer_class\": \"", kByteTokenizerClass, "\"; ", found));
}

}  // namespace tandem::engine
