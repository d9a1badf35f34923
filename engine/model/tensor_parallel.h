#pragma once
// Tensor parallelism on the CPU, in-process: a model's heads and MLP split
// across `world` ranks (Megatron-style), each rank a LlamaModel on its own
// thread, backend and KV cache, the ranks' partial sums added by an in-process
// all-reduce. The layout and the model code are what one process per GPU
// with NCCL would run; that transport is not here yet (docs/engine.md,
// "Tensor parallelism (CPU, in-process)").
//
// Rank r of `world` (contiguous splits):
//   q_proj, k_proj, v_proj (and Qwen2's biases): column-parallel, the rows of
//     query heads [r·H/world, (r+1)·H/world) and KV heads [r·KV/world, ...);
//   o_proj: row-parallel, the matching columns; the partial products are
//     all-reduced before the residual add;
//   gate_proj, up_proj: column-parallel, rows [r·I/world, (r+1)·I/world);
//   down_proj: row-parallel, the matching columns, all-reduced likewise;
//   embeddings, every norm (Qwen3's per-head q/k norms included), lm_head:
//     replicated, so the residual stream and the logits are whole on every rank.
// GQA stays right: full query head h reads KV head h / (H/KV); on rank r local
// head h - r·H/world reads local KV head (h - r·H/world) / (H/KV) =
// h / (H/KV) - r·KV/world, i.e. the same KV head, because H/world is a
// multiple of H/KV when KV % world == 0.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "engine/kv/kv_storage.h"
#include "engine/model/llama.h"
#include "engine/model/weights.h"
#include "src/common/status.h"

namespace tandem::engine {

// OK when a model of config `c` splits across `world` ranks (world >= 1
// divides its query heads, KV heads and intermediate size); InvalidArgument
// naming the config field and the world size otherwise.
absl::Status checkShardable(const ModelConfig& c, int world);

// checkShardable, and rank in [0, world) (InvalidArgument naming it).
absl::Status checkShard(const ModelConfig& c, int rank, int world);
// The shard's config: the full model's with num_heads, num_kv_heads and
// intermediate_size divided by `world` (checkShardable must hold).
ModelConfig shardConfig(const ModelConfig& full, int world);
// Rank `rank` of `world`'s share of one layer of a model of config `full`
// (as above; checkShard must hold): what shardWeights does to each layer,
// for a loader that shards layer by layer (loadModelShard).
LayerWeights shardLayer(const LayerWeights& layer, const ModelConfig& full, int rank, int world);

// Rank `rank` of `world`'s shard of `full` (see above). Its config has the
// shard's num_heads, num_kv_heads and intermediate_size; hidden_size,
// head_dim, vocab and the rest are the full model's. InvalidArgument, naming
// the value, when world < 1, rank is outside [0, world), or world does not
// divide the query heads, the KV heads or the intermediate size.
// (world == 1 gives a copy of `full`.)
[[nodiscard]] absl::StatusOr<ModelWeights> shardWeights(const ModelWeights& full, int rank, int world);

// A sum across `world` threads, one per rank. Every rank calls
// allReduce(rank, data, n) with the same n; each returns once all have
// called, with data replaced by data_0 + data_1 + ... + data_{world-1},
// added left to right in rank order, so every rank gets the same bits and
// the result does not depend on thread timing.
// Thread-safe: that is its purpose. Each rank must call it from one thread
// at a time, and all ranks must make the same sequence of calls with the
// same n (not checked; a rank that stops calling leaves the others waiting).
class InProcessAllReduce {
 public:
  explicit InProcessAllReduce(int world);

  int world() const { return world_; }
  void allReduce(int rank, float* data, int64_t n);

 private:
  const int world_;
  absl::Mutex mu_;
  absl::CondVar done_cv_;  // generation_ changed: a call's sum is in sum_
  // The call in progress: each arrived rank's buffer, and how many arrived.
  std::vector<float*> inputs_ ABSL_GUARDED_BY(mu_);  // [world]
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t n_ ABSL_GUARDED_BY(mu_) = 0;
  // Completed calls. A rank reads sum_ before it can arrive at the next call,
  // and the next sum is written only once every rank has arrived there, so
  // one buffer serves every call.
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<float> sum_ ABSL_GUARDED_BY(mu_);  // [n_]
};

struct TensorParallelOptions {
  int world = 2;
  // The KV cache of every rank: this many blocks of block_size tokens, each
  // holding the rank's KV heads only.
  int num_blocks = 64;
  int block_size = 16;
  // Threads of each rank's CpuBackend (results do not depend on it).
  int backend_threads = 1;
};

// `world` ranks of one model: shards, LlamaModels, CpuBackends, KV caches and
// one InProcessAllReduce. forward() runs every rank's forward pass, one
// thread per rank, on the same batch (the same block tables index every
// rank's cache) and returns rank 0's logits; every rank computes the same
// bits (rankLogits). Not thread-safe: one caller drives it, like LlamaModel.
class TensorParallelModel {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<TensorParallelModel>> create(
      const ModelWeights& full, const TensorParallelOptions& options);
  ~TensorParallelModel();

  int world() const { return static_cast<int>(ranks_.size()); }
  // The full model's config (what the caller's batch is checked against).
  const ModelConfig& config() const { return config_; }
  // Rank r's shard config (its heads and intermediate slice).
  const ModelConfig& shardConfig(int rank) const;

  // LlamaModel::forward on every rank; *logits gets rank 0's. The first
  // failing rank's status otherwise (every rank validates the same batch the
  // same way before any all-reduce, so they fail together, not one alone).
  [[nodiscard]] absl::Status forward(std::span<const SequenceChunk> batch, std::vector<float>* logits);

  // Rank r's logits of the last forward() (rank 0's are what forward returned).
  const std::vector<float>& rankLogits(int rank) const;
  // Rank r's KV cache: its KV heads [r·KV/world, (r+1)·KV/world) of every layer.
  const KvStorage& kv(int rank) const;

 private:
  struct Rank;
  TensorParallelModel(ModelConfig config, int world);

  ModelConfig config_;
  InProcessAllReduce all_reduce_;
  std::vector<std::unique_ptr<Rank>> ranks_;  // [world]
};

}  // namespace tandem::engine
