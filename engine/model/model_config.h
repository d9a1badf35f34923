#pragma once
// The shape of a Llama-family decoder, read from a Hugging Face config.json.
// Field names in comments are the JSON keys.
//
// The families this engine runs differ in a few places only; each family's
// differences are one ArchSpec, chosen from `architectures` when the config
// is parsed, and the forward pass and the loader read them from there:
//
//   architecture         q/k/v biases   q/k RMSNorm   sliding window
//   LlamaForCausalLM     no             no            -            (Llama 2, Llama 3.x with rope_scaling llama3)
//   MistralForCausalLM   no             no            caps context
//   Qwen2ForCausalLM     yes            no            refused when use_sliding_window
//   Qwen3ForCausalLM     no             yes           refused when use_sliding_window
//
// RoPE's inverse frequencies come from rope_theta and rope_scaling
// (ropeInverseFrequencies below), the same for every family.

#include <string>
#include <string_view>
#include <vector>

#include "src/common/ids.h"
#include "src/common/status.h"

namespace tandem::engine {

// What one architecture adds to the Llama decoder. See the table above.
struct ArchSpec {
  std::string_view architecture;  // "Qwen2ForCausalLM", as in config.json's architectures
  std::string_view model_type;    // "qwen2", config.json's model_type when we write one
  // q_proj, k_proj and v_proj have .bias tensors [out] (HF Qwen2Attention: bias=True).
  bool qkv_bias = false;
  // RMSNorm over head_dim of every query and key head before RoPE, weights
  // self_attn.q_norm.weight / k_norm.weight [head_dim] (HF Qwen3Attention).
  bool qk_norm = false;
  // config.json's use_sliding_window switches sliding-window attention on
  // (Qwen2/3: sliding_window is only a number until it is true); refused.
  bool has_use_sliding_window = false;
  // config.json's sliding_window alone enables it (Mistral); the context is
  // capped at the window so that full attention stays exact.
  bool sliding_window_caps_context = false;
  // config.json's attention_bias is read (Llama, Qwen3: true is refused).
  // Qwen2's modelling code ignores the field: its biases are always there.
  bool reads_attention_bias = true;
  // head_dim must be given (Qwen3: often != hidden_size / num_attention_heads).
  bool head_dim_required = false;
};

// The spec of `architecture`, or nullptr when this engine does not run it.
const ArchSpec* findArchSpec(std::string_view architecture);
// "LlamaForCausalLM, MistralForCausalLM, ..." for messages.
std::string supportedArchitectures();

// config.json's rope_scaling. kNone: plain RoPE (absent or null).
struct RopeScaling {
  enum class Type { kNone, kLlama3 };
  Type type = Type::kNone;
  // llama3 (HF _compute_llama3_parameters): all required.
  float factor = 0;
  float low_freq_factor = 0;
  float high_freq_factor = 0;
  int original_max_position_embeddings = 0;
};

struct ModelConfig {
  std::string architecture = "LlamaForCausalLM";  // architectures[0]; findArchSpec() knows it
  int vocab_size = 0;               // vocab_size
  int hidden_size = 0;              // hidden_size
  int intermediate_size = 0;        // intermediate_size (SwiGLU inner width)
  int num_layers = 0;               // num_hidden_layers
  int num_heads = 0;                // num_attention_heads
  int num_kv_heads = 0;             // num_key_value_heads (defaults to num_attention_heads)
  int head_dim = 0;                 // head_dim (defaults to hidden_size / num_attention_heads)
  float rms_norm_eps = 1e-6f;       // rms_norm_eps
  float rope_theta = 10000.0f;      // rope_theta
  RopeScaling rope_scaling;         // rope_scaling
  int max_position_embeddings = 0;  // max_position_embeddings
  bool tie_word_embeddings = false; // tie_word_embeddings
  TokenId bos_token_id = 1;         // bos_token_id
  // eos_token_id: every id of a list (Llama 3.1 Instruct: <|end_of_text|>,
  // <|eom_id|>, <|eot_id|>), a single id as a one-element list; never empty.
  // Generation stops on any of them; the first is the tokenizer's own.
  std::vector<TokenId> eos_token_ids = {2};
  std::string torch_dtype = "float32";  // torch_dtype: float32 | bfloat16 (weights are widened to fp32 on load)

  int qDim() const { return num_heads * head_dim; }    // width of the query projection
  int kvDim() const { return num_kv_heads * head_dim; } // width of each of the K and V projections
  bool isEos(TokenId t) const;                          // t is one of eos_token_ids
  // The architecture's spec; the Llama one when `architecture` is unknown
  // (parseModelConfig never returns such a config).
  const ArchSpec& arch() const;
};

// RoPE's inverse frequencies inv_freq[i], i < head_dim / 2, in fp32 as Hugging
// Face computes them: theta^(-2i/head_dim) (kmath::ropeInvFreq's bits), then,
// for rope_scaling llama3, _compute_llama3_parameters' adjustment (low
// frequencies divided by factor, the band between smoothly interpolated).
std::vector<float> ropeInverseFrequencies(const ModelConfig& config);

// max_position_embeddings when config.json does not say (Llama-1's context).
inline constexpr int kDefaultMaxPositionEmbeddings = 2048;

// Parses and validates config.json text. Errors name the field
// ("config.json: num_key_value_heads: must divide num_attention_heads (32), got 5").
// Unknown fields are ignored (HF configs carry many); fields that change the
// math in ways this engine does not implement are errors: rope_scaling of a
// type other than llama3 (or llama3 missing a field), attention_bias true
// (Llama, Mistral, Qwen3), mlp_bias true, hidden_act other than silu,
// use_sliding_window true (Qwen2/3). torch_dtype may be float32, bfloat16 or
// float16 (the checkpoint's dtype; weights are widened to fp32 on load).
// `sliding_window` (Mistral) caps max_position_embeddings so that full
// attention stays exact.
absl::StatusOr<ModelConfig> parseModelConfig(std::string_view json_text, std::string_view source = "config.json");

// Serialises a config in the same HF format (used by the tiny-model generator).
std::string modelConfigToJson(const ModelConfig& config);

}  // namespace tandem::engine
