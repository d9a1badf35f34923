#include "engine/model/weights.h"

#include <cmath>
#include <utility>

namespace tandem::engine {
namespace {

// splitmix64 + Box-Muller written out by hand: std::normal_distribution is
// implementation-defined, and the tiny model must be bit-identical everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in (0, 1].
  double uniform() { return (static_cast<double>(next() >> 11) + 1.0) * (1.0 / 9007199254740992.0); }
  double normal() {
    double u1 = uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t state_;
};

std::vector<float> randomMatrix(Rng& rng, int rows, int cols, double stddev) {
  std::vector<float> m(static_cast<size_t>(rows) * static_cast<size_t>(cols));
  for (float& x : m) x = static_cast<float>(rng.normal() * stddev);
  return m;
}

std::vector<float> randomGains(Rng& rng, int n) {
  std::vector<float> g(static_cast<size_t>(n));
  for (float& x : g) x = static_cast<float>(1.0 + 0.2 * rng.normal());
  return g;
}

}  // namespace

std::unique_ptr<ModelWeights> makeRandomWeights(const ModelConfig& c, uint64_t seed,
                                                const RandomWeightOptions& options) {
  auto w = std::make_unique<ModelWeights>();
  w->config = c;
  Rng rng(seed);
  const double in_hidden = 1.0 / std::sqrt(static_cast<double>(c.hidden_size));
  // A random model with textbook init attends almost uniformly, so its output
  // hardly depends on anything but the last token, and tests comparing
  // outputs (chunked vs whole, cached vs recomputed) would pass even with
  // corrupted KV. Queries are scaled up so attention is peaked (score std
  // ~3), and residual branches are not scaled down, so that every token of
  // the context can move the output.
  const double query_gain = 3.0;
  const double depth = 1.0;
  w->embed = randomMatrix(rng, c.vocab_size, c.hidden_size, 1.0);
  for (int i = 0; i < c.num_layers; ++i) {
    LayerWeights l;
    l.attn_norm.assign(static_cast<size_t>(c.hidden_size), 1.0f);
    l.wq = randomMatrix(rng, c.qDim(), c.hidden_size, query_gain * in_hidden);
    l.wk = randomMatrix(rng, c.kvDim(), c.hidden_size, in_hidden);
    l.wv = randomMatrix(rng, c.kvDim(), c.hidden_size, in_hidden);
    l.wo = randomMatrix(rng, c.hidden_size, c.qDim(), depth / std::sqrt(static_cast<double>(c.qDim())));
    l.ffn_norm.assign(static_cast<size_t>(c.hidden_size), 1.0f);
    l.w_gate = randomMatrix(rng, c.intermediate_size, c.hidden_size, in_hidden);
    l.w_up = randomMatrix(rng, c.intermediate_size, c.hidden_size, in_hidden);
    l.w_down = randomMatrix(rng, c.hidden_size, c.intermediate_size,
                            depth / std::sqrt(static_cast<double>(c.intermediate_size)));
    w->layers.push_back(std::move(l));
  }
  w->final_norm.assign(static_cast<size_t>(c.hidden_size), 1.0f);
  if (!c.tie_word_embeddings) w->lm_head = randomMatrix(rng, c.vocab_size, c.hidden_size, in_hidden);

  Rng extra(seed ^ 0x5bd1e9955bd1e995ULL);
  for (LayerWeights& l : w->layers) {
    if (options.random_norm_gains) {
      l.attn_norm = randomGains(extra, c.hidden_size);
      l.ffn_norm = randomGains(extra, c.hidden_size);
    }
    if (c.arch().qkv_bias) {
      l.bq = randomMatrix(extra, 1, c.qDim(), 0.5);
      l.bk = randomMatrix(extra, 1, c.kvDim(), 0.5);
      l.bv = randomMatrix(extra, 1, c.kvDim(), 0.5);
    }
    if (c.arch().qk_norm) {
      l.q_norm = options.random_norm_gains ? randomGains(extra, c.head_dim)
                                           : std::vector<float>(static_cast<size_t>(c.head_dim), 1.0f);
      l.k_norm = options.random_norm_gains ? randomGains(extra, c.head_dim)
                                           : std::vector<float>(static_cast<size_t>(c.head_dim), 1.0f);
    }
  }
  if (options.random_norm_gains) w->final_norm = randomGains(extra, c.hidden_size);
  return w;
}

ModelConfig tinyModelConfig() {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 100;  // the byte tokenizer: <unk> <s> </s> \n \t and printable ASCII 0x20..0x7E
  c.hidden_size = 256;
  c.intermediate_size = 688;
  c.num_layers = 4;
  c.num_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 32;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  c.max_position_embeddings = 16384;
  c.tie_word_embeddings = false;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  c.torch_dtype = "float32";
  return c;
}

std::optional<ModelConfig> smallArchConfig(std::string_view family) {
  ModelConfig c = tinyModelConfig();
  c.vocab_size = 300;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-6f;
  if (family == "llama3") {
    // Llama 3.2's shape in miniature. With head_dim 16 and rope_theta 5e5 the
    // wavelengths are 6.3, 33, 168, 872, ...: original_max_position_embeddings
    // 64 puts dimension 0 in the high band (unchanged), 1 in the smoothed band
    // and 2..7 in the low band (divided by factor), so all three branches of
    // the llama3 adjustment show in the logits.
    c.architecture = "LlamaForCausalLM";
    c.hidden_size = 64;
    c.intermediate_size = 160;
    c.num_layers = 2;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 16;
    c.rope_theta = 500000.0f;
    c.rope_scaling = {.type = RopeScaling::Type::kLlama3,
                      .factor = 8.0f,
                      .low_freq_factor = 1.0f,
                      .high_freq_factor = 4.0f,
                      .original_max_position_embeddings = 64};
    c.tie_word_embeddings = true;
    c.bos_token_id = 1;
    c.eos_token_ids = {2};
    return c;
  }
  if (family == "qwen2") {
    c.architecture = "Qwen2ForCausalLM";
    c.hidden_size = 96;
    c.intermediate_size = 224;
    c.num_layers = 3;
    c.num_heads = 8;
    c.num_kv_heads = 2;
    c.head_dim = 12;
    c.rope_theta = 1000000.0f;
    c.tie_word_embeddings = false;
    return c;
  }
  if (family == "qwen3") {
    c.architecture = "Qwen3ForCausalLM";
    c.hidden_size = 64;
    c.intermediate_size = 192;
    c.num_layers = 2;
    c.num_heads = 8;
    c.num_kv_heads = 2;
    c.head_dim = 16;  // 8 heads * 16 = 128 != hidden 64
    c.rope_theta = 1000000.0f;
    c.tie_word_embeddings = true;
    return c;
  }
  return std::nullopt;
}

}  // namespace tandem::engine
