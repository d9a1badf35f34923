#pragma once
// CpuBackend's paged causal attention (Backend::attention), vectorised and
// spread over a WorkerPool.
//
// The algorithm, per (row, query head): keys are taken in *blocks* of 64
// consecutive positions aligned to position 0 (block b holds [64b, 64b + 64)),
// and the softmax is computed online (flash-attention style) in base 2:
//   s   = (q * scale * log2 e) . k for the block's keys: sequential FMAs over
//         head_dim, one key per SIMD lane; -inf past the row's position
//   if some s > m + 8 (always on the first block, m = -inf):
//         m' = max(m, max(s)), a = 2^(m - m'), l = l * a, o = o * a, m = m'
//         (otherwise m stays: weights up to 2^8 are harmless in fp32, and
//         skipping the max reduction and the rescale saves most of the
//         softmax's cost)
//   p   = 2^(s - m) (0 past the row's position);  l += p  (16 lanes)
//   o  += sum_j p_j v_j, j in key order
//   out = o / l, l's lanes summed in a fixed tree
// 2^x is a polynomial evaluated with FMAs (paged_attention_kernel.inc), not
// libm. Which blocks a row visits and how many keys of each it sees depend
// only on its position, and every step is a fixed sequence of lane-wise
// operations; so a row's bits depend only on its query, its position and the
// cached KV — not on the chunk, the batch, the rows it is processed with, or
// the thread that runs it (backend.h's determinism contract). Rows are
// grouped only to reuse each packed key block and to overlap FMA chains; on
// the causal diagonal a group skips the 16-key tiles none of its rows sees,
// which would only add weights of exactly 0.
//
// Work: items of up to a few dozen rows x one KV head's query heads, spread
// over the pool, longest first. A prefill chunk's keys are first packed once
// per KV head (transposed for the score loop) by parallel packing tasks;
// single-row items (decodes) pack their keys themselves.
//
// SIMD levels: the same code is compiled for AVX-512, AVX2+FMA and portable
// C++ (std::fma). They use the same fused operations and the same reduction
// trees, so all levels give bitwise-identical results (a test checks this on
// the levels the test machine supports); the portable level is slow on CPUs
// without FMA, where std::fma is emulated in software.
//
// Not thread-safe: one thread calls run() at a time (it owns scratch).

#include <cstdint>
#include <span>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/simd.h"
#include "engine/backend/cpu/worker_pool.h"
#include "engine/kv/kv_storage.h"

namespace tandem::engine {

class PagedAttention {
 public:
  // Runs on `pool` (not owned; outlives this). The level is resolveSimdLevel(simd).
  PagedAttention(SimdLevel simd, WorkerPool* pool);

  // Backend::attention, with the same contract.
  void run(int32_t layer, const float* q, std::span<const ChunkDesc> chunks, const KvStorage& kv,
           const AttentionShape& shape, float* out);

  SimdLevel simdLevel() const { return simd_; }

 private:
  // One unit of parallel work: rows [row_begin, row_end) of chunk `chunk`,
  // for the query heads of KV heads [kv_head, kv_head + num_kv_heads).
  struct Item {
    int32_t chunk = 0;
    int32_t kv_head = 0;
    int32_t num_kv_heads = 1;
    int32_t row_begin = 0;
    int32_t row_end = 0;
  };
  // Packing key blocks [first_block, first_block + num_blocks) of a chunk's KV head.
  struct PackTask {
    int32_t chunk = 0;
    int32_t kv_head = 0;
    int32_t first_block = 0;
    int32_t num_blocks = 0;
  };
  struct ChunkInfo {
    size_t first_block = 0;         // into block_bases_
    size_t packed_offset = 0;       // into packed_, where packed_head_floats > 0
    size_t packed_head_floats = 0;  // per KV head; 0: items pack for themselves
  };
  // What planItems found: the work (query vectors x key tiles, to decide
  // whether to go parallel) and the floats of packed keys it needs.
  struct Plan {
    int64_t work = 0;
    size_t packed_floats = 0;
  };

  // Fills chunk_info_, block_bases_, items_ and pack_tasks_ for one call.
  Plan planItems(int32_t layer, std::span<const ChunkDesc> chunks, const KvStorage& kv, const AttentionShape& shape);
  // Merges the heads of self-packing chunks into one item where there are
  // enough items to share out, then sorts items_ most expensive first.
  void orderItems(std::span<const ChunkDesc> chunks, const AttentionShape& shape);

  SimdLevel simd_;
  WorkerPool* pool_;
  // Per call, reused (no allocation once warmed up).
  std::vector<ChunkInfo> chunk_info_;
  std::vector<const std::byte*> block_bases_;  // layer block base of every block each chunk reads
  std::vector<Item> items_;                // most expensive first
  std::vector<PackTask> pack_tasks_;
  std::vector<float> packed_;                // keys of shared chunks, packed once: [chunk][kv_head][key block]
  std::vector<float> zeros_;                 // [head_dim]
  std::vector<std::vector<float>> scratch_;  // one per pool thread
  std::vector<std::vector<float>> widen_;    // one per pool thread: a bf16 pool's keys widened to fp32
};

}  // namespace tandem::engine
