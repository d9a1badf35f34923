#include "engine/model/model_loader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/model/safetensors.h"
#include "engine/model/tokenizer.h"
#include "tests/engine/model/scratch_dir.h"
#include "tests/engine/model/small_model.h"

namespace tandem::engine {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDir;
using testing::smallConfig;

void expectEqualWeights(const ModelWeights& a, const ModelWeights& b) {
  EXPECT_EQ(a.config.hidden_size, b.config.hidden_size);
  EXPECT_EQ(a.config.num_layers, b.config.num_layers);
  EXPECT_EQ(a.config.tie_word_embeddings, b.config.tie_word_embeddings);
  EXPECT_EQ(a.embed, b.embed);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t i = 0; i < a.layers.size(); ++i) {
    const LayerWeights& x = a.layers[i];
    const LayerWeights& y = b.layers[i];
    EXPECT_EQ(x.attn_norm, y.attn_norm) << "layer " << i;
    EXPECT_EQ(x.wq, y.wq) << "layer " << i;
    EXPECT_EQ(x.wk, y.wk) << "layer " << i;
    EXPECT_EQ(x.wv, y.wv) << "layer " << i;
    EXPECT_EQ(x.wo, y.wo) << "layer " << i;
    EXPECT_EQ(x.ffn_norm, y.ffn_norm) << "layer " << i;
    EXPECT_EQ(x.w_gate, y.w_gate) << "layer " << i;
    EXPECT_EQ(x.w_up, y.w_up) << "layer " << i;
    EXPECT_EQ(x.w_down, y.w_down) << "layer " << i;
  }
  EXPECT_EQ(a.final_norm, b.final_norm);
  EXPECT_EQ(a.lm_head, b.lm_head);
}

std::vector<float> roundedToBf16(const std::vector<float>& v) {
  std::vector<float> out;
  for (float x : v) out.push_back(bf16ToFloat(floatToBf16(x)));
  return out;
}

// Every tensor of a safetensors file as floats, keyed by name, with shapes.
struct Tensors {
  std::map<std::string, std::vector<int64_t>> shapes;
  std::map<std::string, std::vector<float>> values;
};

Tensors readAll(const std::string& path) {
  Tensors t;
  auto file = SafetensorsFile::open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return t;
  for (const std::string& name : (*file)->tensorNames()) {
    const TensorInfo* info = (*file)->find(name);
    t.shapes[name] = info->shape;
    t.values[name] = *(*file)->readFloat32(name, info->shape);
  }
  return t;
}

void writeAll(const std::string& path, const Tensors& t) {
  std::vector<TensorToWrite> out;
  for (const auto& [name, values] : t.values) out.push_back({name, t.shapes.at(name), values});
  ASSERT_TRUE(writeSafetensors(path, out, DType::kF32).ok());
}

// Rewrites dir/model.safetensors after `edit` changes its tensors.
void editWeights(const ScratchDir& dir, const std::function<void(Tensors&)>& edit) {
  Tensors t = readAll(dir.file("model.safetensors"));
  edit(t);
  writeAll(dir.file("model.safetensors"), t);
}

std::string loadError(const std::string& dir) {
  auto weights = loadModelWeights(dir);
  if (weights.ok()) return "(loaded without error)";
  return std::string(weights.status().message());
}

TEST(ModelLoaderTest, WritesAndLoadsBackEqual) {
  ScratchDir dir;
  auto original = makeRandomWeights(smallConfig(), 7);
  ASSERT_TRUE(writeModelDir(dir.path(), *original, DType::kF32).ok());
  auto loaded = loadModelWeights(dir.path());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->config.torch_dtype, "float32");
  expectEqualWeights(**loaded, *original);
  EXPECT_FALSE((*loaded)->lm_head.empty());

  // The directory also carries the byte tokenizer's config.
  auto tokenizer = loadTokenizer(dir.path(), (*loaded)->config);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->vocabSize(), ByteTokenizer::kVocabSize);
}

TEST(ModelLoaderTest, Bf16ModelLoadsWidened) {
  ScratchDir dir;
  auto original = makeRandomWeights(smallConfig(), 8);
  ASSERT_TRUE(writeModelDir(dir.path(), *original, DType::kBF16).ok());
  auto loaded = loadModelWeights(dir.path());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->config.torch_dtype, "bfloat16");
  EXPECT_EQ((*loaded)->embed, roundedToBf16(original->embed));
  EXPECT_EQ((*loaded)->layers[1].w_down, roundedToBf16(original->layers[1].w_down));
  EXPECT_EQ((*loaded)->lm_head, roundedToBf16(original->lm_head));
  EXPECT_NE((*loaded)->embed, original->embed) << "bf16 must actually have lost precision";
}

TEST(ModelLoaderTest, TiedEmbeddings) {
  ScratchDir dir;
  ModelConfig config = smallConfig();
  config.tie_word_embeddings = true;
  auto original = makeRandomWeights(config, 9);
  ASSERT_TRUE(original->lm_head.empty());
  ASSERT_TRUE(writeModelDir(dir.path(), *original, DType::kF32).ok());
  EXPECT_EQ(readAll(dir.file("model.safetensors")).values.count("lm_head.weight"), 0u);

  auto loaded = loadModelWeights(dir.path());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE((*loaded)->config.tie_word_embeddings);
  EXPECT_TRUE((*loaded)->lm_head.empty());
  EXPECT_EQ(&(*loaded)->outputProjection(), &(*loaded)->embed);
  expectEqualWeights(**loaded, *original);

  // A tied checkpoint that still ships lm_head.weight loads; the copy is ignored.
  editWeights(dir, [](Tensors& t) {
    t.values["lm_head.weight"] = t.values["model.embed_tokens.weight"];
    t.shapes["lm_head.weight"] = t.shapes["model.embed_tokens.weight"];
  });
  loaded = loadModelWeights(dir.path());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE((*loaded)->lm_head.empty());
}

TEST(ModelLoaderTest, UntiedWithoutLmHeadIsAnError) {
  ScratchDir dir;
  ASSERT_TRUE(writeModelDir(dir.path(), *makeRandomWeights(smallConfig(), 1), DType::kF32).ok());
  editWeights(dir, [](Tensors& t) { t.values.erase("lm_head.weight"); });
  std::string error = loadError(dir.path());
  EXPECT_THAT(error, HasSubstr("model.safetensors: tensor lm_head.weight: missing"));
  EXPECT_THAT(error, HasSubstr("config.json has tie_word_embeddings false"));
}

TEST(ModelLoaderTest, MissingTensorIsNamed) {
  ScratchDir dir;
  ASSERT_TRUE(writeModelDir(dir.path(), *makeRandomWeights(smallConfig(), 1), DType::kF32).ok());
  editWeights(dir, [](Tensors& t) { t.values.erase("model.layers.1.mlp.up_proj.weight"); });
  auto weights = loadModelWeights(dir.path());
  ASSERT_FALSE(weights.ok());
  EXPECT_TRUE(absl::IsNotFound(weights.status()));
  EXPECT_THAT(std::string(weights.status().message()),
              HasSubstr(dir.file("model.safetensors") + ": tensor model.layers.1.mlp.up_proj.weight: missing"));
}

TEST(ModelLoaderTest, WrongShapeIsNamed) {
  ScratchDir dir;
  ASSERT_TRUE(writeModelDir(dir.path(), *makeRandomWeights(smallConfig(), 1), DType::kF32).ok());
  editWeights(dir, [](Tensors& t) {
    t.shapes["model.layers.0.self_attn.k_proj.weight"] = {16, 15};
    t.values["model.layers.0.self_attn.k_proj.weight"].resize(16 * 15);
  });
  EXPECT_THAT(loadError(dir.path()),
              HasSubstr("model.safetensors: tensor model.layers.0.self_attn.k_proj.weight: expected shape [16, 16], "
                        "got [16, 15]"));
}

TEST(ModelLoaderTest, ConfigThatDisagreesWithTheWeights) {
  ScratchDir dir;
  ASSERT_TRUE(writeModelDir(dir.path(), *makeRandomWeights(smallConfig(), 1), DType::kF32).ok());
  ModelConfig wrong = smallConfig();
  wrong.intermediate_size = 32;
  testing::writeText(dir.file("config.json"), modelConfigToJson(wrong));
  EXPECT_THAT(loadError(dir.path()),
              HasSubstr("tensor model.layers.0.mlp.gate_proj.weight: expected shape [32, 16], got [24, 16]"));
}

TEST(ModelLoaderTest, UnexpectedTensorIsAnErrorButInvFreqIsIgnored) {
  ScratchDir dir;
  ASSERT_TRUE(writeModelDir(dir.path(), *makeRandomWeights(smallConfig(), 1), DType::kF32).ok());
  editWeights(dir, [](Tensors& t) {
    t.values["model.layers.0.self_attn.rotary_emb.inv_freq"] = std::vector<float>(4, 1.0f);
    t.shapes["model.layers.0.self_attn.rotary_emb.inv_freq"] = {4};
  });
  EXPECT_TRUE(loadModelWeights(dir.path()).ok()) << loadError(dir.path());

  editWeights(dir, [](Tensors& t) {
    t.values["model.layers.0.self_attn.q_proj.bias"] = std::vector<float>(32, 0.0f);
    t.shapes["model.layers.0.self_attn.q_proj.bias"] = {32};
  });
  EXPECT_THAT(loadError(dir.path()), HasSubstr("tensor model.layers.0.self_attn.q_proj.bias: unexpected"));
}

TEST(ModelLoaderTest, MissingOrBadConfig) {
  ScratchDir dir;
  ASSERT_TRUE(writeModelDir(dir.path(), *makeRandomWeights(smallConfig(), 1), DType::kF32).ok());
  std::filesystem::remove(dir.file("config.json"));
  auto weights = loadModelWeights(dir.path());
  ASSERT_FALSE(weights.ok());
  EXPECT_TRUE(absl::IsNotFound(weights.status()));
  EXPECT_THAT(std::string(weights.status().message()), HasSubstr(dir.file("config.json") + ": cannot open"));

  testing::writeText(dir.file("config.json"), "{\"vocab_size\": 100,,}");
  EXPECT_THAT(loadError(dir.path()), HasSubstr(dir.file("config.json") + ": invalid JSON"));

  testing::writeText(dir.file("config.json"), R"({"vocab_size": 100, "hidden_size": 16})");
  EXPECT_THAT(loadError(dir.path()), HasSubstr("config.json: intermediate_size: required field is missing"));
}

TEST(ModelLoaderTest, MissingWeightsFile) {
  ScratchDir dir;
  testing::writeText(dir.file("config.json"), modelConfigToJson(smallConfig()));
  testing::writeText(dir.file("pytorch_model.bin"), "pickle");
  std::string error = loadError(dir.path());
  EXPECT_THAT(error, HasSubstr("no weights: looked for model.safetensors and model.safetensors.index.json"));
  EXPECT_THAT(error, HasSubstr("pytorch_model.bin is not supported"));
}

TEST(ModelLoaderTest, ShardedCheckpoint) {
  ScratchDir dir;
  auto original = makeRandomWeights(smallConfig(), 3);
  ASSERT_TRUE(writeModelDir(dir.path(), *original, DType::kF32).ok());
  // Split into two shards the way transformers names them, plus the index.
  Tensors all = readAll(dir.file("model.safetensors"));
  std::filesystem::remove(dir.file("model.safetensors"));
  Tensors first, second;
  std::string weight_map;
  for (const auto& [name, values] : all.values) {
    const bool in_first = name.starts_with("model.layers.0.") || name.starts_with("model.embed");
    Tensors& shard = in_first ? first : second;
    shard.values[name] = values;
    shard.shapes[name] = all.shapes[name];
    weight_map += std::string(weight_map.empty() ? "" : ",") + "\"" + name + "\": \"" +
                  (in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors") + "\"";
  }
  writeAll(dir.file("model-00001-of-00002.safetensors"), first);
  writeAll(dir.file("model-00002-of-00002.safetensors"), second);
  testing::writeText(dir.file("model.safetensors.index.json"),
                     R"({"metadata": {"total_size": 1}, "weight_map": {)" + weight_map + "}}");
  auto loaded = loadModelWeights(dir.path());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  expectEqualWeights(**loaded, *original);

  // An index that points at the wrong shard is caught, naming both.
  testing::writeText(dir.file("model.safetensors.index.json"),
                     R"({"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}})");
  EXPECT_THAT(loadError(dir.path()),
              HasSubstr("tensor model.norm.weight is listed in model-00001-of-00002.safetensors, "
                        "which does not contain it"));
  // A tensor absent from the index is missing, named against the index file.
  testing::writeText(dir.file("model.safetensors.index.json"),
                     R"({"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}})");
  EXPECT_THAT(loadError(dir.path()),
              HasSubstr("model.safetensors.index.json: tensor model.embed_tokens.weight: missing"));
  testing::writeText(dir.file("model.safetensors.index.json"),
                     R"({"weight_map": {"model.norm.weight": "../elsewhere.safetensors"}})");
  EXPECT_THAT(loadError(dir.path()), HasSubstr("is not a file name in the model directory"));
}

TEST(ModelLoaderTest, WriteRejectsInconsistentWeights) {
  ScratchDir dir;
  auto weights = makeRandomWeights(smallConfig(), 1);
  weights->layers[1].wv.pop_back();
  auto status = writeModelDir(dir.path(), *weights, DType::kF32);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("tensor model.layers.1.self_attn.v_proj.weight: shape [16, 16]"));
}

}  // namespace
}  // namespace tandem::engine
