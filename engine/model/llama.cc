#include "engine/model/llama.h"

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>

#include <absl/cleanup/cleanup.h>

#include "engine/backend/kernel_math.h"
#include "src/common/strings.h"

namespace tandem::engine {
namespace {

size_t product(int64_t a, int64_t b) { return static_cast<size_t>(a) * static_cast<size_t>(b); }

absl::Status checkSize(const std::vector<float>& t, size_t want, std::string_view name) {
  if (t.size() == want) return absl::OkStatus();
  return absl::InvalidArgumentError(
      strCat("model weights: ", name, " has ", t.size(), " floats, config implies ", want));
}

}  // namespace

KvLayout kvLayoutFor(const ModelConfig& config, int num_blocks, int block_size, KvDtype dtype) {
  KvLayout layout;
  layout.dtype = dtype;
  layout.num_layers = config.num_layers;
  layout.num_blocks = num_blocks;
  layout.block_size = block_size;
  layout.num_kv_heads = config.num_kv_heads;
  layout.head_dim = config.head_dim;
  return layout;
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::create(std::shared_ptr<const ModelWeights> weights,
                                                               Backend& backend, AllReducePartials all_reduce) {
  if (weights == nullptr) return absl::InvalidArgumentError("model weights: null");
  const ModelConfig& c = weights->config;
  if (c.num_layers <= 0 || c.hidden_size <= 0 || c.intermediate_size <= 0 || c.vocab_size <= 0 || c.num_heads <= 0 ||
      c.num_kv_heads <= 0 || c.head_dim <= 0) {
    return absl::InvalidArgumentError("model config: layer count, widths, heads and vocab must all be positive");
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(strCat("model config: num_key_value_heads (", c.num_kv_heads,
                                             ") must divide num_attention_heads (", c.num_heads, ")"));
  }
  if (c.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(strCat("model config: head_dim must be even for RoPE, got ", c.head_dim));
  }
  const ArchSpec* arch = findArchSpec(c.architecture);
  if (arch == nullptr) {
    return absl::InvalidArgumentError(strCat("model config: unsupported architecture ", c.architecture,
                                             " (supported: ", supportedArchitectures(), ")"));
  }
  const size_t hidden = static_cast<size_t>(c.hidden_size);
  TANDEM_RETURN_IF_ERROR(checkSize(weights->embed, product(c.vocab_size, c.hidden_size), "embed_tokens"));
  TANDEM_RETURN_IF_ERROR(checkSize(weights->final_norm, hidden, "norm"));
  TANDEM_RETURN_IF_ERROR(checkSize(weights->outputProjection(), product(c.vocab_size, c.hidden_size), "lm_head"));
  if (weights->layers.size() != static_cast<size_t>(c.num_layers)) {
    return absl::InvalidArgumentError(
        strCat("model weights: ", weights->layers.size(), " layers, config has ", c.num_layers));
  }
  for (size_t i = 0; i < weights->layers.size(); ++i) {
    const LayerWeights& l = weights->layers[i];
    const std::string p = strCat("layers.", i, ".");
    TANDEM_RETURN_IF_ERROR(checkSize(l.attn_norm, hidden, p + "input_layernorm"));
    TANDEM_RETURN_IF_ERROR(checkSize(l.wq, product(c.qDim(), c.hidden_size), p + "q_proj"));
    TANDEM_RETURN_IF_ERROR(checkSize(l.wk, product(c.kvDim(), c.hidden_size), p + "k_proj"));
    TANDEM_RETURN_IF_ERROR(checkSize(l.wv, product(c.kvDim(), c.hidden_size), p + "v_proj"));
    TANDEM_RETURN_IF_ERROR(checkSize(l.wo, product(c.hidden_size, c.qDim()), p + "o_proj"));
    TANDEM_RETURN_IF_ERROR(checkSize(l.ffn_norm, hidden, p + "post_attention_layernorm"));
    TANDEM_RETURN_IF_ERROR(checkSize(l.w_gate, product(c.intermediate_size, c.hidden_size), p + "gate_proj"));
    TANDEM_RETURN_IF_ERROR(checkSize(l.w_up, product(c.intermediate_size, c.hidden_size), p + "up_proj"));
    TANDEM_RETURN_IF_ERROR(checkSize(l.w_down, product(c.hidden_size, c.intermediate_size), p + "down_proj"));
    // The architecture's extra tensors: present exactly when it has them.
    const size_t q_bias = arch->qkv_bias ? static_cast<size_t>(c.qDim()) : 0;
    const size_t kv_bias = arch->qkv_bias ? static_cast<size_t>(c.kvDim()) : 0;
    const size_t qk_norm = arch->qk_norm ? static_cast<size_t>(c.head_dim) : 0;
    TANDEM_RETURN_IF_ERROR(checkSize(l.bq, q_bias, p + "q_proj.bias"));
    TANDEM_RETURN_IF_ERROR(checkSize(l.bk, kv_bias, p + "k_proj.bias"));
    TANDEM_RETURN_IF_ERROR(checkSize(l.bv, kv_bias, p + "v_proj.bias"));
    TANDEM_RETURN_IF_ERROR(checkSize(l.q_norm, qk_norm, p + "q_norm"));
    TANDEM_RETURN_IF_ERROR(checkSize(l.k_norm, qk_norm, p + "k_norm"));
  }
  std::unique_ptr<LlamaModel> model(new LlamaModel(std::move(weights), backend, std::move(all_reduce)));
  // A device backend that could not take the weights (out of memory) says why.
  bool resident = model->embed_ != nullptr && model->final_norm_ != nullptr;
  for (const LayerResident& l : model->resident_) {
    resident = resident && l.attn_norm != nullptr && l.ffn_norm != nullptr &&
               (!arch->qkv_bias || (l.bq != nullptr && l.bk != nullptr && l.bv != nullptr)) &&
               (!arch->qk_norm || (l.q_norm != nullptr && l.k_norm != nullptr));
  }
  TANDEM_RETURN_IF_ERROR(backend.status());
  if (!resident) return absl::ResourceExhaustedError("the backend could not hold the model's weights");
  return model;
}

LlamaModel::LlamaModel(std::shared_ptr<const ModelWeights> weights, Backend& backend, AllReducePartials all_reduce)
    : weights_(std::move(weights)),
      backend_(backend),
      all_reduce_(std::move(all_reduce)),
      arch_(weights_->config.arch()),
      rope_inv_freq_(ropeInverseFrequencies(weights_->config)) {
  const ModelConfig& c = weights_->config;
  for (const LayerWeights& l : weights_->layers) {
    projections_.push_back({.wq = backend_.prepareWeight(l.wq.data(), c.qDim(), c.hidden_size),
                            .wk = backend_.prepareWeight(l.wk.data(), c.kvDim(), c.hidden_size),
                            .wv = backend_.prepareWeight(l.wv.data(), c.kvDim(), c.hidden_size),
                            .wo = backend_.prepareWeight(l.wo.data(), c.hidden_size, c.qDim()),
                            .w_gate = backend_.prepareWeight(l.w_gate.data(), c.intermediate_size, c.hidden_size),
                            .w_up = backend_.prepareWeight(l.w_up.data(), c.intermediate_size, c.hidden_size),
                            .w_down = backend_.prepareWeight(l.w_down.data(), c.hidden_size, c.intermediate_size)});
  }
  lm_head_ = backend_.prepareWeight(weights_->outputProjection().data(), c.vocab_size, c.hidden_size);
  auto resident = [&](const std::vector<float>& w) {
    return w.empty() ? nullptr : backend_.residentWeight(w);
  };
  for (const LayerWeights& l : weights_->layers) {
    resident_.push_back(LayerResident{.attn_norm = resident(l.attn_norm),
                                      .ffn_norm = resident(l.ffn_norm),
                                      .bq = resident(l.bq),
                                      .bk = resident(l.bk),
                                      .bv = resident(l.bv),
                                      .q_norm = resident(l.q_norm),
                                      .k_norm = resident(l.k_norm)});
  }
  embed_ = backend_.prepareEmbedding(weights_->embed, c.hidden_size);
  final_norm_ = resident(weights_->final_norm);
}

float* LlamaModel::Activation::grow(Backend& backend, size_t floats) {
  if (!buffer_ || buffer_->floats() < floats) {
    // By half again at least (a device allocation is not cheap); freed
    // before the larger one is allocated.
    const size_t grown = buffer_ ? std::max(floats, buffer_->floats() + buffer_->floats() / 2) : floats;
    buffer_.reset();
    buffer_ = backend.allocate(grown);
  }
  return buffer_ ? buffer_->data() : nullptr;
}

absl::Status LlamaModel::validate(std::span<const SequenceChunk> batch, const KvStorage& kv,
                                  const std::vector<float>* logits) const {
  const ModelConfig& c = config();
  const KvLayout& layout = kv.layout();
  if (layout.num_layers != c.num_layers || layout.num_kv_heads != c.num_kv_heads || layout.head_dim != c.head_dim) {
    return absl::InvalidArgumentError(strCat("kv cache layout (", layout.num_layers, " layers, ", layout.num_kv_heads,
                                             " kv heads, head_dim ", layout.head_dim, ") does not match the model (",
                                             c.num_layers, ", ", c.num_kv_heads, ", ", c.head_dim, ")"));
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    const SequenceChunk& chunk = batch[i];
    const std::string where = strCat("chunk ", i, ": ");
    if (chunk.tokens.empty()) return absl::InvalidArgumentError(where + "no tokens");
    if (chunk.start_pos < 0) return absl::InvalidArgumentError(strCat(where, "negative start_pos ", chunk.start_pos));
    const int64_t end = static_cast<int64_t>(chunk.start_pos) + static_cast<int64_t>(chunk.tokens.size());
    if (c.max_position_embeddings > 0 && end > c.max_position_embeddings) {
      return absl::InvalidArgumentError(
          strCat(where, "position ", end - 1, " is beyond max_position_embeddings (", c.max_position_embeddings, ")"));
    }
    for (size_t t = 0; t < chunk.tokens.size(); ++t) {
      if (chunk.tokens[t] < 0 || chunk.tokens[t] >= c.vocab_size) {
        return absl::InvalidArgumentError(strCat(where, "token ", t, " has id ", chunk.tokens[t],
                                                 ", outside the vocabulary [0, ", c.vocab_size, ")"));
      }
    }
    const int64_t blocks_needed = (end + layout.block_size - 1) / layout.block_size;
    if (static_cast<int64_t>(chunk.block_table.size()) < blocks_needed) {
      return absl::InvalidArgumentError(strCat(where, "block table has ", chunk.block_table.size(),
                                               " blocks, positions [0, ", end, ") need ", blocks_needed,
                                               " of block_size ", layout.block_size));
    }
    for (int64_t b = 0; b < blocks_needed; ++b) {
      const int32_t id = chunk.block_table[static_cast<size_t>(b)].value();
      if (id < 0 || id >= layout.num_blocks) {
        return absl::InvalidArgumentError(strCat(where, "block table entry ", b, " is block ", id,
                                                 ", outside the cache's [0, ", layout.num_blocks, ")"));
      }
    }
    if (chunk.want_logits && logits == nullptr && !skip_logits_) {
      return absl::InvalidArgumentError(where + "wants logits but no logits output was given");
    }
  }
  return absl::OkStatus();
}

int32_t LlamaModel::prepareBatch(std::span<const SequenceChunk> batch) {
  chunks_.clear();
  tail_chunks_.clear();
  positions_.clear();
  tokens_.clear();
  logit_rows_.clear();
  int32_t rows = 0;
  for (const SequenceChunk& chunk : batch) {
    const auto n = static_cast<int32_t>(chunk.tokens.size());
    chunks_.push_back(
        ChunkDesc{.row_begin = rows, .num_rows = n, .start_pos = chunk.start_pos, .block_table = chunk.block_table});
    for (int32_t t = 0; t < n; ++t) {
      positions_.push_back(chunk.start_pos + t);
      tokens_.push_back(chunk.tokens[static_cast<size_t>(t)]);
    }
    if (chunk.want_logits) {
      const auto tail = static_cast<int32_t>(logit_rows_.size());
      logit_rows_.push_back(rows + n - 1);
      tail_chunks_.push_back(ChunkDesc{
          .row_begin = tail, .num_rows = 1, .start_pos = chunk.start_pos + n - 1, .block_table = chunk.block_table});
    }
    rows += n;
  }
  return rows;
}

void LlamaModel::padBatch(int32_t rows) {
  for (auto r = static_cast<int32_t>(positions_.size()); r < rows; ++r) {
    chunks_.push_back(ChunkDesc{.row_begin = r, .num_rows = 1, .start_pos = 0, .block_table = {}});
    tail_chunks_.push_back(ChunkDesc{.row_begin = r, .num_rows = 1, .start_pos = 0, .block_table = {}});
    positions_.push_back(0);
    tokens_.push_back(0);
    logit_rows_.push_back(r);
  }
}

void LlamaModel::queryKeyValue(int layer, int32_t rows) {
  const ModelConfig& c = config();
  const LayerResident& w = resident_[static_cast<size_t>(layer)];
  const LayerProjections& p = projections_[static_cast<size_t>(layer)];
  const Backend::GemmOut qkv[] = {{p.wq.get(), q_.data()}, {p.wk.get(), k_.data()}, {p.wv.get(), v_.data()}};
  backend_.gemmSharedInput(h_.data(), qkv, rows);
  if (arch_.qkv_bias) {  // Qwen2
    backend_.addBias(q_.data(), w.bq->data(), rows, c.qDim());
    backend_.addBias(k_.data(), w.bk->data(), rows, c.kvDim());
    backend_.addBias(v_.data(), w.bv->data(), rows, c.kvDim());
  }
  if (arch_.qk_norm) {  // Qwen3: every head's vector normed over head_dim, before RoPE
    backend_.rmsNorm(q_.data(), w.q_norm->data(), q_.data(), rows * c.num_heads, c.head_dim, c.rms_norm_eps);
    backend_.rmsNorm(k_.data(), w.k_norm->data(), k_.data(), rows * c.num_kv_heads, c.head_dim, c.rms_norm_eps);
  }
  backend_.rope(q_.data(), rows, c.num_heads, c.head_dim, positions_.data(), rope_inv_freq_);
  backend_.rope(k_.data(), rows, c.num_kv_heads, c.head_dim, positions_.data(), rope_inv_freq_);
}

void LlamaModel::finishLayer(int layer, const float* q, float* x, std::span<const ChunkDesc> chunks, int32_t rows,
                             const KvStorage& kv) {
  const ModelConfig& c = config();
  const LayerResident& w = resident_[static_cast<size_t>(layer)];
  const LayerProjections& p = projections_[static_cast<size_t>(layer)];
  const AttentionShape shape{.num_heads = c.num_heads, .num_kv_heads = c.num_kv_heads, .head_dim = c.head_dim};
  backend_.attention(layer, q, chunks, kv, shape, attn_.data());
  addProjection(attn_.data(), *p.wo, x, rows);  // x += attn · Woᵀ
  backend_.rmsNorm(x, w.ffn_norm->data(), h_.data(), rows, c.hidden_size, c.rms_norm_eps);
  const Backend::GemmOut gate_up[] = {{p.w_gate.get(), gate_.data()}, {p.w_up.get(), up_.data()}};
  backend_.gemmSharedInput(h_.data(), gate_up, rows);
  backend_.swiglu(gate_.data(), up_.data(), gate_.data(), static_cast<int64_t>(rows) * c.intermediate_size);
  addProjection(gate_.data(), *p.w_down, x, rows);  // x += swiglu · W_downᵀ
}

void LlamaModel::addProjection(const float* in, const PreparedWeight& w, float* x, int32_t rows) {
  if (!all_reduce_) {
    // Residual adds are folded into the GEMMs (accumulate).
    backend_.gemm(in, w, x, rows, /*accumulate=*/true);
    return;
  }
  // Tensor parallel: this rank's product is a partial sum, so it must be
  // summed across ranks before it meets the residual stream, which every rank
  // holds whole.
  const int64_t n = static_cast<int64_t>(rows) * config().hidden_size;
  backend_.gemm(in, w, partial_.data(), rows, /*accumulate=*/false);
  all_reduce_(partial_.data(), n);
  backend_.add(x, partial_.data(), n);
}

absl::Status LlamaModel::forward(std::span<const SequenceChunk> batch, KvStorage& kv, std::vector<float>* logits,
                                 const LayerObserver* on_layer, const Sampling* sampling) {
  TANDEM_RETURN_IF_ERROR(validate(batch, kv, logits));
  if (logits != nullptr) logits->clear();
  if (batch.empty()) return absl::OkStatus();

  const ModelConfig& c = config();
  int32_t rows = prepareBatch(batch);
  auto num_logits = static_cast<int32_t>(logit_rows_.size());
  if (sampling != nullptr && !backend_.samplesLogits()) sampling = nullptr;
  if (sampling != nullptr &&
      (sampling->params.size() != static_cast<size_t>(num_logits) ||
       sampling->uniforms.size() != static_cast<size_t>(num_logits) ||
       sampling->tokens.size() != static_cast<size_t>(num_logits))) {
    return absl::InvalidArgumentError(strCat("forward: sampling is for ", sampling->params.size(), " rows, ",
                                             sampling->uniforms.size(), " draws and ", sampling->tokens.size(),
                                             " tokens; the batch has ", num_logits, " chunks that want logits"));
  }
  // A decode step may be padded to the backend's bucket (Backend::beginStep).
  int32_t max_position = 0;
  for (int32_t p : positions_) max_position = std::max(max_position, p);
  const bool decode = num_logits == rows && (on_layer == nullptr || !*on_layer) && !all_reduce_ && !skip_logits_;
  const int32_t step_rows = backend_.beginStep(
      {.rows = rows, .decode = decode, .max_position = max_position, .samples = sampling != nullptr});
  const absl::Cleanup end_step = [&] { backend_.endStep(); };
  const int32_t real_logits = num_logits;
  if (step_rows > rows) {
    padBatch(step_rows);
    rows = step_rows;
    num_logits = step_rows;
    if (sampling != nullptr) {
      pad_params_.assign(sampling->params.begin(), sampling->params.end());
      pad_params_.resize(static_cast<size_t>(rows), SamplingParams{.temperature = 0.0f});  // greedy
      pad_uniforms_.assign(sampling->uniforms.begin(), sampling->uniforms.end());
      pad_uniforms_.resize(static_cast<size_t>(rows));
      pad_tokens_.assign(static_cast<size_t>(rows), 0);
    }
  }
  // Grown (old buffers freed) before the step's first call: a graph step
  // (KernelBackend) defers its launches from then on.
  x_.grow(backend_, product(rows, c.hidden_size));
  h_.grow(backend_, product(rows, c.hidden_size));
  q_.grow(backend_, product(rows, c.qDim()));
  k_.grow(backend_, product(rows, c.kvDim()));
  v_.grow(backend_, product(rows, c.kvDim()));
  attn_.grow(backend_, product(rows, c.qDim()));
  gate_.grow(backend_, product(rows, c.intermediate_size));
  up_.grow(backend_, product(rows, c.intermediate_size));
  if (all_reduce_) partial_.grow(backend_, product(rows, c.hidden_size));
  tail_x_.grow(backend_, product(num_logits, c.hidden_size));
  tail_q_.grow(backend_, product(num_logits, c.qDim()));
  for (const Activation* a : {&x_, &h_, &q_, &k_, &v_, &attn_, &gate_, &up_, &tail_x_, &tail_q_, &partial_}) {
    if (a->data() == nullptr && (a != &partial_ || all_reduce_)) {
      TANDEM_RETURN_IF_ERROR(backend_.status());
      return absl::ResourceExhaustedError("the backend could not allocate the step's activations");
    }
  }

  backend_.embed(*embed_, tokens_.data(), rows, x_.data());
  for (int layer = 0; layer < c.num_layers; ++layer) {
    const LayerResident& w = resident_[static_cast<size_t>(layer)];
    backend_.rmsNorm(x_.data(), w.attn_norm->data(), h_.data(), rows, c.hidden_size, c.rms_norm_eps);
    queryKeyValue(layer, rows);
    backend_.writeKv(layer, k_.data(), v_.data(), chunks_, kv);
    if (on_layer != nullptr && *on_layer) (*on_layer)(layer);

    if (layer + 1 < c.num_layers) {
      finishLayer(layer, q_.data(), x_.data(), chunks_, rows, kv);
    } else if (num_logits > 0) {
      // After the last layer only the rows that produce logits are read, so
      // the last layer's attention and MLP run for those rows alone. Each row
      // is computed exactly as it would be in the full batch (backend.h).
      backend_.gatherRows(x_.data(), logit_rows_.data(), num_logits, c.hidden_size, tail_x_.data());
      backend_.gatherRows(q_.data(), logit_rows_.data(), num_logits, c.qDim(), tail_q_.data());
      finishLayer(layer, tail_q_.data(), tail_x_.data(), tail_chunks_, num_logits, kv);
    }
  }
  if (num_logits == 0 || skip_logits_) return backend_.status();

  backend_.rmsNorm(tail_x_.data(), final_norm_->data(), h_.data(), num_logits, c.hidden_size, c.rms_norm_eps);
  if (sampling != nullptr && num_logits > real_logits) {
    backend_.sampleLogits(h_.data(), *lm_head_, num_logits, pad_params_, pad_uniforms_, pad_tokens_);
    std::copy_n(pad_tokens_.begin(), real_logits, sampling->tokens.begin());
    return backend_.status();
  }
  if (sampling != nullptr) {
    backend_.sampleLogits(h_.data(), *lm_head_, num_logits, sampling->params, sampling->uniforms, sampling->tokens);
    return backend_.status();
  }
  logits->resize(product(num_logits, c.vocab_size));
  backend_.logits(h_.data(), *lm_head_, logits->data(), num_logits);
  logits->resize(product(real_logits, c.vocab_size));  // without the padding rows'
  return backend_.status();
}

}  // namespace tandem::engine
