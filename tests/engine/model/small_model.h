#pragma once
// A model config small enough to write and load in milliseconds; vocab 100
// so that the byte tokenizer fits. GQA (4 query / 2 KV heads) and head_dim 8
// with qDim 32 != hidden 16 exercise every shape rule.

#include "engine/model/weights.h"

namespace tandem::engine::testing {

inline ModelConfig smallConfig() {
  ModelConfig c = tinyModelConfig();
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 128;
  return c;
}

}  // namespace tandem::engine::testing
