#pragma once
// The shape of a Llama-family decoder, read from a Hugging Face config.json
// (LlamaForCausalLM fields). Field names in comments are the JSON keys.

#include <string>
#include <string_view>

#include "src/common/ids.h"
#include "src/common/status.h"

namespace tandem::engine {

struct ModelConfig {
  std::string architecture = "LlamaForCausalLM";  // architectures[0]
  int vocab_size = 0;               // vocab_size
  int hidden_size = 0;              // hidden_size
  int intermediate_size = 0;        // intermediate_size (SwiGLU inner width)
  int num_layers = 0;               // num_hidden_layers
  int num_heads = 0;                // num_attention_heads
  int num_kv_heads = 0;             // num_key_value_heads (defaults to num_attention_heads)
  int head_dim = 0;                 // head_dim (defaults to hidden_size / num_attention_heads)
  float rms_norm_eps = 1e-6f;       // rms_norm_eps
  float rope_theta = 10000.0f;      // rope_theta
  int max_position_embeddings = 0;  // max_position_embeddings
  bool tie_word_embeddings = false; // tie_word_embeddings
  TokenId bos_token_id = 1;         // bos_token_id
  TokenId eos_token_id = 2;         // eos_token_id (first one when a list)
  std::string torch_dtype = "float32";  // torch_dtype: float32 | bfloat16 (weights are widened to fp32 on load)

  int qDim() const { return num_heads * head_dim; }    // width of the query projection
  int kvDim() const { return num_kv_heads * head_dim; } // width of each of the K and V projections
};

// max_position_embeddings when config.json does not say (Llama-1's context).
inline constexpr int kDefaultMaxPositionEmbeddings = 2048;

// Parses and validates config.json text. Errors name the field
// ("config.json: num_key_value_heads: must divide num_attention_heads (32), got 5").
// Unknown fields are ignored (HF configs carry many); fields that change the
// math in ways this engine does not implement (rope_scaling, attention_bias,
// mlp_bias, hidden_act other than silu) are errors. torch_dtype may be
// float32, bfloat16 or float16 (the checkpoint's dtype; weights are widened
// to fp32 on load). `sliding_window` (Mistral) caps max_position_embeddings
// so that full attention stays exact.
absl::StatusOr<ModelConfig> parseModelConfig(std::string_view json_text, std::string_view source = "config.json");

// Serialises a config in the same HF format (used by the tiny-model generator).
std::string modelConfigToJson(const ModelConfig& config);

}  // namespace tandem::engine
