#pragma once
// The compute a Llama forward pass needs, as one interface the model calls.
//
// The CPU backend (cpu/cpu_backend.h) is the reference and what tests run; a
// CUDA backend implements the same calls later. So the interface passes raw
// pointers and sizes (pointer + length spans), never containers: every float*
// is *backend memory* (allocate() and residentWeight() below; host memory for
// the CPU backend, device memory for a GPU one), except where a parameter
// says "host". Small per-step metadata (chunk descriptors, positions, row
// indices) is always host memory; a device backend uploads it. The kernel
// backend (cuda/kernel_backend.h) refuses a float* that is not backend
// memory, so the model's use of the contract is checked on the CPU.
//
// Matrices are row-major. Weights use Hugging Face's layout [out, in], so a
// projection is y = x · Wᵀ.
//
// Determinism contract: every output row of every call is a function of that
// row's inputs only (and, for attention, of the KV it reads), computed with the
// same operation order however many other rows share the call. The engine
// relies on it: chunked prefill, one-shot prefill and any batch composition
// give bitwise-identical hidden states and logits.
//
// Not thread-safe: one engine thread owns a backend and calls it serially.

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/kernel_math.h"
#include "engine/kv/kv_storage.h"
#include "engine/sched/request.h"
#include "src/common/block_hash.h"
#include "src/common/ids.h"

namespace tandem::engine {

// One sequence's slice of a batched step, as kernels see it. Rows of the
// step's activation buffers are grouped by chunk: this chunk owns rows
// [row_begin, row_begin + num_rows), holding positions start_pos, start_pos+1, ...
struct ChunkDesc {
  int32_t row_begin = 0;
  int32_t num_rows = 0;
  int32_t start_pos = 0;                 // position of row row_begin; KV of [0, start_pos) is already cached
  std::span<const BlockId> block_table;  // host; covers positions [0, start_pos + num_rows)
};

// Cumulative counters since construction or the last resetStats(). The
// times are wall time (steady_clock) inside the calls, so a forward pass's
// time splits into GEMMs, attention, the element-wise kernels and the rest
// (the model's own bookkeeping).
struct BackendStats {
  int64_t gemm_calls = 0;
  std::chrono::nanoseconds gemm_time{0};  // inside gemm() and logits()
  double gemm_flops = 0;                  // 2·m·n·k summed over calls (requested shapes, not padding)
  std::chrono::nanoseconds attention_time{0};    // inside attention()
  std::chrono::nanoseconds elementwise_time{0};  // inside rmsNorm, rope, swiglu, gatherRows and writeKv
  // Decode steps run as graphs (KernelBackend's CUDA graphs): captured (a
  // new graph, then run), replayed, and left (a launch differed, so the
  // step ran launch by launch). Not reset by resetStats(). Zero elsewhere.
  int64_t graph_steps_captured = 0;
  int64_t graph_steps_replayed = 0;
  int64_t graph_steps_left = 0;
};

// Shape of multi-head attention with grouped-query KV heads.
struct AttentionShape {
  int32_t num_heads = 0;     // query heads
  int32_t num_kv_heads = 0;  // divides num_heads
  int32_t head_dim = 0;
};

// What a backend's GEMMs with prepared weights (every projection and the LM
// head) read. kFloat32: fp32 weights and inputs. kBfloat16: the weights
// kept in bf16 (half the memory; exact for a bf16 checkpoint, which is
// widened to fp32 on load) and each GEMM's input rounded to bf16 (ties to
// even), multiplied and accumulated in fp32 into an fp32 output; the
// residual stream, norms, attention and sampling stay fp32. The CPU backend
// multiplies the same bf16 values in fp32 (the GPU's tensor cores may add
// them in another order), so it is the reference for the CUDA backend in
// either mode.
enum class GemmDtype { kFloat32, kBfloat16 };
// "float32" / "bfloat16" (the agent's --dtype).
inline const char* gemmDtypeName(GemmDtype dtype) { return dtype == GemmDtype::kBfloat16 ? "bfloat16" : "float32"; }

// `values` rounded to bf16 (nearest even, kmath::bf16Bits): what a device
// keeps of a bf16 weight or embedding table.
inline std::vector<uint16_t> bf16Values(std::span<const float> values) {
  std::vector<uint16_t> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = kmath::bf16Bits(values[i]);
  return out;
}

// A weight matrix w[n, k] in a backend's own layout, made once by
// Backend::prepareWeight (packed for the CPU GEMM; on a GPU, uploaded).
// Immutable; usable only with the backend that made it.
class PreparedWeight {
 public:
  PreparedWeight(int32_t n, int32_t k) : n_(n), k_(k) {}
  virtual ~PreparedWeight() = default;
  int32_t n() const { return n_; }
  int32_t k() const { return k_; }

 private:
  int32_t n_;
  int32_t k_;
};

// Backend memory the model holds: its activations, and the host weights the
// calls read as they are (norms, biases, the embedding table). Host memory
// on the CPU backends; device memory on a GPU backend, where the host never
// dereferences data(). Freed with the buffer.
class BackendBuffer {
 public:
  virtual ~BackendBuffer() = default;
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;
  float* data() const { return data_; }
  size_t floats() const { return floats_; }

 protected:
  BackendBuffer(float* data, size_t floats) : data_(data), floats_(floats) {}

 private:
  float* data_;
  size_t floats_;
};

// The token embedding table [rows, dim] in a backend's memory, made once by
// Backend::prepareEmbedding and read by Backend::embed: fp32, or with bf16
// projections (GemmDtype::kBfloat16) each value rounded to bf16 and kept in
// 2 bytes. Immutable; usable only with the backend that made it.
class EmbeddingTable {
 public:
  EmbeddingTable(int32_t rows, int32_t dim, bool bf16) : rows_(rows), dim_(dim), bf16_(bf16) {}
  virtual ~EmbeddingTable() = default;
  int32_t rows() const { return rows_; }
  int32_t dim() const { return dim_; }
  bool bf16() const { return bf16_; }
  // What the table takes in the backend's memory.
  size_t bytes() const {
    return static_cast<size_t>(rows_) * static_cast<size_t>(dim_) * (bf16_ ? sizeof(uint16_t) : sizeof(float));
  }

 private:
  int32_t rows_, dim_;
  bool bf16_;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // `floats` floats of backend memory (activations), contents undefined.
  virtual std::unique_ptr<BackendBuffer> allocate(size_t floats) = 0;

  // `host` as backend memory the calls read (a weight used as it is, not
  // prepared): the host memory itself on the host backends (no copy; it
  // must outlive the buffer), a device copy on a GPU backend.
  virtual std::unique_ptr<BackendBuffer> residentWeight(std::span<const float> host) = 0;

  // x[i] += y[i] for i < n: a tensor-parallel rank adds the all-reduced
  // partial sums to its residual stream. x and y must not overlap.
  virtual void add(float* x, const float* y, int64_t n) = 0;

  // The weight w (host, row-major [n, k]) in this backend's layout, for
  // gemm() and logits() below. The model prepares its projections once at
  // load. n, k > 0.
  virtual std::unique_ptr<PreparedWeight> prepareWeight(const float* w, int32_t n, int32_t k) = 0;

  // y[m, n] = x[m, k] · w[n, k]ᵀ, or y += x · wᵀ when `accumulate`, with
  // (n, k) = (w.n(), w.k()). x and y must not overlap. m > 0.
  virtual void gemm(const float* x, const PreparedWeight& w, float* y, int32_t m, bool accumulate) = 0;

  // One input, several prepared weights of the same k: outs[i].y = x ·
  // outs[i].wᵀ, none accumulating (the q/k/v projections, gate and up).
  // The same results as gemm() on each; a backend that converts the input
  // first (bf16 projections) converts it once for all of them.
  struct GemmOut {
    const PreparedWeight* w;
    float* y;
  };
  virtual void gemmSharedInput(const float* x, std::span<const GemmOut> outs, int32_t m) {
    for (const GemmOut& o : outs) gemm(x, *o.w, o.y, m, /*accumulate=*/false);
  }

  // The same with a plain w (prepared on every call: for tests and one-off
  // products). Bitwise the same as the prepared form. m, n, k > 0.
  virtual void gemm(const float* x, const float* w, float* y, int32_t m, int32_t n, int32_t k, bool accumulate) = 0;

  // out[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) * weight, for each of `rows` rows of width `dim`.
  // out may equal x.
  virtual void rmsNorm(const float* x, const float* weight, float* out, int32_t rows, int32_t dim, float eps) = 0;

  // Rotates x [rows, num_heads * head_dim] in place, row r at position positions[r] (host, [rows]):
  // dimension i with i + head_dim/2 by the angle positions[r] * inv_freq[i] (inv_freq host,
  // [head_dim / 2]; ropeInverseFrequencies in model_config.h makes it from rope_theta and
  // rope_scaling). See kernel_math.h for the convention (HF rotate_half). head_dim is even.
  virtual void rope(float* x, int32_t rows, int32_t num_heads, int32_t head_dim, const int32_t* positions,
                    std::span<const float> inv_freq) = 0;

  // y[r, :] += bias for each of `rows` rows of width `dim` (a projection's bias, e.g. Qwen2's q/k/v).
  virtual void addBias(float* y, const float* bias, int32_t rows, int32_t dim) = 0;

  // out[i] = silu(gate[i]) * up[i] for i < n. out may equal gate or up.
  virtual void swiglu(const float* gate, const float* up, float* out, int64_t n) = 0;

  // dst[r, :] = src[rows[r], :] for r < num_rows; rows (host) index src's rows, width `dim`.
  // Picking the rows that need logits.
  virtual void gatherRows(const float* src, const int32_t* rows, int32_t num_rows, int32_t dim, float* dst) = 0;

  // The embedding table `table` ([table.size() / dim, dim], host) for
  // embed(): as it is (fp32), or where this backend runs bf16 projections
  // (GemmDtype::kBfloat16) every value rounded to bf16 (nearest even):
  // exact for a table a bf16 checkpoint held. A GPU backend keeps a bf16
  // table in 2 bytes a value (half the device memory); the CPU backend
  // reads the host table itself (it must outlive the EmbeddingTable) and
  // rounds the rows it reads. nullptr when the backend cannot hold it
  // (status() says why).
  virtual std::unique_ptr<EmbeddingTable> prepareEmbedding(std::span<const float> table, int32_t dim) = 0;
  // The embedding lookup: dst[r, :] = row tokens[r] of `table`, as fp32, for
  // r < n; tokens (host) are valid row indices; dst [n, table.dim()].
  virtual void embed(const EmbeddingTable& table, const int32_t* tokens, int32_t n, float* dst) = 0;

  // Scatters K and V of layer `layer` into the paged cache: row r of chunk c
  // (position p = start_pos + r) goes to block block_table[p / block_size],
  // slot p % block_size. k, v: [num_rows_total, num_kv_heads * head_dim].
  // Precondition: the block tables cover every written position, and no slot is
  // written twice in one call.
  virtual void writeKv(int32_t layer, const float* k, const float* v, std::span<const ChunkDesc> chunks,
                       KvStorage& kv) = 0;

  // Copies every layer of block `src` into block `dst` of the cache
  // (copy-on-write of a shared partial block). A device backend's cache
  // lives in device memory, so the engine copies through the backend.
  virtual void copyKvBlock(KvStorage& kv, BlockId src, BlockId dst) = 0;

  // Copies host.size() bytes at byte `offset` of the KV pool to `host`
  // (download) or from it (upload): the engine stages a pool in device
  // memory through host memory a transport can read and write
  // (EngineOptions::kv_staging). On a host pool, plain copies. A device
  // backend may queue them: they are done when finishKvCopies() returns (the
  // host side is not to be read or changed before), and many cost one wait.
  virtual void downloadKv(const KvStorage& kv, size_t offset, std::span<std::byte> host) {
    std::memcpy(host.data(), kv.bytes().data() + offset, host.size());
  }
  virtual void uploadKv(KvStorage& kv, size_t offset, std::span<const std::byte> host) {
    std::memcpy(kv.bytes().data() + offset, host.data(), host.size());
  }
  virtual void finishKvCopies() {}

  // The checksum of each layer block in `items` (layerBlockChecksum,
  // src/common/block_hash.h) into out[i] (out.size() == items.size()),
  // computed where the pool is: for a pool a transport reads in device
  // memory (EngineOptions::kv_direct), on the device in one launch, after
  // the launches queued before it (stream order), and `out` is filled when
  // it returns (a failure: status()). On a host pool, on the host.
  virtual void checksumKv(const KvStorage& kv, std::span<const KvLayerBlock> items, std::span<uint64_t> out) {
    for (size_t i = 0; i < items.size(); ++i) {
      out[i] =
          layerBlockChecksum({kv.layerBlockBytes(items[i].layer, items[i].block), kv.layout().bytesPerLayerBlock()});
    }
  }

  // Page-locks host memory the KV copies above use (the staging copy) so a
  // GPU copies it directly and asynchronously, until unpinKvHost(p). Not
  // needed for correctness: an error means the copies stay staged through
  // the driver's own buffers. Nothing to do on the CPU.
  virtual absl::Status pinKvHost(std::span<std::byte> host) { return absl::OkStatus(); }
  virtual void unpinKvHost(std::span<std::byte> host) {}

  // Paged causal attention for a batch of chunks (prefill chunks and
  // single-token decodes mixed). q: [num_rows_total, num_heads * head_dim],
  // already rotated; out: same shape. Row r of chunk c attends to positions
  // [0, start_pos + r] of its own sequence, read from the cache (so writeKv of
  // this layer must have run for the chunk's own rows). Query head h reads KV
  // head h / (num_heads / num_kv_heads); scores are scaled by 1/sqrt(head_dim)
  // and softmax is computed with the max subtracted. q and out must not overlap.
  virtual void attention(int32_t layer, const float* q, std::span<const ChunkDesc> chunks, const KvStorage& kv,
                         const AttentionShape& shape, float* out) = 0;

  // The final projection to the vocabulary: logits (host) [m, vocab] =
  // hidden [m, dim] · lm_head[vocab, dim]ᵀ, lm_head prepared with (vocab,
  // dim). Same arithmetic as gemm (and counted in its stats); separate
  // because its output goes to host memory.
  virtual void logits(const float* hidden, const PreparedWeight& lm_head, float* logits_host, int32_t m) = 0;

  // Sampling where the logits are made: a backend whose logits would live in
  // device memory (KernelBackend) computes them there, samples each row there
  // and downloads tokens instead of [m, vocab] floats. Row r uses params[r]
  // and the draw uniforms[r] (its request's SamplerRng::uniform(); 0 when
  // greedy) and gets the CPU sampler's token (sampleTokenWithDraw). Called
  // only where samplesLogits().
  virtual bool samplesLogits() const { return false; }
  virtual void sampleLogits(const float* hidden, const PreparedWeight& lm_head, int32_t m,
                            std::span<const SamplingParams> params, std::span<const double> uniforms,
                            std::span<TokenId> tokens) {}

  // A forward pass brackets its calls with beginStep() and endStep(). A
  // backend that replays captured steps (KernelBackend's CUDA graphs) may
  // pad a decode step to a bucket of rows: beginStep() returns the rows the
  // model must then run, `step.rows` or more. The model gives every padding
  // row a chunk of one row with an empty block table (written nowhere, its
  // attention zeros), token 0 and position 0, and reads nothing from it.
  // The calls between may be deferred: they are done when a download
  // (logits, sampleLogits) returns, or by endStep() (and have failed if
  // status() says so). On the host backends nothing is padded or deferred.
  struct StepShape {
    int32_t rows = 0;          // the batch's rows
    bool decode = false;  // one row per chunk, each wanting logits; no layer observer, no all-reduce
    int32_t max_position = 0;  // the highest position of any row
    bool samples = false;      // ends in sampleLogits (else logits, or nothing)
  };
  virtual int32_t beginStep(const StepShape& step) { return step.rows; }
  virtual void endStep() {}

  virtual BackendStats stats() const = 0;
  virtual void resetStats() = 0;

  // The first failure of a backend that can fail (a device out of memory, a
  // launch refused); the calls do nothing after one. The model's forward
  // pass returns it. Always OK on the CPU backend.
  virtual absl::Status status() const { return absl::OkStatus(); }
};

}  // namespace tandem::engine
