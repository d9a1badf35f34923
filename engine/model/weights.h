#pragma once
// Model weights in memory, fp32, in Hugging Face's layout: every projection
// matrix is [out_features, in_features] row-major, so y = x · Wᵀ.
// HF tensor names are given per field.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/model_config.h"
#include "src/common/status.h"

namespace tandem::engine {

struct LayerWeights {
  std::vector<float> attn_norm;  // model.layers.{i}.input_layernorm.weight           [hidden]
  std::vector<float> wq;         // model.layers.{i}.self_attn.q_proj.weight           [num_heads*head_dim, hidden]
  std::vector<float> wk;         // model.layers.{i}.self_attn.k_proj.weight           [num_kv_heads*head_dim, hidden]
  std::vector<float> wv;         // model.layers.{i}.self_attn.v_proj.weight           [num_kv_heads*head_dim, hidden]
  std::vector<float> wo;         // model.layers.{i}.self_attn.o_proj.weight           [hidden, num_heads*head_dim]
  std::vector<float> ffn_norm;   // model.layers.{i}.post_attention_layernorm.weight  [hidden]
  std::vector<float> w_gate;     // model.layers.{i}.mlp.gate_proj.weight              [intermediate, hidden]
  std::vector<float> w_up;       // model.layers.{i}.mlp.up_proj.weight                [intermediate, hidden]
  std::vector<float> w_down;     // model.layers.{i}.mlp.down_proj.weight              [hidden, intermediate]
};

struct ModelWeights {
  ModelConfig config;
  std::vector<float> embed;       // model.embed_tokens.weight [vocab, hidden]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // model.norm.weight [hidden]
  // lm_head.weight [vocab, hidden]; empty when tie_word_embeddings (use embed).
  std::vector<float> lm_head;

  const std::vector<float>& outputProjection() const { return lm_head.empty() ? embed : lm_head; }
};

// Deterministic random weights for `config` from `seed` (same seed, same
// bits, on every machine): projections ~ N(0, 1/in_features) scaled so the
// residual stream stays O(1); norms = 1. Used by the built-in tiny model and by tests.
std::unique_ptr<ModelWeights> makeRandomWeights(const ModelConfig& config, uint64_t seed);

// The built-in tiny model's shape: 4 layers, hidden 256, 8 query / 2 KV
// heads, head_dim 32, SwiGLU 688, vocab = the byte tokenizer's (printable ASCII).
ModelConfig tinyModelConfig();

}  // namespace tandem::engine
