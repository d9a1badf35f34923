// Only std and sentencepiece headers here: see sentencepiece_shim.h.
#include "engine/model/sentencepiece_shim.h"

#include <sentencepiece_processor.h>

namespace tandem::engine::spm {

struct Processor::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

Processor::Processor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Processor::~Processor() = default;

std::unique_ptr<Processor> Processor::load(const std::string& path, std::string* error) {
  auto impl = std::make_unique<Impl>();
  const sentencepiece::util::Status status = impl->sp.Load(path);
  if (!status.ok()) {
    *error = status.ToString();
    return nullptr;
  }
  return std::unique_ptr<Processor>(new Processor(std::move(impl)));
}

std::vector<int> Processor::encode(std::string_view text) const {
  std::vector<int> ids;
  // Fails only when no model is loaded, which load() rules out.
  (void)impl_->sp.Encode(text, &ids);
  return ids;
}

std::string Processor::decode(const std::vector<int>& ids) const {
  std::string text;
  (void)impl_->sp.Decode(ids, &text);
  return text;
}

int Processor::pieceSize() const { return impl_->sp.GetPieceSize(); }
int Processor::bosId() const { return impl_->sp.bos_id(); }
int Processor::eosId() const { return impl_->sp.eos_id(); }
int Processor::unkId() const { return impl_->sp.unk_id(); }
std::string Processor::idToPiece(int id) const { return impl_->sp.IdToPiece(id); }
bool Processor::isControl(int id) const { return impl_->sp.IsControl(id); }

}  // namespace tandem::engine::spm
