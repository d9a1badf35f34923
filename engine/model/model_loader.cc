#include "engine/model/model_loader.h"

#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <system_error>

#include <nlohmann/json.hpp>

#include "engine/model/files.h"
#include "engine/model/tensor_parallel.h"
#include "engine/model/tokenizer.h"
#include "src/common/strings.h"

namespace tandem::engine {
namespace {

constexpr std::string_view kConfigFile = "config.json";
constexpr std::string_view kWeightsFile = "model.safetensors";
constexpr std::string_view kIndexFile = "model.safetensors.index.json";
constexpr std::string_view kTokenizerConfigFile = "tokenizer_config.json";

std::string join(std::string_view dir, std::string_view file) { return strCat(dir, "/", file); }

std::string layerName(int layer, std::string_view suffix) { return strCat("model.layers.", layer, ".", suffix); }

// Where each tensor lives: one model.safetensors, or the shards named by
// model.safetensors.index.json.
class Checkpoint {
 public:
  static absl::StatusOr<Checkpoint> open(const std::string& dir) {
    Checkpoint c;
    const std::string single = join(dir, kWeightsFile);
    const std::string index = join(dir, kIndexFile);
    if (fileExists(single)) {
      c.source_ = single;
      TANDEM_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(single));
      for (const std::string& name : file->tensorNames()) c.where_[name] = file.get();
      c.files_.push_back(std::move(file));
      return c;
    }
    if (fileExists(index)) {
      c.source_ = index;
      TANDEM_RETURN_IF_ERROR(c.openShards(dir, index));
      return c;
    }
    std::string hint;
    if (fileExists(join(dir, "pytorch_model.bin")))
      hint = " (pytorch_model.bin is not supported; convert to safetensors)";
    return absl::NotFoundError(strCat(dir, ": no weights: looked for ", kWeightsFile, " and ", kIndexFile, hint));
  }

  // Names the checkpoint in messages about tensors it lacks.
  const std::string& source() const { return source_; }
  bool has(const std::string& name) const { return where_.contains(name); }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [name, file] : where_) out.push_back(name);
    return out;
  }

  absl::StatusOr<std::vector<float>> read(const std::string& name, std::span<const int64_t> shape) const {
    auto it = where_.find(name);
    if (it == where_.end()) return absl::NotFoundError(strCat(source_, ": tensor ", name, ": missing"));
    return it->second->readFloat32(name, shape);
  }

 private:
  absl::Status openShards(const std::string& dir, const std::string& index) {
    TANDEM_ASSIGN_OR_RETURN(std::string text, readFile(index));
    auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError(strCat(index, ": invalid JSON"));
    auto map = j.find("weight_map");
    if (map == j.end() || !map->is_object()) {
      return absl::InvalidArgumentError(strCat(index, ": weight_map: missing or not an object"));
    }
    std::map<std::string, SafetensorsFile*> shards;
    for (const auto& [name, shard] : map->items()) {
      if (!shard.is_string())
        return absl::InvalidArgumentError(strCat(index, ": weight_map: ", name, ": expected a file name"));
      const auto& shard_name = shard.get_ref<const std::string&>();
      // A shard is a file in this directory; anything else is not a checkpoint we wrote or trust.
      if (shard_name.empty() || shard_name.find('/') != std::string::npos || shard_name == "..") {
        return absl::InvalidArgumentError(strCat(index, ": weight_map: ", name, ": shard \"", shard_name,
                                                 "\" is not a file name in the model directory"));
      }
      auto it = shards.find(shard_name);
      if (it == shards.end()) {
        TANDEM_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(join(dir, shard_name)));
        it = shards.emplace(shard_name, file.get()).first;
        files_.push_back(std::move(file));
      }
      if (it->second->find(name) == nullptr) {
        return absl::InvalidArgumentError(
            strCat(index, ": weight_map: tensor ", name, " is listed in ", shard_name, ", which does not contain it"));
      }
      where_[name] = it->second;
    }
    return absl::OkStatus();
  }

  std::string source_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
};

// Calls f(name, shape, tensor) for every tensor the engine reads, in a
// fixed order; `w` is a ModelWeights (loading) or a const one (writing), with
// layers already sized to the config. Shapes come from the config.
// `after_layer(i)`, when given, runs once layer i's tensors are done.
template <typename W, typename F>
void forEachTensor(W& w, F&& f, const std::function<void(int)>& after_layer = nullptr) {
  const ModelConfig& c = w.config;
  const int64_t hidden = c.hidden_size, vocab = c.vocab_size, inter = c.intermediate_size;
  const int64_t q = c.qDim(), kv = c.kvDim();
  f(std::string("model.embed_tokens.weight"), std::vector<int64_t>{vocab, hidden}, w.embed);
  for (int i = 0; i < c.num_layers; ++i) {
    auto& l = w.layers[static_cast<size_t>(i)];
    f(layerName(i, "input_layernorm.weight"), std::vector<int64_t>{hidden}, l.attn_norm);
    f(layerName(i, "self_attn.q_proj.weight"), std::vector<int64_t>{q, hidden}, l.wq);
    f(layerName(i, "self_attn.k_proj.weight"), std::vector<int64_t>{kv, hidden}, l.wk);
    f(layerName(i, "self_attn.v_proj.weight"), std::vector<int64_t>{kv, hidden}, l.wv);
    f(layerName(i, "self_attn.o_proj.weight"), std::vector<int64_t>{hidden, q}, l.wo);
    if (c.arch().qkv_bias) {  // Qwen2
      f(layerName(i, "self_attn.q_proj.bias"), std::vector<int64_t>{q}, l.bq);
      f(layerName(i, "self_attn.k_proj.bias"), std::vector<int64_t>{kv}, l.bk);
      f(layerName(i, "self_attn.v_proj.bias"), std::vector<int64_t>{kv}, l.bv);
    }
    if (c.arch().qk_norm) {  // Qwen3
      f(layerName(i, "self_attn.q_norm.weight"), std::vector<int64_t>{c.head_dim}, l.q_norm);
      f(layerName(i, "self_attn.k_norm.weight"), std::vector<int64_t>{c.head_dim}, l.k_norm);
    }
    f(layerName(i, "post_attention_layernorm.weight"), std::vector<int64_t>{hidden}, l.ffn_norm);
    f(layerName(i, "mlp.gate_proj.weight"), std::vector<int64_t>{inter, hidden}, l.w_gate);
    f(layerName(i, "mlp.up_proj.weight"), std::vector<int64_t>{inter, hidden}, l.w_up);
    f(layerName(i, "mlp.down_proj.weight"), std::vector<int64_t>{hidden, inter}, l.w_down);
    if (after_layer) after_layer(i);
  }
  f(std::string("model.norm.weight"), std::vector<int64_t>{hidden}, w.final_norm);
  if (!c.tie_word_embeddings) f(std::string("lm_head.weight"), std::vector<int64_t>{vocab, hidden}, w.lm_head);
}

absl::Status rejectUnknownTensors(const Checkpoint& checkpoint, const std::set<std::string>& expected) {
  for (const std::string& name : checkpoint.names()) {
    // lm_head.weight may sit in a tied checkpoint; Hugging Face ignores it too.
    if (expected.contains(name) || name == "lm_head.weight" || name.ends_with(".rotary_emb.inv_freq")) continue;
    return absl::InvalidArgumentError(strCat(checkpoint.source(), ": tensor ", name,
                                             ": unexpected for this config (biases, extra layers and other "
                                             "architectures are not supported)"));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// loadModelWeights with the directory's `config` (loadModelConfig),
// calling `after_layer(i, weights)` once layer i is read.
absl::StatusOr<std::unique_ptr<ModelWeights>> load(const std::string& model_dir, const ModelConfig& config,
                                                   const std::function<void(int, ModelWeights&)>& after_layer) {
  const std::string config_path = join(model_dir, kConfigFile);  // for messages
  auto weights = std::make_unique<ModelWeights>();
  weights->config = config;

  TANDEM_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::open(model_dir));
  weights->layers.resize(static_cast<size_t>(weights->config.num_layers));

  std::set<std::string> expected;
  forEachTensor(*weights, [&](const std::string& name, const std::vector<int64_t>&, std::vector<float>&) {
    expected.insert(name);
  });
  TANDEM_RETURN_IF_ERROR(rejectUnknownTensors(checkpoint, expected));

  absl::Status status;
  forEachTensor(
      *weights,
      [&](const std::string& name, const std::vector<int64_t>& shape, std::vector<float>& dest) {
        if (!status.ok()) return;
        if (name == "lm_head.weight" && !checkpoint.has(name)) {
          status = absl::NotFoundError(
              strCat(checkpoint.source(), ": tensor lm_head.weight: missing, and ", config_path,
                     " has tie_word_embeddings false (true would use the embedding as the output projection)"));
          return;
        }
        auto values = checkpoint.read(name, shape);
        if (!values.ok()) {
          status = values.status();
          return;
        }
        dest = std::move(values).value();
      },
      [&](int layer) {
        if (status.ok() && after_layer) after_layer(layer, *weights);
      });
  TANDEM_RETURN_IF_ERROR(status);
  return weights;
}

}  // namespace

absl::StatusOr<ModelConfig> loadModelConfig(const std::string& model_dir) {
  const std::string config_path = join(model_dir, kConfigFile);
  TANDEM_ASSIGN_OR_RETURN(std::string config_text, readFile(config_path));
  return parseModelConfig(config_text, config_path);
}

absl::StatusOr<std::unique_ptr<ModelWeights>> loadModelWeights(const std::string& model_dir) {
  TANDEM_ASSIGN_OR_RETURN(const ModelConfig config, loadModelConfig(model_dir));
  return load(model_dir, config, nullptr);
}

absl::StatusOr<std::unique_ptr<ModelWeights>> loadModelShard(const std::string& model_dir, int rank, int world) {
  // The config first: a model that does not split fails before any tensor is read.
  TANDEM_ASSIGN_OR_RETURN(const ModelConfig config, loadModelConfig(model_dir));
  TANDEM_RETURN_IF_ERROR(checkShard(config, rank, world));
  std::vector<LayerWeights> shard_layers(static_cast<size_t>(config.num_layers));
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights,
                          load(model_dir, config, [&](int layer, ModelWeights& w) {
                            // This layer's slices, then the whole layer goes.
                            LayerWeights& full = w.layers[static_cast<size_t>(layer)];
                            shard_layers[static_cast<size_t>(layer)] = shardLayer(full, w.config, rank, world);
                            full = LayerWeights{};
                          }));
  weights->layers = std::move(shard_layers);
  weights->config = shardConfig(weights->config, world);
  return weights;
}

absl::Status writeModelDir(const std::string& dir, const ModelWeights& weights, DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError(strCat(dir, ": model dtype must be F32 or BF16, got ", dtypeName(dtype)));
  }
  const ModelConfig& config = weights.config;
  if (weights.layers.size() != static_cast<size_t>(config.num_layers)) {
    return absl::InvalidArgumentError(
        strCat(dir, ": weights have ", weights.layers.size(), " layers, config says ", config.num_layers));
  }
  if (!config.tie_word_embeddings && weights.lm_head.empty()) {
    return absl::InvalidArgumentError(strCat(dir, ": lm_head is empty but tie_word_embeddings is false"));
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::FailedPreconditionError(strCat(dir, ": cannot create directory: ", ec.message()));

  std::vector<TensorToWrite> tensors;
  forEachTensor(weights, [&](const std::string& name, const std::vector<int64_t>& shape, const std::vector<float>& v) {
    tensors.push_back({name, shape, std::span<const float>(v)});
  });

  ModelConfig written = config;
  written.torch_dtype = dtype == DType::kBF16 ? "bfloat16" : "float32";
  TANDEM_RETURN_IF_ERROR(writeSafetensors(join(dir, kWeightsFile), tensors, dtype));
  TANDEM_RETURN_IF_ERROR(writeFileAtomically(join(dir, kConfigFile), modelConfigToJson(written)));
  TANDEM_RETURN_IF_ERROR(writeFileAtomically(join(dir, kTokenizerConfigFile), byteTokenizerConfigJson()));
  return absl::OkStatus();
}

}  // namespace tandem::engine
