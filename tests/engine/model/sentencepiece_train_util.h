#pragma once
// Trains a SentencePiece model from a test, through libsentencepiece_train.
// Std-only on purpose: <sentencepiece_trainer.h> cannot share a translation
// unit with Abseil (see engine/model/sentencepiece_shim.h), and the tests
// include Abseil through the engine headers.

#include <string>

namespace tandem::engine::testing {

// `args` in spm_train's flag syntax ("--input=... --model_prefix=..."). Returns
// "" on success, else sentencepiece's error message.
std::string trainSentencePiece(const std::string& args);

}  // namespace tandem::engine::testing
