#include "engine/model/tensor_parallel.h"

#include <algorithm>
#include <functional>
#include <string_view>
#include <thread>
#include <utility>

#include "engine/backend/cpu/cpu_backend.h"
#include "src/common/strings.h"

namespace tandem::engine {
namespace {

// Rows [begin, begin + count) of w [?, cols].
std::vector<float> sliceRows(const std::vector<float>& w, int64_t cols, int64_t begin, int64_t count) {
  const auto first = w.begin() + begin * cols;
  return std::vector<float>(first, first + count * cols);
}

// Columns [begin, begin + count) of w [rows, cols], as [rows, count].
std::vector<float> sliceColumns(const std::vector<float>& w, int64_t cols, int64_t begin, int64_t count) {
  const int64_t rows = static_cast<int64_t>(w.size()) / cols;
  std::vector<float> out;
  out.reserve(static_cast<size_t>(rows * count));
  for (int64_t r = 0; r < rows; ++r) {
    const auto first = w.begin() + r * cols + begin;
    out.insert(out.end(), first, first + count);
  }
  return out;
}

absl::Status checkDivisible(int value, std::string_view name, int world) {
  if (value % world == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      strCat("tensor parallel: ", name, " (", value, ") is not divisible by the world size ", world));
}

}  // namespace

absl::Status checkShardable(const ModelConfig& c, int world) {
  if (world < 1) return absl::InvalidArgumentError(strCat("tensor parallel: world size must be >= 1, got ", world));
  TANDEM_RETURN_IF_ERROR(checkDivisible(c.num_heads, "num_attention_heads", world));
  TANDEM_RETURN_IF_ERROR(checkDivisible(c.num_kv_heads, "num_key_value_heads", world));
  return checkDivisible(c.intermediate_size, "intermediate_size", world);
}

absl::Status checkShard(const ModelConfig& c, int rank, int world) {
  TANDEM_RETURN_IF_ERROR(checkShardable(c, world));
  if (rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(strCat("tensor parallel: rank ", rank, " is outside [0, ", world, ")"));
  }
  return absl::OkStatus();
}

ModelConfig shardConfig(const ModelConfig& full, int world) {
  ModelConfig s = full;
  s.num_heads = full.num_heads / world;
  s.num_kv_heads = full.num_kv_heads / world;
  s.intermediate_size = full.intermediate_size / world;
  return s;
}

LayerWeights shardLayer(const LayerWeights& l, const ModelConfig& c, int rank, int world) {
  const ModelConfig s = shardConfig(c, world);
  const int64_t hidden = c.hidden_size;
  const int64_t q_begin = static_cast<int64_t>(rank) * s.qDim();  // this rank's query features
  const int64_t kv_begin = static_cast<int64_t>(rank) * s.kvDim();
  const int64_t i_begin = static_cast<int64_t>(rank) * s.intermediate_size;
  LayerWeights o;
  o.attn_norm = l.attn_norm;
  o.ffn_norm = l.ffn_norm;
  o.wq = sliceRows(l.wq, hidden, q_begin, s.qDim());
  o.wk = sliceRows(l.wk, hidden, kv_begin, s.kvDim());
  o.wv = sliceRows(l.wv, hidden, kv_begin, s.kvDim());
  o.wo = sliceColumns(l.wo, c.qDim(), q_begin, s.qDim());
  o.w_gate = sliceRows(l.w_gate, hidden, i_begin, s.intermediate_size);
  o.w_up = sliceRows(l.w_up, hidden, i_begin, s.intermediate_size);
  o.w_down = sliceColumns(l.w_down, c.intermediate_size, i_begin, s.intermediate_size);
  if (!l.bq.empty()) o.bq = sliceRows(l.bq, 1, q_begin, s.qDim());
  if (!l.bk.empty()) o.bk = sliceRows(l.bk, 1, kv_begin, s.kvDim());
  if (!l.bv.empty()) o.bv = sliceRows(l.bv, 1, kv_begin, s.kvDim());
  // Qwen3's q/k norms weigh each head's head_dim features alike: replicated.
  o.q_norm = l.q_norm;
  o.k_norm = l.k_norm;
  return o;
}

absl::StatusOr<ModelWeights> shardWeights(const ModelWeights& full, int rank, int world) {
  const ModelConfig& c = full.config;
  TANDEM_RETURN_IF_ERROR(checkShard(c, rank, world));
  if (full.layers.size() != static_cast<size_t>(c.num_layers)) {
    return absl::InvalidArgumentError(
        strCat("tensor parallel: model weights have ", full.layers.size(), " layers, config has ", c.num_layers));
  }
  ModelWeights shard;
  shard.config = shardConfig(c, world);
  shard.embed = full.embed;
  shard.final_norm = full.final_norm;
  shard.lm_head = full.lm_head;  // empty when tied: the shard reads its own embed copy then
  for (const LayerWeights& l : full.layers) shard.layers.push_back(shardLayer(l, c, rank, world));
  return shard;
}

InProcessAllReduce::InProcessAllReduce(int world) : world_(world), inputs_(static_cast<size_t>(world), nullptr) {}

void InProcessAllReduce::allReduce(int rank, float* data, int64_t n) {
  absl::MutexLock lock(&mu_);
  const uint64_t generation = generation_;
  inputs_[static_cast<size_t>(rank)] = data;
  if (arrived_ == 0) n_ = n;
  if (++arrived_ == world_) {
    // The last rank to arrive sums for everyone; the others are waiting, so
    // their buffers hold their partials and nobody writes them.
    sum_.assign(inputs_[0], inputs_[0] + n_);
    for (int r = 1; r < world_; ++r) {
      const float* in = inputs_[static_cast<size_t>(r)];
      for (int64_t i = 0; i < n_; ++i) sum_[static_cast<size_t>(i)] += in[i];
    }
    arrived_ = 0;
    ++generation_;
    done_cv_.SignalAll();
  } else {
    while (generation_ == generation) done_cv_.Wait(&mu_);
  }
  std::copy(sum_.begin(), sum_.begin() + n, data);
}

struct TensorParallelModel::Rank {
  std::shared_ptr<const ModelWeights> weights;
  CpuBackend backend;
  std::unique_ptr<LlamaModel> model;
  KvStorage kv;
  std::vector<float> logits;  // [num_want_logits, vocab] of the last forward()
  absl::Status status;        // of the last forward()

  Rank(std::shared_ptr<const ModelWeights> w, const TensorParallelOptions& options)
      : weights(std::move(w)),
        backend(CpuBackendOptions{.num_threads = options.backend_threads}),
        kv(kvLayoutFor(weights->config, options.num_blocks, options.block_size)) {}
};

TensorParallelModel::TensorParallelModel(ModelConfig config, int world)
    : config_(std::move(config)), all_reduce_(world) {}

TensorParallelModel::~TensorParallelModel() = default;

absl::StatusOr<std::unique_ptr<TensorParallelModel>> TensorParallelModel::create(
    const ModelWeights& full, const TensorParallelOptions& options) {
  if (options.num_blocks <= 0 || options.block_size <= 0) {
    return absl::InvalidArgumentError(strCat("tensor parallel: the KV cache needs positive num_blocks and block_size, got ",
                                             options.num_blocks, " and ", options.block_size));
  }
  // Every shard first: a bad world size fails here, before anything is sized by it.
  std::vector<std::shared_ptr<const ModelWeights>> shards;
  for (int r = 0; r < std::max(options.world, 1); ++r) {
    TANDEM_ASSIGN_OR_RETURN(ModelWeights shard, shardWeights(full, r, options.world));
    shards.push_back(std::make_shared<const ModelWeights>(std::move(shard)));
  }
  std::unique_ptr<TensorParallelModel> tp(new TensorParallelModel(full.config, options.world));
  for (int r = 0; r < options.world; ++r) {
    auto rank = std::make_unique<Rank>(std::move(shards[static_cast<size_t>(r)]), options);
    InProcessAllReduce* all_reduce = &tp->all_reduce_;
    TANDEM_ASSIGN_OR_RETURN(rank->model,
                            LlamaModel::create(rank->weights, rank->backend, [all_reduce, r](float* partial, int64_t n) {
                              all_reduce->allReduce(r, partial, n);
                            }));
    tp->ranks_.push_back(std::move(rank));
  }
  return tp;
}

const ModelConfig& TensorParallelModel::shardConfig(int rank) const {
  return ranks_[static_cast<size_t>(rank)]->model->config();
}

const std::vector<float>& TensorParallelModel::rankLogits(int rank) const {
  return ranks_[static_cast<size_t>(rank)]->logits;
}

const KvStorage& TensorParallelModel::kv(int rank) const { return ranks_[static_cast<size_t>(rank)]->kv; }

absl::Status TensorParallelModel::forward(std::span<const SequenceChunk> batch, std::vector<float>* logits) {
  auto run = [batch](Rank& rank) { rank.status = rank.model->forward(batch, rank.kv, &rank.logits); };
  // Ranks 1.. on their own threads, rank 0 on the caller's.
  std::vector<std::thread> threads;
  for (size_t r = 1; r < ranks_.size(); ++r) threads.emplace_back(run, std::ref(*ranks_[r]));
  run(*ranks_[0]);
  for (std::thread& t : threads) t.join();
  for (const auto& rank : ranks_) TANDEM_RETURN_IF_ERROR(rank->status);
  if (logits != nullptr) *logits = ranks_[0]->logits;
  return absl::OkStatus();
}

}  // namespace tandem::engine
