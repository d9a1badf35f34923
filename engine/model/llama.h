#pragma once
// The Llama decoder forward pass over a batch of sequence chunks, on a Backend,
// reading and writing a paged KV cache.
//
// One forward pass serves every supported family (model_config.h): the
// config's ArchSpec, fixed at create(), adds q/k/v biases (Qwen2) or q/k
// RMSNorm per head (Qwen3) in queryKeyValue(), and RoPE rotates by the
// config's inverse frequencies (plain, or rope_scaling llama3). Everything
// else is Llama's.
//
// One forward() is one engine step: any mix of prefill chunks and single-token
// decodes. All the step's tokens go through each projection together as one
// [total_tokens, hidden] GEMM (that is where CPU throughput comes from);
// attention is per chunk against the paged cache.
//
// Determinism: a token's hidden states and logits are bitwise the same however
// the step is composed (chunk sizes, other sequences in the batch, which
// physical blocks hold its KV), because every Backend call computes each row
// independently of the others (backend.h). Tests hold the engine to it.
//
// Not thread-safe: the engine thread owns the model (it keeps scratch buffers).
// The weights are shared read-only and may back several models.
//
// Tensor parallelism (tensor_parallel.h): given an AllReducePartials, the
// model is one rank's shard. Its o_proj and down_proj products are partial
// sums over the rank's heads / intermediate slice; each goes into a scratch
// buffer, the hook sums it across ranks, and only then is it added to the
// residual stream. Without one (the default) the residual adds stay folded
// into the GEMMs, exactly as before.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/kv/kv_storage.h"
#include "engine/model/weights.h"
#include "src/common/ids.h"
#include "src/common/status.h"

namespace tandem::engine {

// The KV cache layout that `config`'s model reads and writes.
KvLayout kvLayoutFor(const ModelConfig& config, int num_blocks, int block_size, KvDtype dtype = KvDtype::kFloat32);

// Called with layer l (0, 1, ..., num_layers - 1, in order) once layer l's K/V
// of the whole batch is in the cache; the P/D transport announces layers as
// they finish. Runs on the engine thread, inside forward(): keep it short.
using LayerObserver = std::function<void(int layer)>;

// Replaces partial[0, n) — one rank's [rows, hidden] share of a row-parallel
// projection — with the sum of every rank's partial, the same bits on every
// rank. Called by each rank's model at the same points of forward(), twice per
// layer computed (after attention and after the MLP), from that rank's thread.
// `partial` is backend memory: host memory with the host backends, which
// InProcessAllReduce reads (tensor parallelism runs on those); an NCCL
// all-reduce on a GPU would take the device buffer.
using AllReducePartials = std::function<void(float* partial, int64_t n)>;

struct SequenceChunk {
  std::span<const TokenId> tokens;       // tokens computed this step (non-empty)
  int32_t start_pos = 0;                 // position of tokens[0]; KV for [0, start_pos) is already in the cache
  std::span<const BlockId> block_table;  // covers positions [0, start_pos + tokens.size())
  bool want_logits = false;              // return logits for the chunk's last token
};

class LlamaModel {
 public:
  // Checks that every weight tensor has the size `weights->config` implies,
  // and prepares the projections in the backend's layout (Backend::
  // prepareWeight: for the CPU backend a packed copy, so the model holds its
  // projection weights twice). The backend must outlive the model.
  // `all_reduce` makes the model a tensor-parallel rank (see above); weights
  // then hold that rank's shard (shardWeights) and its config the shard's heads.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<LlamaModel>> create(std::shared_ptr<const ModelWeights> weights,
                                                                          Backend& backend,
                                                                          AllReducePartials all_reduce = nullptr);

  const ModelConfig& config() const { return weights_->config; }

  // For a tensor-parallel rank whose logits nobody reads (ranks 1..N-1 of a
  // group across processes, rank_group.h): forward() still runs the last
  // layer for the rows that want logits (their all-reduces are the
  // group's), writes the same KV, but stops before the final norm and
  // lm_head; `logits` may then be null, and is left empty.
  void skipLogits() { skip_logits_ = true; }

  // Runs one step. Writes the K/V of every token of `batch` into `kv` (at the
  // slots its block table maps its positions to) and, for each chunk with
  // want_logits, appends that chunk's last-token logits to *logits, which is
  // resized to [num_want_logits, vocab] in batch order.
  // Returns InvalidArgument, before touching `kv`, for: an empty chunk, a
  // negative start_pos, a position >= max_position_embeddings, a token id
  // outside [0, vocab), a block table too short or naming a block outside the
  // cache, a cache whose layout does not match the model, or logits == nullptr
  // while some chunk wants logits.
  // Precondition (not checked): no two chunks of one batch write the same slot.
  // An empty batch is OK and does nothing.
  // With `sampling`, on a backend that samplesLogits(): the rows are sampled
  // where the logits are made (Backend::sampleLogits), sampling->tokens gets
  // one token per chunk that wants logits, in batch order, and `logits`
  // stays empty. On another backend `sampling` is ignored.
  struct Sampling {
    std::span<const SamplingParams> params;  // one per chunk that wants logits
    std::span<const double> uniforms;
    std::span<TokenId> tokens;
  };
  [[nodiscard]] absl::Status forward(std::span<const SequenceChunk> batch, KvStorage& kv, std::vector<float>* logits,
                                     const LayerObserver* on_layer = nullptr, const Sampling* sampling = nullptr);

 private:
  LlamaModel(std::shared_ptr<const ModelWeights> weights, Backend& backend, AllReducePartials all_reduce);

  absl::Status validate(std::span<const SequenceChunk> batch, const KvStorage& kv,
                        const std::vector<float>* logits) const;
  // Fills chunks_, positions_, tokens_ and logit_rows_ for the batch; returns the total token count.
  int32_t prepareBatch(std::span<const SequenceChunk> batch);
  // Pads a decode step's metadata to `rows` rows (Backend::beginStep's padding rows).
  void padBatch(int32_t rows);
  // q_, k_, v_ of `rows` rows from the normed input h_: projections, the
  // architecture's biases and q/k norms, and RoPE of q and k.
  void queryKeyValue(int layer, int32_t rows);
  // Attention (reading the cache), output projection and MLP of one layer for
  // `rows` rows: q [rows, num_heads * head_dim] rotated queries, x [rows, hidden]
  // residual stream, updated in place.
  void finishLayer(int layer, const float* q, float* x, std::span<const ChunkDesc> chunks, int32_t rows,
                   const KvStorage& kv);
  // x [rows, hidden] += in · wᵀ, with `in` [rows, w's in_features]: folded into
  // the GEMM, or (tensor parallel) summed across ranks first.
  void addProjection(const float* in, const PreparedWeight& w, float* x, int32_t rows);

  std::shared_ptr<const ModelWeights> weights_;
  Backend& backend_;
  AllReducePartials all_reduce_;      // null: not tensor parallel
  bool skip_logits_ = false;          // skipLogits()
  const ArchSpec& arch_;              // config().arch(), checked known by create()
  std::vector<float> rope_inv_freq_;  // [head_dim / 2] ropeInverseFrequencies(config())
  // The projections in the backend's layout, made once by create().
  struct LayerProjections {
    std::unique_ptr<PreparedWeight> wq, wk, wv, wo, w_gate, w_up, w_down;
  };
  std::vector<LayerProjections> projections_;  // [num_layers]
  std::unique_ptr<PreparedWeight> lm_head_;
  // The weights the calls read as they are, in backend memory (on the host
  // backends, the host tensors themselves). Biases and q/k norms are null
  // where the architecture has none.
  struct LayerResident {
    std::unique_ptr<BackendBuffer> attn_norm, ffn_norm, bq, bk, bv, q_norm, k_norm;
  };
  std::vector<LayerResident> resident_;  // [num_layers]
  std::unique_ptr<EmbeddingTable> embed_;  // bf16 with bf16 projections (Backend::prepareEmbedding)
  std::unique_ptr<BackendBuffer> final_norm_;

  // Per-step metadata (host) and activations (backend memory), grown on
  // demand and reused so a warmed-up model does not allocate per step.
  std::vector<ChunkDesc> chunks_;       // [batch] rows of each chunk in the step's buffers
  std::vector<ChunkDesc> tail_chunks_;  // [num_want_logits] the last row of each chunk wanting logits
  std::vector<int32_t> positions_;      // [total_tokens] absolute position of each row
  std::vector<int32_t> tokens_;         // [total_tokens] token id of each row
  std::vector<int32_t> logit_rows_;     // [num_want_logits] row of each chunk's last token
  // A padded decode step's sampling inputs and tokens (padding rows greedy).
  std::vector<SamplingParams> pad_params_;
  std::vector<double> pad_uniforms_;
  std::vector<TokenId> pad_tokens_;
  // An activation buffer of at least `floats` floats (its data() for this step).
  class Activation {
   public:
    float* grow(Backend& backend, size_t floats);
    float* data() const { return buffer_ ? buffer_->data() : nullptr; }

   private:
    std::unique_ptr<BackendBuffer> buffer_;
  };
  Activation x_;        // [total_tokens, hidden] residual stream
  Activation h_;        // [total_tokens, hidden] normed input of a block
  Activation q_;        // [total_tokens, num_heads * head_dim]
  Activation k_;        // [total_tokens, num_kv_heads * head_dim]
  Activation v_;        // [total_tokens, num_kv_heads * head_dim]
  Activation attn_;     // [total_tokens, num_heads * head_dim]
  Activation gate_;     // [total_tokens, intermediate]
  Activation up_;       // [total_tokens, intermediate]
  Activation partial_;  // [total_tokens, hidden] this rank's o_proj / down_proj share (TP only)
  Activation tail_x_;   // [num_want_logits, hidden] residual rows the last layer still needs
  Activation tail_q_;   // [num_want_logits, num_heads * head_dim] their queries
};

}  // namespace tandem::engine
