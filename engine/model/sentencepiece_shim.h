#pragma once
// A thin, std-only wrapper around libsentencepiece, used by tokenizer.cc.
//
// Why it exists: <sentencepiece_processor.h> declares
// `namespace absl { using std::string_view; }`, which collides with Debian's
// Abseil, where absl::string_view is a class of its own. A translation unit
// cannot include both, so sentencepiece is included in exactly one .cc
// (sentencepiece_shim.cc) that includes no Abseil header, and everything
// else talks to it through this header. Do not include Abseil here.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::engine::spm {

class Processor {
 public:
  // Loads a serialized SentencePiece model (tokenizer.model). On failure
  // returns nullptr and sets *error to sentencepiece's message.
  static std::unique_ptr<Processor> load(const std::string& path, std::string* error);
  ~Processor();
  Processor(const Processor&) = delete;
  Processor& operator=(const Processor&) = delete;

  std::vector<int> encode(std::string_view text) const;
  // Every id must be in [0, pieceSize()). Control pieces decode to "";
  // byte-fallback pieces that do not form valid UTF-8 decode to U+FFFD.
  std::string decode(const std::vector<int>& ids) const;
  int pieceSize() const;
  int bosId() const;  // -1 when the model has none
  int eosId() const;  // -1 when the model has none
  int unkId() const;
  // The piece of `id` as the model writes it ("<s>", "▁the", "<0x0A>");
  // id in [0, pieceSize()).
  std::string idToPiece(int id) const;
  // A control piece (<s>, </s>, Mistral v0.3's [INST]): never produced by
  // encode(), decodes to "".
  bool isControl(int id) const;

 private:
  struct Impl;
  explicit Processor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::engine::spm
