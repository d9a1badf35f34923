#pragma once
// Loading a Hugging Face Llama-family model directory into fp32 ModelWeights,
// and writing one (the tiny-model generator).
//
// A model directory holds:
//   config.json                    the HF config (see model_config.h)
//   model.safetensors              all tensors, HF names (see weights.h), or
//   model.safetensors.index.json   {"weight_map": {"<tensor>": "<shard file>", ...}}
//                                  plus the shard files it names
//   tokenizer.model | tokenizer_config.json   (see tokenizer.h)

#include <memory>
#include <string>

#include "engine/model/safetensors.h"
#include "engine/model/weights.h"
#include "src/common/status.h"

namespace tandem::engine {

// Reads config.json and the weights, checking every tensor's shape against
// the config. F32, BF16 and F16 tensors are widened to fp32. With
// tie_word_embeddings the output projection is the embedding (lm_head left
// empty, any lm_head.weight ignored, as Hugging Face does); without it
// lm_head.weight is required. Tensors the engine does not know are an
// error (they mean a feature it would silently ignore), except rotary
// inv_freq buffers. Errors name the file and the tensor or field:
//   "/m/model.safetensors: tensor model.layers.3.mlp.up_proj.weight: expected shape [688, 256], got [688, 255]"
[[nodiscard]] absl::StatusOr<std::unique_ptr<ModelWeights>> loadModelWeights(const std::string& model_dir);

// The directory's config.json, parsed (model_config.h); errors name the
// file and the field.
[[nodiscard]] absl::StatusOr<ModelConfig> loadModelConfig(const std::string& model_dir);

// Rank `rank` of `world`'s shard of the model in `model_dir`: what
// shardWeights(*loadModelWeights(model_dir), rank, world) gives, bit for
// bit, but each layer is sliced as soon as it is read and the whole layer
// dropped, so memory holds the shard, the replicated tensors (embeddings,
// norms, lm_head) and one whole layer at a time, not the whole model (a
// tensor-parallel rank's load). Errors as loadModelWeights' and
// checkShard's; a model that does not split fails before any tensor is read.
[[nodiscard]] absl::StatusOr<std::unique_ptr<ModelWeights>> loadModelShard(const std::string& model_dir, int rank,
                                                                           int world);

// Writes config.json (torch_dtype set from `dtype`), model.safetensors
// (`dtype` kF32 or kBF16) and tokenizer_config.json selecting the byte
// tokenizer, creating `dir` if needed. Deterministic: the same weights give
// byte-identical files. Errors when a weight's size does not match the config.
[[nodiscard]] absl::Status writeModelDir(const std::string& dir, const ModelWeights& weights, DType dtype);

}  // namespace tandem::engine
