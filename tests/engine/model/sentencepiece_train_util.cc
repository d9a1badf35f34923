#include "tests/engine/model/sentencepiece_train_util.h"

#include <sentencepiece_trainer.h>

namespace tandem::engine::testing {

std::string trainSentencePiece(const std::string& args) {
  const sentencepiece::util::Status status = sentencepiece::SentencePieceTrainer::Train(args);
  return status.ok() ? std::string() : status.ToString();
}

}  // namespace tandem::engine::testing
