#include "engine/model/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "engine/model/weights.h"

namespace tandem::engine {
namespace {

using ::testing::HasSubstr;

// meta-llama/Llama-2-7b-hf's config.json, verbatim.
constexpr std::string_view kLlama2_7b = R"({
  "_name_or_path": "meta-llama/Llama-2-7b-hf",
  "architectures": [
    "LlamaForCausalLM"
  ],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 11008,
  "max_position_embeddings": 4096,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 32,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "tie_word_embeddings": false,
  "torch_dtype": "float16",
  "transformers_version": "4.31.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
}
)";

constexpr std::string_view kMinimal = R"({
  "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
  "num_hidden_layers": 2, "num_attention_heads": 4
})";

// kMinimal with `extra` fields spliced in (a JSON fragment, no braces).
std::string minimalWith(std::string_view extra) {
  std::string text(kMinimal);
  text.insert(text.rfind('}'), std::string(", ") + std::string(extra));
  return text;
}

std::string errorOf(std::string_view json) {
  auto config = parseModelConfig(json);
  if (config.ok()) return "(parsed without error)";
  return std::string(config.status().message());
}

TEST(ModelConfigTest, ParsesLlama2_7b) {
  auto config = parseModelConfig(kLlama2_7b);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->architecture, "LlamaForCausalLM");
  EXPECT_EQ(config->vocab_size, 32000);
  EXPECT_EQ(config->hidden_size, 4096);
  EXPECT_EQ(config->intermediate_size, 11008);
  EXPECT_EQ(config->num_layers, 32);
  EXPECT_EQ(config->num_heads, 32);
  EXPECT_EQ(config->num_kv_heads, 32);
  EXPECT_EQ(config->head_dim, 128);
  EXPECT_FLOAT_EQ(config->rms_norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(config->rope_theta, 10000.0f);
  EXPECT_EQ(config->max_position_embeddings, 4096);
  EXPECT_FALSE(config->tie_word_embeddings);
  EXPECT_EQ(config->bos_token_id, 1);
  EXPECT_EQ(config->eos_token_ids, std::vector<TokenId>{2});
  EXPECT_EQ(config->torch_dtype, "float16");
  EXPECT_EQ(config->qDim(), 4096);
  EXPECT_EQ(config->kvDim(), 4096);
}

TEST(ModelConfigTest, DefaultsForAbsentOptionalFields) {
  auto config = parseModelConfig(kMinimal);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->architecture, "LlamaForCausalLM");
  EXPECT_EQ(config->num_kv_heads, 4);  // = num_attention_heads
  EXPECT_EQ(config->head_dim, 16);     // = hidden_size / num_attention_heads
  EXPECT_EQ(config->max_position_embeddings, kDefaultMaxPositionEmbeddings);
  EXPECT_EQ(config->max_position_embeddings, 2048);
  EXPECT_FLOAT_EQ(config->rms_norm_eps, 1e-6f);
  EXPECT_FLOAT_EQ(config->rope_theta, 10000.0f);
  EXPECT_FALSE(config->tie_word_embeddings);
  EXPECT_EQ(config->bos_token_id, 1);
  EXPECT_EQ(config->eos_token_ids, std::vector<TokenId>{2});
  EXPECT_EQ(config->torch_dtype, "float32");
}

// config.json of meta-llama/Llama-3.2-1B, Qwen/Qwen2.5-0.5B-Instruct and
// Qwen/Qwen3-0.6B as published.
constexpr std::string_view kLlama32Config = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
  "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": false,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})";
constexpr std::string_view kQwen25Config = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
  "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
  "max_position_embeddings": 32768, "max_window_layers": 21, "model_type": "qwen2", "num_attention_heads": 14,
  "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";
constexpr std::string_view kQwen3Config = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
  "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
  "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";

TEST(ModelConfigTest, Llama32ConfigWithLlama3RopeScaling) {
  auto config = parseModelConfig(kLlama32Config);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->arch().architecture, "LlamaForCausalLM");
  EXPECT_FALSE(config->arch().qkv_bias);
  EXPECT_FALSE(config->arch().qk_norm);
  EXPECT_EQ(config->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(config->rope_scaling.factor, 32.0f);
  EXPECT_EQ(config->rope_scaling.low_freq_factor, 1.0f);
  EXPECT_EQ(config->rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(config->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(config->max_position_embeddings, 131072);
  EXPECT_TRUE(config->tie_word_embeddings);

  // _compute_llama3_parameters, in double here: wavelengths above 8192
  // (8192 / low_freq_factor) divided by 32, below 2048 kept, between blended.
  const std::vector<float> inv_freq = ropeInverseFrequencies(*config);
  ASSERT_EQ(inv_freq.size(), 32u);
  int low = 0, mid = 0, high = 0;
  for (int i = 0; i < 32; ++i) {
    const double f = std::pow(500000.0, -2.0 * i / 64);
    const double wavelen = 2 * std::numbers::pi / f;
    double want = f;
    if (wavelen > 8192) {
      want = f / 32, ++low;
    } else if (wavelen >= 2048) {
      const double smooth = (8192 / wavelen - 1) / (4 - 1);
      want = (1 - smooth) * f / 32 + smooth * f, ++mid;
    } else {
      ++high;
    }
    EXPECT_NEAR(inv_freq[static_cast<size_t>(i)], want, 1e-6 * want) << i;
  }
  EXPECT_GT(low, 0);
  EXPECT_GT(mid, 0);
  EXPECT_GT(high, 0);
  // Without rope_scaling: plain theta^(-2i/d).
  ModelConfig plain = *config;
  plain.rope_scaling = {};
  EXPECT_EQ(ropeInverseFrequencies(plain)[31], static_cast<float>(std::pow(500000.0, -62.0 / 64)));
}

// meta-llama/Llama-3.1-8B-Instruct's config.json as published: eos_token_id
// lists <|end_of_text|>, <|eom_id|> and <|eot_id|>; a chat turn ends on the last.
constexpr std::string_view kLlama31InstructConfig = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": false,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})";

TEST(ModelConfigTest, Llama31InstructKeepsEveryEosId) {
  auto config = parseModelConfig(kLlama31InstructConfig);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->eos_token_ids, (std::vector<TokenId>{128001, 128008, 128009}));
  EXPECT_TRUE(config->isEos(128001));
  EXPECT_TRUE(config->isEos(128009));  // <|eot_id|>
  EXPECT_FALSE(config->isEos(128000));
  // A single id is a one-element list, and is written back as a single id.
  auto single = parseModelConfig(kLlama32Config);
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_EQ(single->eos_token_ids, std::vector<TokenId>{128001});
  EXPECT_THAT(modelConfigToJson(*single), HasSubstr("\"eos_token_id\": 128001,\n"));
  EXPECT_THAT(modelConfigToJson(*config), HasSubstr("\"eos_token_id\": [\n    128001,"));
}

TEST(ModelConfigTest, Qwen25ConfigHasBiasesAndNoSlidingWindow) {
  auto config = parseModelConfig(kQwen25Config);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->arch().architecture, "Qwen2ForCausalLM");
  EXPECT_TRUE(config->arch().qkv_bias);
  EXPECT_FALSE(config->arch().qk_norm);
  EXPECT_EQ(config->head_dim, 64);  // 896 / 14
  // sliding_window is only a number while use_sliding_window is false.
  EXPECT_EQ(config->max_position_embeddings, 32768);
  EXPECT_EQ(config->rope_scaling.type, RopeScaling::Type::kNone);
  // Qwen2's modelling code ignores attention_bias (its biases are always there).
  EXPECT_TRUE(parseModelConfig(minimalWith(R"("architectures": ["Qwen2ForCausalLM"], "attention_bias": true)")).ok());
}

TEST(ModelConfigTest, Qwen3ConfigHasQkNormAndItsOwnHeadDim) {
  auto config = parseModelConfig(kQwen3Config);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->arch().architecture, "Qwen3ForCausalLM");
  EXPECT_FALSE(config->arch().qkv_bias);
  EXPECT_TRUE(config->arch().qk_norm);
  EXPECT_EQ(config->head_dim, 128);  // != 1024 / 16
  EXPECT_EQ(config->qDim(), 2048);
  EXPECT_EQ(config->max_position_embeddings, 40960);
  EXPECT_FLOAT_EQ(config->rope_theta, 1e6f);
}

TEST(ModelConfigTest, FamilyConfigsRoundTripThroughJson) {
  for (std::string_view family : {"llama3", "qwen2", "qwen3"}) {
    const ModelConfig c = *smallArchConfig(family);
    auto back = parseModelConfig(modelConfigToJson(c));
    ASSERT_TRUE(back.ok()) << family << ": " << back.status();
    EXPECT_EQ(back->architecture, c.architecture) << family;
    EXPECT_EQ(back->head_dim, c.head_dim) << family;
    EXPECT_EQ(back->rope_scaling.type, c.rope_scaling.type) << family;
    EXPECT_EQ(back->rope_scaling.original_max_position_embeddings, c.rope_scaling.original_max_position_embeddings);
    EXPECT_EQ(ropeInverseFrequencies(*back), ropeInverseFrequencies(c)) << family;
  }
}

TEST(ModelConfigTest, OptionalFieldsOverrideDefaults) {
  auto config = parseModelConfig(minimalWith(
      R"("architectures": ["MistralForCausalLM"], "num_key_value_heads": 2, "head_dim": 32,
         "rope_theta": 500000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
         "bos_token_id": 128000, "eos_token_id": [128001, 128008], "torch_dtype": "bfloat16",
         "max_position_embeddings": 8192, "vocab_size_padded": 7, "quantization": null)"));
  ASSERT_FALSE(config.ok());  // bos_token_id 128000 is outside vocab_size 1000
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("bos_token_id"));

  config = parseModelConfig(minimalWith(
      R"("architectures": ["MistralForCausalLM"], "num_key_value_heads": 2, "head_dim": 32,
         "rope_theta": 500000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
         "bos_token_id": 100, "eos_token_id": [101, 108], "torch_dtype": "bfloat16",
         "max_position_embeddings": 8192, "unknown_field": {"x": 1})"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->architecture, "MistralForCausalLM");
  EXPECT_EQ(config->num_kv_heads, 2);
  EXPECT_EQ(config->head_dim, 32);  // explicit: qDim 128 need not equal hidden_size 64
  EXPECT_EQ(config->qDim(), 128);
  EXPECT_EQ(config->kvDim(), 64);
  EXPECT_FLOAT_EQ(config->rope_theta, 500000.0f);
  EXPECT_TRUE(config->tie_word_embeddings);
  EXPECT_EQ(config->bos_token_id, 100);
  EXPECT_EQ(config->eos_token_ids, (std::vector<TokenId>{101, 108}));  // every id of the list
  EXPECT_EQ(config->torch_dtype, "bfloat16");
  EXPECT_EQ(config->max_position_embeddings, 8192);
}

TEST(ModelConfigTest, SlidingWindowCapsContext) {
  auto config = parseModelConfig(minimalWith(R"("max_position_embeddings": 32768, "sliding_window": 4096)"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->max_position_embeddings, 4096);
  config = parseModelConfig(minimalWith(R"("max_position_embeddings": 4096, "sliding_window": null)"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->max_position_embeddings, 4096);
}

TEST(ModelConfigTest, NewerDtypeKeyIsAccepted) {
  auto config = parseModelConfig(minimalWith(R"("dtype": "bfloat16")"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->torch_dtype, "bfloat16");
}

TEST(ModelConfigTest, JsonRoundTrips) {
  ModelConfig tiny = tinyModelConfig();
  ModelConfig odd = tiny;
  odd.architecture = "MistralForCausalLM";
  odd.tie_word_embeddings = true;
  odd.rms_norm_eps = 1e-5f;
  odd.rope_theta = 1e6f;
  odd.head_dim = 64;
  odd.torch_dtype = "bfloat16";
  odd.eos_token_ids = {7, 0, 9};
  for (const ModelConfig& original : {tiny, odd}) {
    std::string json = modelConfigToJson(original);
    EXPECT_THAT(json, HasSubstr("\"rms_norm_eps\": 1e-05"));  // written as people write it
    auto back = parseModelConfig(json);
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << json;
    EXPECT_EQ(back->architecture, original.architecture);
    EXPECT_EQ(back->vocab_size, original.vocab_size);
    EXPECT_EQ(back->hidden_size, original.hidden_size);
    EXPECT_EQ(back->intermediate_size, original.intermediate_size);
    EXPECT_EQ(back->num_layers, original.num_layers);
    EXPECT_EQ(back->num_heads, original.num_heads);
    EXPECT_EQ(back->num_kv_heads, original.num_kv_heads);
    EXPECT_EQ(back->head_dim, original.head_dim);
    EXPECT_EQ(back->rms_norm_eps, original.rms_norm_eps);  // bit-exact
    EXPECT_EQ(back->rope_theta, original.rope_theta);
    EXPECT_EQ(back->max_position_embeddings, original.max_position_embeddings);
    EXPECT_EQ(back->tie_word_embeddings, original.tie_word_embeddings);
    EXPECT_EQ(back->bos_token_id, original.bos_token_id);
    EXPECT_EQ(back->eos_token_ids, original.eos_token_ids);
    EXPECT_EQ(back->torch_dtype, original.torch_dtype);
    EXPECT_EQ(modelConfigToJson(*back), json);
  }
}

TEST(ModelConfigTest, SourceNamesTheFile) {
  auto config = parseModelConfig("{", "/models/x/config.json");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("/models/x/config.json: invalid JSON"));
}

struct BadCase {
  const char* name;
  std::string json;
  std::string expected;  // a substring of the error
};

class ModelConfigErrorTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(ModelConfigErrorTest, NamesTheProblem) {
  const BadCase& c = GetParam();
  std::string error = errorOf(c.json);
  EXPECT_THAT(error, HasSubstr(c.expected)) << c.json;
  EXPECT_THAT(error, HasSubstr("config.json")) << "errors name the file";
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ModelConfigErrorTest,
    ::testing::Values(
        BadCase{"BadJson", R"({"vocab_size": 10,)", "config.json: invalid JSON: [json.exception.parse_error"},
        BadCase{"NotAnObject", "[1, 2]", "expected a JSON object at the top level"},
        BadCase{"WrongTypeString",
                R"({"vocab_size": 1000, "hidden_size": "4096", "intermediate_size": 128,
                    "num_hidden_layers": 2, "num_attention_heads": 4})",
                "config.json: hidden_size: expected integer, got string \"4096\""},
        BadCase{"WrongTypeFloat", minimalWith(R"("num_key_value_heads": 2.5)"),
                "num_key_value_heads: expected integer, got floating-point number 2.5"},
        BadCase{"WrongTypeBool", minimalWith(R"("tie_word_embeddings": "yes")"),
                "tie_word_embeddings: expected boolean, got string"},
        BadCase{"WrongTypeNumber", minimalWith(R"("rope_theta": "1e4")"), "rope_theta: expected number, got string"},
        BadCase{"MissingVocab",
                R"({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4})",
                "config.json: vocab_size: required field is missing"},
        BadCase{"MissingLayers",
                R"({"vocab_size": 10, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4})",
                "num_hidden_layers: required field is missing"},
        BadCase{"ZeroHidden",
                R"({"vocab_size": 1000, "hidden_size": 0, "intermediate_size": 128,
                    "num_hidden_layers": 2, "num_attention_heads": 4})",
                "hidden_size: must be positive, got 0"},
        BadCase{"NegativeEps", minimalWith(R"("rms_norm_eps": -1)"), "rms_norm_eps: must be a positive number"},
        BadCase{"KvHeadsDoNotDivide", minimalWith(R"("num_key_value_heads": 3)"),
                "config.json: num_key_value_heads: must divide num_attention_heads (4), got 3"},
        BadCase{"HeadsDoNotDivideHidden",
                R"({"vocab_size": 1000, "hidden_size": 66, "intermediate_size": 128,
                    "num_hidden_layers": 2, "num_attention_heads": 4})",
                "num_attention_heads: must divide hidden_size (66)"},
        BadCase{"OddHeadDim", minimalWith(R"("head_dim": 15)"), "head_dim: must be even"},
        BadCase{"UnsupportedArchitecture", minimalWith(R"("architectures": ["GPT2LMHeadModel"])"),
                "architectures: unsupported architecture [GPT2LMHeadModel]"},
        BadCase{"ArchitecturesNotAList", minimalWith(R"("architectures": "LlamaForCausalLM")"),
                "architectures: expected list of strings"},
        BadCase{"UnsupportedDtype", minimalWith(R"("torch_dtype": "int8")"),
                "torch_dtype: unsupported dtype \"int8\" (supported: float32, bfloat16, float16)"},
        BadCase{"EosOutOfVocab", minimalWith(R"("eos_token_id": [5000])"), "eos_token_id: must be < vocab_size (1000)"},
        BadCase{"EmptyEosList", minimalWith(R"("eos_token_id": [])"),
                "eos_token_id: expected an integer or a non-empty list"},
        BadCase{"EosLaterIdOutOfVocab", minimalWith(R"("eos_token_id": [2, 7, 1000])"),
                "config.json: eos_token_id: must be < vocab_size (1000), got 1000"},
        BadCase{"EosNegative", minimalWith(R"("eos_token_id": -1)"), "config.json: eos_token_id: must be >= 0, got -1"},
        BadCase{"EosNegativeInList", minimalWith(R"("eos_token_id": [2, -3])"),
                "config.json: eos_token_id: must be >= 0, got -3"},
        BadCase{"EosString", minimalWith(R"("eos_token_id": "</s>")"),
                "config.json: eos_token_id: expected integer, got string \"</s>\""},
        BadCase{"EosListOfStrings", minimalWith(R"("eos_token_id": [2, "<|eot_id|>"])"),
                "config.json: eos_token_id: expected integer, got string"},
        BadCase{"EosFloat", minimalWith(R"("eos_token_id": 2.5)"), "eos_token_id: expected integer, got floating-point"},
        BadCase{"EosNestedList", minimalWith(R"("eos_token_id": [[2]])"), "eos_token_id: expected integer, got array"},
        BadCase{"MlpBias", minimalWith(R"("mlp_bias": true)"), "config.json: mlp_bias: biases in projections are not supported"},
        // Llama 3.x: rope_scaling llama3 needs all its fields; other types are refused by name.
        BadCase{"RopeScalingLlama3MissingField",
                minimalWith(R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0})"),
                "config.json: rope_scaling.low_freq_factor: required for rope_type \"llama3\""},
        BadCase{"RopeScalingLlama3MissingContext",
                minimalWith(R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 4.0})"),
                "config.json: rope_scaling.original_max_position_embeddings: required for rope_type \"llama3\""},
        BadCase{"RopeScalingLlama3EmptyBand",
                minimalWith(R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"),
                "config.json: rope_scaling.high_freq_factor: must be greater than low_freq_factor (4)"},
        BadCase{"RopeScalingYarnOldKey", minimalWith(R"("rope_scaling": {"type": "yarn", "factor": 4.0})"),
                "config.json: rope_scaling.type: \"yarn\" is not supported (supported: llama3)"},
        BadCase{"RopeScalingLinear", minimalWith(R"("rope_scaling": {"rope_type": "linear", "factor": 2.0})"),
                "config.json: rope_scaling.rope_type: \"linear\" is not supported (supported: llama3)"},
        BadCase{"RopeScalingNoType", minimalWith(R"("rope_scaling": {"factor": 2.0})"),
                "config.json: rope_scaling: missing rope_type (supported: llama3)"},
        BadCase{"UnsupportedArchitectureGemma", minimalWith(R"("architectures": ["Gemma2ForCausalLM"])"),
                "config.json: architectures: unsupported architecture [Gemma2ForCausalLM]; this engine runs "
                "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM"},
        // Qwen2/2.5 and Qwen3: sliding-window attention switched on, per model or per layer.
        BadCase{"Qwen2SlidingWindowOn",
                minimalWith(R"("architectures": ["Qwen2ForCausalLM"], "use_sliding_window": true,
                               "sliding_window": 4096)"),
                "config.json: use_sliding_window: sliding-window attention is not supported"},
        BadCase{"Qwen3SlidingWindowOn",
                minimalWith(R"("architectures": ["Qwen3ForCausalLM"], "head_dim": 32, "use_sliding_window": true)"),
                "config.json: use_sliding_window: sliding-window attention is not supported"},
        BadCase{"Qwen3SlidingLayer", minimalWith(R"("architectures": ["Qwen3ForCausalLM"], "head_dim": 32,
                               "layer_types": ["full_attention", "sliding_attention"])"),
                "config.json: layer_types: only \"full_attention\" layers are supported, got \"sliding_attention\""},
        BadCase{"Qwen3AttentionBias",
                minimalWith(R"("architectures": ["Qwen3ForCausalLM"], "head_dim": 32, "attention_bias": true)"),
                "config.json: attention_bias: biases in projections are not supported for Qwen3ForCausalLM"},
        BadCase{"Qwen3HeadDimMissing", minimalWith(R"("architectures": ["Qwen3ForCausalLM"])"),
                "config.json: head_dim: required for Qwen3ForCausalLM"},
        BadCase{"Qwen2RopeScalingYarn", minimalWith(R"("architectures": ["Qwen2ForCausalLM"],
                               "rope_scaling": {"type": "yarn", "factor": 4.0,
                                                "original_max_position_embeddings": 32768})"),
                "config.json: rope_scaling.type: \"yarn\" is not supported (supported: llama3)"},
        BadCase{"AttentionBias", minimalWith(R"("attention_bias": true)"), "attention_bias: biases"},
        BadCase{"HiddenAct", minimalWith(R"("hidden_act": "gelu")"), "hidden_act: only \"silu\""},
        BadCase{"HugeInteger", minimalWith(R"("intermediate_size": 99999999999)"), "intermediate_size: out of range"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace tandem::engine
