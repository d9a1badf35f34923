#pragma once
// Model weights in memory, fp32, in Hugging Face's layout: every projection
// matrix is [out_features, in_features] row-major, so y = x · Wᵀ.
// HF tensor names are given per field.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
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
  // Only when config.arch().qkv_bias (Qwen2), else empty:
  std::vector<float> bq;  // model.layers.{i}.self_attn.q_proj.bias [num_heads*head_dim]
  std::vector<float> bk;  // model.layers.{i}.self_attn.k_proj.bias [num_kv_heads*head_dim]
  std::vector<float> bv;  // model.layers.{i}.self_attn.v_proj.bias [num_kv_heads*head_dim]
  // Only when config.arch().qk_norm (Qwen3), else empty:
  std::vector<float> q_norm;  // model.layers.{i}.self_attn.q_norm.weight [head_dim]
  std::vector<float> k_norm;  // model.layers.{i}.self_attn.k_norm.weight [head_dim]
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

struct RandomWeightOptions {
  // Norm gains 1 + N(0, 0.2²) instead of 1, so that a reference check sees
  // whether each norm's weight is applied (and to the right dimension).
  bool random_norm_gains = false;
};

// Deterministic random weights for `config` from `seed` (same seed, same
// bits, on every machine): projections ~ N(0, 1/in_features) scaled so the
// residual stream stays O(1); norms = 1 unless options say otherwise;
// the architecture's extra tensors (q/k/v biases ~ N(0, 0.5²), q/k norms)
// from a second stream, so a Llama model's bits do not depend on them.
// Used by the built-in tiny model and by tests.
std::unique_ptr<ModelWeights> makeRandomWeights(const ModelConfig& config, uint64_t seed,
                                                const RandomWeightOptions& options = {});

// The built-in tiny model's shape: 4 layers, hidden 256, 8 query / 2 KV
// heads, head_dim 32, SwiGLU 688, vocab = the byte tokenizer's (printable ASCII).
ModelConfig tinyModelConfig();

// Small test checkpoints of each supported family, in its real tensor names
// and shapes (hidden 64-96, 2-3 layers, GQA, vocab 300 so the byte tokenizer
// fits): "llama3" (rope_scaling llama3, rope_theta 500000, tied embeddings),
// "qwen2" (q/k/v biases, untied), "qwen3" (q/k norms, head_dim 16 !=
// hidden / heads, tied). nullopt for another name.
std::optional<ModelConfig> smallArchConfig(std::string_view family);
// "llama3, qwen2, qwen3"
inline constexpr std::string_view kSmallArchFamilies = "llama3, qwen2, qwen3";

}  // namespace tandem::engine
