// Bad model directories of each supported family (Llama 3.x, Qwen2, Qwen3):
// loadModelWeights() (and loadTokenizer() for tokenizer.json) refuses them
// with an error that names the file and the field or tensor. The chat
// template's side is in tests/agent/chat_template_agent_test.cc. Good directories are written with smallArchConfig() and
// then broken one thing at a time.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/model/model_loader.h"
#include "engine/model/safetensors.h"
#include "engine/model/tokenizer.h"
#include "engine/model/weights.h"
#include "tests/engine/model/family_tokenizer.h"
#include "tests/engine/model/scratch_dir.h"

namespace tandem::engine {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDir;

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

using ConfigEdit = std::function<void(nlohmann::json&)>;
using TensorEdit = std::function<void(std::vector<Tensor>&)>;

// The family's checkpoint in `dir`, with config.json and model.safetensors edited.
void writeBroken(const std::string& dir, std::string_view family, const ConfigEdit& edit_config,
                 const TensorEdit& edit_tensors) {
  const ModelConfig config = *smallArchConfig(family);
  ASSERT_TRUE(writeModelDir(dir, *makeRandomWeights(config, 5, {.random_norm_gains = true}), DType::kF32).ok());
  if (edit_config) {
    auto json = nlohmann::json::parse(testing::readBytes(dir + "/config.json"));
    edit_config(json);
    testing::writeText(dir + "/config.json", json.dump(2));
  }
  if (edit_tensors) {
    const std::string path = dir + "/model.safetensors";
    std::vector<Tensor> tensors;
    {
      auto file = SafetensorsFile::open(path);
      ASSERT_TRUE(file.ok()) << file.status();
      for (const std::string& name : (*file)->tensorNames()) {
        const TensorInfo* info = (*file)->find(name);
        auto data = (*file)->readFloat32(name, info->shape);
        ASSERT_TRUE(data.ok()) << data.status();
        tensors.push_back({name, info->shape, std::move(data).value()});
      }
    }
    edit_tensors(tensors);
    std::vector<TensorToWrite> out;
    for (const Tensor& t : tensors) out.push_back({t.name, t.shape, t.data});
    ASSERT_TRUE(writeSafetensors(path, out, DType::kF32).ok());
  }
}

TensorEdit dropTensor(std::string name) {
  return
      [name](std::vector<Tensor>& tensors) { std::erase_if(tensors, [&](const Tensor& t) { return t.name == name; }); };
}

// Drops the last element of the tensor's last dimension.
TensorEdit shrinkTensor(std::string name) {
  return [name](std::vector<Tensor>& tensors) {
    for (Tensor& t : tensors) {
      if (t.name != name) continue;
      const int64_t last = t.shape.back();
      std::vector<float> kept;
      for (size_t i = 0; i < t.data.size(); ++i) {
        if (static_cast<int64_t>(i) % last != last - 1) kept.push_back(t.data[i]);
      }
      t.shape.back() = last - 1;
      t.data = std::move(kept);
    }
  };
}

TensorEdit addTensor(std::string name, std::vector<int64_t> shape) {
  return [name, shape](std::vector<Tensor>& tensors) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    tensors.push_back({name, shape, std::vector<float>(static_cast<size_t>(n), 0.5f)});
  };
}

struct BadDir {
  std::string name;
  std::string family;
  ConfigEdit edit_config;
  TensorEdit edit_tensors;
  std::string file;      // the file the error names
  std::string expected;  // and the rest of it
};

class BadModelDirTest : public ::testing::TestWithParam<BadDir> {};

TEST_P(BadModelDirTest, RefusedNamingFileAndField) {
  const BadDir& c = GetParam();
  ScratchDir scratch;
  const std::string dir = scratch.file("model");
  writeBroken(dir, c.family, c.edit_config, c.edit_tensors);
  auto weights = loadModelWeights(dir);
  ASSERT_FALSE(weights.ok()) << c.name << " loaded";
  const std::string error(weights.status().message());
  EXPECT_THAT(error, HasSubstr(dir + "/" + c.file + ": " + c.expected));
}

TEST(BadModelDirTest, TheUnbrokenDirectoriesLoad) {
  for (std::string_view family : {"llama3", "qwen2", "qwen3"}) {
    ScratchDir scratch;
    writeBroken(scratch.path(), family, nullptr, nullptr);
    auto weights = loadModelWeights(scratch.path());
    EXPECT_TRUE(weights.ok()) << family << ": " << weights.status();
  }
}

TEST(BadModelDirTest, TokenizerJsonWithoutMergesIsRefusedForEachFamily) {
  for (std::string_view family : {"llama3", "qwen2", "qwen3"}) {
    ScratchDir scratch;
    writeBroken(scratch.path(), family, nullptr, nullptr);
    const ModelConfig config = *smallArchConfig(family);
    nlohmann::json tokenizer = testing::familyTokenizerJson(family);
    testing::writeTokenizerFiles(scratch.path(), tokenizer, testing::familyTokenizerConfig(family));
    auto good = loadTokenizer(scratch.path(), config);
    ASSERT_TRUE(good.ok()) << family << ": " << good.status();
    EXPECT_EQ((*good)->encode("hello"), (std::vector<TokenId>{258, 'o'})) << family;
    EXPECT_EQ((*good)->eosId(), 282) << family;

    tokenizer["model"].erase("merges");
    testing::writeTokenizerFiles(scratch.path(), tokenizer, testing::familyTokenizerConfig(family));
    auto bad = loadTokenizer(scratch.path(), config);
    ASSERT_FALSE(bad.ok()) << family << " loaded";
    EXPECT_THAT(std::string(bad.status().message()),
                HasSubstr(scratch.path() + "/tokenizer.json: model.merges: missing (expected an array)"))
        << family;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Families, BadModelDirTest,
    ::testing::Values(
        // Llama 3.x
        BadDir{"Llama3RopeYarn", "llama3",
               [](nlohmann::json& j) {
                 j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
               },
               nullptr, "config.json", "rope_scaling.type: \"yarn\" is not supported (supported: llama3)"},
        BadDir{"Llama3RopeMissingFactor", "llama3", [](nlohmann::json& j) { j["rope_scaling"].erase("factor"); },
               nullptr, "config.json", "rope_scaling.factor: required for rope_type \"llama3\""},
        BadDir{"Llama3RopeMissingHighFreqFactor", "llama3",
               [](nlohmann::json& j) { j["rope_scaling"].erase("high_freq_factor"); }, nullptr, "config.json",
               "rope_scaling.high_freq_factor: required for rope_type \"llama3\""},
        BadDir{"Llama3AttentionBias", "llama3", [](nlohmann::json& j) { j["attention_bias"] = true; }, nullptr,
               "config.json", "attention_bias: biases in projections are not supported for LlamaForCausalLM"},
        BadDir{"Llama3WithQwen2Bias", "llama3", nullptr, addTensor("model.layers.0.self_attn.q_proj.bias", {64}),
               "model.safetensors", "tensor model.layers.0.self_attn.q_proj.bias: unexpected for this config"},
        BadDir{"Llama3WrongShape", "llama3", nullptr, shrinkTensor("model.layers.1.self_attn.k_proj.weight"),
               "model.safetensors",
               "tensor model.layers.1.self_attn.k_proj.weight: expected shape [32, 64], got [32, 63]"},
        // Qwen2 / 2.5
        BadDir{"Qwen2SlidingWindow", "qwen2",
               [](nlohmann::json& j) {
                 j["use_sliding_window"] = true;
                 j["sliding_window"] = 4096;
               },
               nullptr, "config.json", "use_sliding_window: sliding-window attention is not supported"},
        BadDir{"Qwen2UnsupportedArchitecture", "qwen2",
               [](nlohmann::json& j) { j["architectures"] = {"Qwen2MoeForCausalLM"}; }, nullptr, "config.json",
               "architectures: unsupported architecture [Qwen2MoeForCausalLM]"},
        BadDir{"Qwen2MissingBias", "qwen2", nullptr, dropTensor("model.layers.2.self_attn.v_proj.bias"),
               "model.safetensors", "tensor model.layers.2.self_attn.v_proj.bias: missing"},
        BadDir{"Qwen2BiasWrongShape", "qwen2", nullptr, shrinkTensor("model.layers.1.self_attn.k_proj.bias"),
               "model.safetensors", "tensor model.layers.1.self_attn.k_proj.bias: expected shape [24], got [23]"},
        BadDir{"Qwen2MissingLmHead", "qwen2", nullptr, dropTensor("lm_head.weight"), "model.safetensors",
               "tensor lm_head.weight: missing"},
        // Qwen3
        BadDir{"Qwen3MissingQNorm", "qwen3", nullptr, dropTensor("model.layers.0.self_attn.q_norm.weight"),
               "model.safetensors", "tensor model.layers.0.self_attn.q_norm.weight: missing"},
        BadDir{"Qwen3KNormWrongShape", "qwen3", nullptr, shrinkTensor("model.layers.1.self_attn.k_norm.weight"),
               "model.safetensors", "tensor model.layers.1.self_attn.k_norm.weight: expected shape [16], got [15]"},
        BadDir{"Qwen3QProjWrongShape", "qwen3", nullptr, shrinkTensor("model.layers.0.self_attn.q_proj.weight"),
               "model.safetensors",
               "tensor model.layers.0.self_attn.q_proj.weight: expected shape [128, 64], got [128, 63]"},
        BadDir{"Qwen3SlidingLayers", "qwen3",
               [](nlohmann::json& j) {
                 j["layer_types"] = {"sliding_attention", "full_attention"};
               },
               nullptr, "config.json", "layer_types: only \"full_attention\" layers are supported"},
        BadDir{"Qwen3AttentionBias", "qwen3", [](nlohmann::json& j) { j["attention_bias"] = true; }, nullptr,
               "config.json", "attention_bias: biases in projections are not supported for Qwen3ForCausalLM"},
        BadDir{"Qwen3RopeDynamic", "qwen3",
               [](nlohmann::json& j) {
                 j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
               },
               nullptr, "config.json", "rope_scaling.rope_type: \"dynamic\" is not supported (supported: llama3)"},
        BadDir{"Qwen3HeadDimMissing", "qwen3", [](nlohmann::json& j) { j.erase("head_dim"); }, nullptr, "config.json",
               "head_dim: required for Qwen3ForCausalLM"}),
    [](const ::testing::TestParamInfo<BadDir>& info) { return info.param.name; });

}  // namespace
}  // namespace tandem::engine
