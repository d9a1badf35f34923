#include "engine/backend/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/backend/cpu/simd_vec.h"
#include "engine/backend/kernel_math.h"

// This file is compiled with -ffp-contract=off (engine/backend/CMakeLists.txt):
// every fused multiply-add is an explicit Vec::fma, identical on every level.

namespace tandem::engine {
namespace {

constexpr int32_t kTile = simd_vec::kLanes;  // lanes of a Vec
// Keys per block: the unit of packing and of the softmax state update.
constexpr int32_t kTilesPerBlock = 4;
constexpr int32_t kBlock = kTile * kTilesPerBlock;
constexpr int32_t kMaxQvsAnyLevel = 12;  // the largest kMaxQvs below
// How far above the running max a score may be before the softmax state is
// rescaled (base 2: weights stay below 2^8).
constexpr float kRescaleSlack = 8.0f;
// Query vectors (row x head) per work item: enough for full register
// groups and to read each packed block from L1 many times, few enough that an
// item's softmax state stays in L1/L2 and a prefill chunk splits into many
// items to share out.
constexpr int32_t kQvsPerItem = 96;
// Key blocks per packing task.
constexpr int32_t kBlocksPerPackTask = 4;
// Below this much work (query vectors x key tiles) a call runs on the
// calling thread: waking the pool costs more than it saves.
constexpr int64_t kMinParallelWork = 4096;

// What one work item reads and writes, resolved to plain pointers before the
// vector code runs (see paged_attention_kernel.inc for why).
struct ItemArgs {
  const std::byte* const* blocks = nullptr;  // [blocks of the chunk] layer block base of each block-table entry
  int32_t block_size = 0;
  bool bf16 = false;         // the pool holds bf16 (widened to fp32 as it is packed), not fp32
  size_t token_stride = 0;   // elements between consecutive slots of a block
  size_t value_offset = 0;   // elements from a slot's K to its V
  float* widen = nullptr;    // bf16 pools: [kBlock][head_dim] scratch of the thread
  size_t head_offset = 0;    // first KV head * head_dim
  const float* q = nullptr;  // row 0 of the item: [num_rows][q_width], unscaled
  float* out = nullptr;      // same shape
  size_t q_width = 0;        // num_heads * head_dim
  int32_t first_q_head = 0;  // first KV head * group
  int32_t num_kv_heads = 1;  // KV heads in the item (1 where packed)
  int32_t group = 0;         // query heads per KV head
  int32_t head_dim = 0;
  int32_t head_dim_padded = 0;  // head_dim rounded up to kTile
  int32_t first_pos = 0;        // position of row 0
  int32_t num_rows = 0;
  float q_scale = 0;              // 1/sqrt(head_dim) * log2(e): scores come out in the base-2 domain
  const float* zeros = nullptr;   // [head_dim] zeros: stands in for keys past the chunk
  const float* packed = nullptr;  // the chunk's KV head already packed (packBlocks), or null: pack per item
  float* scratch = nullptr;       // ItemScratch::floats(num_rows * group * num_kv_heads, ...) floats
};

// Floats of one packed key block: kt [head_dim][kBlock], then v [kBlock][dp].
inline size_t packedBlockFloats(int32_t head_dim, int32_t dp) {
  return static_cast<size_t>(head_dim) * kBlock + static_cast<size_t>(kBlock) * static_cast<size_t>(dp);
}

// The scratch of one item, carved out of one float buffer.
struct ItemScratch {
  float* q;   // [num_qvs][dp] scaled queries
  float* o;   // [num_qvs][dp] running weighted sums of values
  float* l;   // [num_qvs][kTile] running softmax denominators, per lane
  float* m;   // [num_qvs] running maxima (base 2)
  float* p;   // [kMaxQvsAnyLevel][kBlock] weights of the current block
  float* kt;  // [head_dim][kBlock] keys of the current block, transposed
  float* v;   // [kBlock][dp] values of the current block

  static size_t floats(int32_t num_qvs, int32_t head_dim, int32_t dp) {
    return static_cast<size_t>(num_qvs) * static_cast<size_t>(2 * dp + kTile + 1) +
           static_cast<size_t>(kMaxQvsAnyLevel * kBlock) + static_cast<size_t>(head_dim * kBlock) +
           static_cast<size_t>(kBlock * dp);
  }
  static ItemScratch carve(float* base, int32_t num_qvs, int32_t head_dim, int32_t dp) {
    ItemScratch s;
    s.q = base;
    s.o = s.q + num_qvs * dp;
    s.l = s.o + num_qvs * dp;
    s.m = s.l + num_qvs * kTile;
    s.p = s.m + num_qvs;
    s.kt = s.p + kMaxQvsAnyLevel * kBlock;
    s.v = s.kt + head_dim * kBlock;
    return s;
  }
};

// kt[d * kBlock + j] = keys[j][d] for the kTile keys of one tile: the
// transposition a block's keys get when packed, plain loops.
inline void transposeTileScalar(const float* const* keys, int32_t head_dim, float* kt) {
  for (int32_t j = 0; j < kTile; ++j) {
    for (int32_t d = 0; d < head_dim; ++d) kt[d * kBlock + j] = keys[j][d];
  }
}

// ---- The levels ----------------------------------------------------------
// Each uses the Vec of simd_vec.h (16 float lanes) and defines
// kScoreQvs and kMaxQvs (register blocking: accumulator chains that fit the
// register file), and transposeTile (as transposeTileScalar; data movement
// only, so it may differ between levels freely).

namespace portable {

using Vec = simd_vec::portable::Vec;
constexpr int32_t kScoreQvs = 1;
constexpr int32_t kMaxQvs = 1;

inline void transposeTile(const float* const* keys, int32_t head_dim, float* kt) {
  transposeTileScalar(keys, head_dim, kt);
}

#include "engine/backend/cpu/paged_attention_kernel.inc"

}  // namespace portable

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
using Vec = simd_vec::avx2::Vec;
// Scores: 1 vector x 4 tiles x 2 halves = 8 accumulators of the 16 ymm
// registers; values: 2 vectors x 2 columns x 2 halves = 8.
constexpr int32_t kScoreQvs = 1;
constexpr int32_t kMaxQvs = 2;

inline void transposeTile(const float* const* keys, int32_t head_dim, float* kt) {
  transposeTileScalar(keys, head_dim, kt);
}

#include "engine/backend/cpu/paged_attention_kernel.inc"

}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
namespace avx512 {
using Vec = simd_vec::avx512::Vec;
// Scores: 6 vectors x 4 tiles = 24 accumulators of the 32 zmm registers;
// values: 12 vectors x 2 columns = 24 (fewer chains measured slower).
constexpr int32_t kScoreQvs = 6;
constexpr int32_t kMaxQvs = 12;

// In place: r[i][j] becomes r[j][i] (unpack pairs of rows, then 2x2 blocks of
// pairs, then 128-bit lanes twice).
inline void transpose16x16(__m512* r) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 16; i += 8) {
    for (int j = 0; j < 4; ++j) {
      t[i + j] = _mm512_shuffle_f32x4(r[i + j], r[i + 4 + j], 0x88);
      t[i + 4 + j] = _mm512_shuffle_f32x4(r[i + j], r[i + 4 + j], 0xdd);
    }
  }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd);
  }
}

// 16 dimensions at a time through transpose16x16; a partial last group is
// loaded under a mask and only its real rows stored.
inline void transposeTile(const float* const* keys, int32_t head_dim, float* kt) {
  __m512 r[16];
  for (int32_t d0 = 0; d0 < head_dim; d0 += 16) {
    const int32_t n = head_dim - d0 < 16 ? head_dim - d0 : 16;
    const __mmask16 mask = static_cast<__mmask16>((1u << n) - 1u);
    for (int j = 0; j < 16; ++j) r[j] = _mm512_maskz_loadu_ps(mask, keys[j] + d0);
    transpose16x16(r);
    for (int32_t i = 0; i < n; ++i) _mm512_storeu_ps(kt + (d0 + i) * kBlock, r[i]);
  }
}

#include "engine/backend/cpu/paged_attention_kernel.inc"

}  // namespace avx512
#pragma GCC pop_options

// The entry points of one level.
struct Kernels {
  void (*attend_item)(const ItemArgs&);
  void (*pack_blocks)(const ItemArgs&, int32_t first_block, int32_t num_blocks, int32_t num_keys, float* dst);
};

Kernels kernelsFor(SimdLevel level) {
  return forSimdLevel<Kernels>(level, {&portable::attendItem, &portable::packBlocks},
                               {&avx2::attendItem, &avx2::packBlocks}, {&avx512::attendItem, &avx512::packBlocks});
}

}  // namespace

PagedAttention::PagedAttention(SimdLevel simd, WorkerPool* pool)
    : simd_(resolveSimdLevel(simd)), pool_(pool), scratch_(static_cast<size_t>(pool->numThreads())) {}

PagedAttention::Plan PagedAttention::planItems(int32_t layer, std::span<const ChunkDesc> chunks, const KvStorage& kv,
                                               const AttentionShape& shape) {
  const KvLayout& layout = kv.layout();
  const int32_t head_dim = shape.head_dim;
  const int32_t dp = (head_dim + kTile - 1) / kTile * kTile;
  const int32_t group = shape.num_heads / shape.num_kv_heads;
  const int32_t rows_per_item = std::max(1, kQvsPerItem / group);
  const size_t block_floats = packedBlockFloats(head_dim, dp);

  // Per chunk: the layer block base of every block it reads (so the kernel
  // does plain pointer arithmetic), its work items, and, when several items
  // share its KV (a prefill chunk), packing tasks so its keys are packed once.
  chunk_info_.assign(chunks.size(), ChunkInfo{});
  block_bases_.clear();
  items_.clear();
  pack_tasks_.clear();
  size_t packed_floats = 0;
  int64_t work = 0;  // query vectors x key tiles
  for (size_t ci = 0; ci < chunks.size(); ++ci) {
    const ChunkDesc& c = chunks[ci];
    ChunkInfo& info = chunk_info_[ci];
    info.first_block = block_bases_.size();
    if (c.num_rows <= 0) continue;
    const int32_t num_keys = c.start_pos + c.num_rows;
    const int32_t num_blocks = kmath::blocksFor(num_keys, layout.block_size);
    for (int32_t b = 0; b < num_blocks; ++b) {
      block_bases_.push_back(kv.layerBlockBytes(layer, c.block_table[static_cast<size_t>(b)]));
    }
    if (c.num_rows > rows_per_item) {
      const int32_t key_blocks = (num_keys + kBlock - 1) / kBlock;
      info.packed_offset = packed_floats;
      info.packed_head_floats = static_cast<size_t>(key_blocks) * block_floats;
      packed_floats += info.packed_head_floats * static_cast<size_t>(shape.num_kv_heads);
      for (int32_t g = 0; g < shape.num_kv_heads; ++g) {
        for (int32_t b = 0; b < key_blocks; b += kBlocksPerPackTask) {
          pack_tasks_.push_back(PackTask{.chunk = static_cast<int32_t>(ci),
                                         .kv_head = g,
                                         .first_block = b,
                                         .num_blocks = std::min(kBlocksPerPackTask, key_blocks - b)});
        }
      }
    }
    for (int32_t r0 = 0; r0 < c.num_rows; r0 += rows_per_item) {
      const int32_t r1 = std::min(c.num_rows, r0 + rows_per_item);
      const int64_t tiles = (c.start_pos + r1 - 1) / kTile + 1;
      work += static_cast<int64_t>(r1 - r0) * group * tiles * shape.num_kv_heads;
      for (int32_t g = 0; g < shape.num_kv_heads; ++g) {
        items_.push_back(Item{.chunk = static_cast<int32_t>(ci), .kv_head = g, .row_begin = r0, .row_end = r1});
      }
    }
  }
  return Plan{.work = work, .packed_floats = packed_floats};
}

void PagedAttention::orderItems(std::span<const ChunkDesc> chunks, const AttentionShape& shape) {
  // Chunks that pack their own keys (decodes, short chunks) read K and V of
  // every KV head from the same cache lines: one item for all heads reads
  // them from memory once. Only where that leaves enough items to share out.
  const int64_t own_packing_chunks = std::count_if(chunk_info_.begin(), chunk_info_.end(),
                                                   [](const ChunkInfo& i) { return i.packed_head_floats == 0; });
  if (shape.num_kv_heads > 1 && own_packing_chunks >= 4 * static_cast<int64_t>(pool_->numThreads())) {
    std::erase_if(items_, [&](const Item& it) {
      return chunk_info_[static_cast<size_t>(it.chunk)].packed_head_floats == 0 && it.kv_head != 0;
    });
    for (Item& it : items_) {
      if (chunk_info_[static_cast<size_t>(it.chunk)].packed_head_floats == 0) it.num_kv_heads = shape.num_kv_heads;
    }
  }
  // Longest first (the last rows of long chunks), so the threads finish together.
  auto cost = [&](const Item& it) {
    return static_cast<int64_t>(it.row_end - it.row_begin) * it.num_kv_heads *
           (chunks[static_cast<size_t>(it.chunk)].start_pos + it.row_end);
  };
  std::stable_sort(items_.begin(), items_.end(), [&](const Item& a, const Item& b) { return cost(a) > cost(b); });
}

void PagedAttention::run(int32_t layer, const float* q, std::span<const ChunkDesc> chunks, const KvStorage& kv,
                         const AttentionShape& shape, float* out) {
  const KvLayout& layout = kv.layout();
  const int32_t head_dim = shape.head_dim;
  const int32_t dp = (head_dim + kTile - 1) / kTile * kTile;
  const int32_t group = shape.num_heads / shape.num_kv_heads;
  const int32_t rows_per_item = std::max(1, kQvsPerItem / group);
  const size_t q_width = static_cast<size_t>(shape.num_heads) * static_cast<size_t>(head_dim);

  const Plan plan = planItems(layer, chunks, kv, shape);
  orderItems(chunks, shape);

  if (packed_.size() < plan.packed_floats) packed_.resize(plan.packed_floats);
  if (zeros_.size() < static_cast<size_t>(head_dim)) zeros_.resize(static_cast<size_t>(head_dim), 0.0f);
  const size_t scratch_floats = ItemScratch::floats(rows_per_item * shape.num_heads, head_dim, dp);
  for (std::vector<float>& s : scratch_) {
    if (s.size() < scratch_floats) s.resize(scratch_floats);
  }
  const bool bf16 = layout.dtype == KvDtype::kBfloat16;
  if (bf16) {
    widen_.resize(scratch_.size());
    for (std::vector<float>& w : widen_) {
      if (w.size() < static_cast<size_t>(kBlock) * static_cast<size_t>(head_dim)) {
        w.resize(static_cast<size_t>(kBlock) * static_cast<size_t>(head_dim));
      }
    }
  }

  const Kernels kernels = kernelsFor(simd_);
  const float q_scale = static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(head_dim)));
  auto argsFor = [&](int32_t chunk, int32_t kv_head) {
    const ChunkInfo& info = chunk_info_[static_cast<size_t>(chunk)];
    ItemArgs a;
    a.blocks = block_bases_.data() + info.first_block;
    a.block_size = layout.block_size;
    a.bf16 = bf16;
    a.token_stride = layout.elementsPerToken();
    a.value_offset = static_cast<size_t>(layout.block_size) * layout.elementsPerToken();
    a.head_offset = static_cast<size_t>(kv_head) * static_cast<size_t>(head_dim);
    a.q_width = q_width;
    a.first_q_head = kv_head * group;
    a.group = group;
    a.head_dim = head_dim;
    a.head_dim_padded = dp;
    a.q_scale = q_scale;
    a.zeros = zeros_.data();
    if (info.packed_head_floats > 0) {
      a.packed = packed_.data() + info.packed_offset + static_cast<size_t>(kv_head) * info.packed_head_floats;
    }
    return a;
  };
  auto runPackTask = [&](int64_t index, int thread) {
    const PackTask& t = pack_tasks_[static_cast<size_t>(index)];
    const ChunkDesc& c = chunks[static_cast<size_t>(t.chunk)];
    ItemArgs a = argsFor(t.chunk, t.kv_head);
    if (bf16) a.widen = widen_[static_cast<size_t>(thread)].data();
    kernels.pack_blocks(a, t.first_block, t.num_blocks, c.start_pos + c.num_rows, const_cast<float*>(a.packed));
  };
  auto runItem = [&](int64_t index, int thread) {
    const Item& it = items_[static_cast<size_t>(index)];
    const ChunkDesc& c = chunks[static_cast<size_t>(it.chunk)];
    const size_t row = static_cast<size_t>(c.row_begin + it.row_begin);
    ItemArgs a = argsFor(it.chunk, it.kv_head);
    a.num_kv_heads = it.num_kv_heads;
    a.q = q + row * q_width;
    a.out = out + row * q_width;
    a.first_pos = c.start_pos + it.row_begin;
    a.num_rows = it.row_end - it.row_begin;
    a.scratch = scratch_[static_cast<size_t>(thread)].data();
    if (bf16) a.widen = widen_[static_cast<size_t>(thread)].data();
    kernels.attend_item(a);
  };
  if (plan.work < kMinParallelWork) {
    for (size_t i = 0; i < pack_tasks_.size(); ++i) runPackTask(static_cast<int64_t>(i), 0);
    for (size_t i = 0; i < items_.size(); ++i) runItem(static_cast<int64_t>(i), 0);
  } else {
    pool_->parallelFor(static_cast<int64_t>(pack_tasks_.size()), runPackTask);
    pool_->parallelFor(static_cast<int64_t>(items_.size()), runItem);
  }
}

}  // namespace tandem::engine
