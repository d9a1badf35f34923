#pragma once
// The forward pass's kernels, written once in the portable CUDA subset
// (portable.h): nvcc compiles them for the GPU (cuda_backend.cu), the host
// compiler for the CPU executor (kernel_backend.cc), where every test runs
// them. Each kernel states its launch shape and what it guarantees against
// the CPU backend (engine/backend/cpu): *bitwise* where the arithmetic is the
// same sequence of IEEE operations by design, else the tolerance the tests
// hold it to.
//
// All pointers are device memory (host memory under the executor); shapes
// in the comments are [rows, width], row-major, as in backend.h.

#include <cstdint>

#include "engine/backend/cuda/portable.h"
#include "engine/backend/kernel_math.h"

namespace tandem::gpu {

namespace kmath = ::tandem::engine::kmath;

inline uint32_t ceilDiv(int64_t n, int64_t d) { return static_cast<uint32_t>((n + d - 1) / d); }

// ---- RMSNorm: one block of 128 threads per row --------------------------------
// Bitwise the CPU backend's: the sum of squares is its 8-lane dot (lane l
// sums x[i]² for i = l mod 8 below the last multiple of 8, in order; the
// lanes combined ((0+1)+(2+3))+((4+5)+(6+7)), which is the xor-1, 2, 4
// butterfly; then the tail), then (x * (1 / sqrt(mean + eps))) * weight.
// Also the per-head q/k norm (rows = tokens x heads, dim = head_dim).

struct RmsNormArgs {
  const float* x;       // [rows, dim]
  const float* weight;  // [dim]
  float* out;           // [rows, dim]; may equal x
  int32_t rows, dim;
  float eps;
  bool operator==(const RmsNormArgs&) const = default;  // a graph replay compares its launches
};
constexpr int kRmsNormThreads = 128;
inline LaunchConfig rmsNormLaunch(int32_t rows) {
  return {{static_cast<uint32_t>(rows), 1, 1}, {kRmsNormThreads, 1, 1}, sizeof(float)};
}
TANDEM_KERNEL rmsNormKernel(const RmsNormArgs a) {
  const size_t row = static_cast<size_t>(blockX());
  const float* x = a.x + row * static_cast<size_t>(a.dim);
  float* out = a.out + row * static_cast<size_t>(a.dim);
  float* inv_shared = sharedMemory<float>();
  if (warpId() == 0) {
    const int lane = laneId();
    const int n8 = a.dim - a.dim % 8;
    float acc = 0.0f;
    if (lane < 8) {
      for (int i = lane; i < n8; i += 8) acc += x[i] * x[i];
    }
    acc += shflXor(acc, 1);
    acc += shflXor(acc, 2);
    acc += shflXor(acc, 4);
    if (lane == 0) {
      float tail = 0.0f;
      for (int i = n8; i < a.dim; ++i) tail += x[i] * x[i];
      const float mean_sq = (acc + tail) / static_cast<float>(a.dim);
      inv_shared[0] = 1.0f / sqrtf(mean_sq + a.eps);
    }
  }
  syncThreads();
  const float inv = inv_shared[0];
  for (int i = threadX(); i < a.dim; i += blockDimX()) out[i] = (x[i] * inv) * a.weight[i];
}

// ---- RoPE: one block per row ------------------------------------------------
// Bitwise the CPU backend's: cos/sin come from a table of
// kmath::ropeCosSinFreq values the backend fills on the host (the same
// function the CPU backend's table uses), the rotation is
// kmath::ropeRotateHead's arithmetic.

struct RopeArgs {
  float* x;                  // [rows, num_heads * head_dim], rotated in place
  const int32_t* positions;  // [rows]
  const float* cos_table;    // [positions][head_dim / 2]
  const float* sin_table;    // [positions][head_dim / 2]
  int32_t rows, num_heads, head_dim;
  bool operator==(const RopeArgs&) const = default;  // a graph replay compares its launches
};
constexpr int kRopeThreads = 128;
inline LaunchConfig ropeLaunch(int32_t rows) { return {{static_cast<uint32_t>(rows), 1, 1}, {kRopeThreads, 1, 1}, 0}; }
TANDEM_KERNEL ropeKernel(const RopeArgs a) {
  const int row = blockX();
  const int half = a.head_dim / 2;
  const size_t table_row = static_cast<size_t>(a.positions[row]) * static_cast<size_t>(half);
  float* xr = a.x + static_cast<size_t>(row) * static_cast<size_t>(a.num_heads) * static_cast<size_t>(a.head_dim);
  for (int j = threadX(); j < a.num_heads * half; j += blockDimX()) {
    const int h = j / half, i = j % half;
    float* xh = xr + static_cast<size_t>(h) * static_cast<size_t>(a.head_dim);
    const float c = a.cos_table[table_row + static_cast<size_t>(i)];
    const float s = a.sin_table[table_row + static_cast<size_t>(i)];
    const float x0 = xh[i];
    const float x1 = xh[i + half];
    xh[i] = x0 * c - x1 * s;
    xh[i + half] = x1 * c + x0 * s;
  }
}

// ---- Element-wise: SwiGLU, bias, gather ---------------------------------------
// Bitwise the CPU backend's (one operation per element; SwiGLU's e^x is
// kmath::expIeee on both).

constexpr int kElementwiseThreads = 256;
// Grid-stride loops over at most this many blocks.
constexpr uint32_t kMaxElementwiseBlocks = 4096;
inline LaunchConfig elementwiseLaunch(int64_t n) {
  uint32_t blocks = ceilDiv(n, kElementwiseThreads);
  blocks = blocks < 1 ? 1 : (blocks > kMaxElementwiseBlocks ? kMaxElementwiseBlocks : blocks);
  return {{blocks, 1, 1}, {kElementwiseThreads, 1, 1}, 0};
}

// A GEMM's input rounded to bf16 (GemmDtype::kBfloat16: kmath::bf16Bits,
// ties to even) for cuBLASLt's bf16 inputs. Grid-stride.
struct ToBf16Args {
  const float* in;  // [n]
  uint16_t* out;    // [n]
  int64_t n;
  bool operator==(const ToBf16Args&) const = default;  // a graph replay compares its launches
};
TANDEM_KERNEL toBf16Kernel(const ToBf16Args a) {
  const int64_t stride = static_cast<int64_t>(gridDimX()) * blockDimX();
  for (int64_t i = static_cast<int64_t>(blockX()) * blockDimX() + threadX(); i < a.n; i += stride) {
    a.out[i] = kmath::bf16Bits(a.in[i]);
  }
}

struct SwigluArgs {
  const float* gate;  // [n]
  const float* up;    // [n]
  float* out;         // [n]; may equal gate or up
  int64_t n;
  bool operator==(const SwigluArgs&) const = default;  // a graph replay compares its launches
};
TANDEM_KERNEL swigluKernel(const SwigluArgs a) {
  const int64_t stride = static_cast<int64_t>(gridDimX()) * blockDimX();
  for (int64_t i = static_cast<int64_t>(blockX()) * blockDimX() + threadX(); i < a.n; i += stride) {
    const float g = a.gate[i];
    a.out[i] = g / (1.0f + kmath::expIeee(-g)) * a.up[i];
  }
}

struct AddArgs {
  float* x;        // [n]
  const float* y;  // [n]; does not overlap x
  int64_t n;
  bool operator==(const AddArgs&) const = default;  // a graph replay compares its launches
};
TANDEM_KERNEL addKernel(const AddArgs a) {
  const int64_t stride = static_cast<int64_t>(gridDimX()) * blockDimX();
  for (int64_t i = static_cast<int64_t>(blockX()) * blockDimX() + threadX(); i < a.n; i += stride) a.x[i] += a.y[i];
}

struct AddBiasArgs {
  float* y;           // [rows, dim]
  const float* bias;  // [dim]
  int32_t rows, dim;
  bool operator==(const AddBiasArgs&) const = default;  // a graph replay compares its launches
};
TANDEM_KERNEL addBiasKernel(const AddBiasArgs a) {
  const int64_t n = static_cast<int64_t>(a.rows) * a.dim;
  const int64_t stride = static_cast<int64_t>(gridDimX()) * blockDimX();
  for (int64_t i = static_cast<int64_t>(blockX()) * blockDimX() + threadX(); i < n; i += stride) {
    a.y[i] += a.bias[i % a.dim];
  }
}

struct GatherRowsArgs {
  const void* src;      // [*, dim]: floats, or bf16 values (src_bf16; an embedding table) widened to fp32
  const int32_t* rows;  // [num_rows], indices into src
  float* dst;           // [num_rows, dim]
  int32_t num_rows, dim;
  bool src_bf16 = false;
  bool operator==(const GatherRowsArgs&) const = default;  // a graph replay compares its launches
};
constexpr int kGatherThreads = 128;
inline LaunchConfig gatherRowsLaunch(int32_t num_rows) {
  return {{static_cast<uint32_t>(num_rows), 1, 1}, {kGatherThreads, 1, 1}, 0};
}
TANDEM_KERNEL gatherRowsKernel(const GatherRowsArgs a) {
  const size_t r = static_cast<size_t>(blockX());
  const size_t at = static_cast<size_t>(a.rows[r]) * static_cast<size_t>(a.dim);
  float* dst = a.dst + r * static_cast<size_t>(a.dim);
  if (a.src_bf16) {
    const uint16_t* src = static_cast<const uint16_t*>(a.src) + at;
    for (int i = threadX(); i < a.dim; i += blockDimX()) dst[i] = kmath::bf16Value(src[i]);
  } else {
    const float* src = static_cast<const float*>(a.src) + at;
    for (int i = threadX(); i < a.dim; i += blockDimX()) dst[i] = src[i];
  }
}

// ---- KV write: one block per row --------------------------------------------
// Row r's K and V (num_kv_heads * head_dim floats each) to its slot of the
// paged pool, in KvStorage's layout (kmath::kvOffset, in elements). The host
// resolves each row's block and slot from the chunks' block tables
// (row_block, row_slot). A bf16 pool gets them rounded to nearest even
// (kmath::bf16Bits, as the CPU backend's writeKv).

// Element i of a pool of fp32 or bf16 (kv_bf16), as fp32.
TANDEM_HD_ALWAYS_INLINE inline float kvLoad(const void* kv, bool kv_bf16, size_t i) {
  return kv_bf16 ? kmath::bf16Value(static_cast<const uint16_t*>(kv)[i]) : static_cast<const float*>(kv)[i];
}

struct WriteKvArgs {
  const float* k;            // [rows, num_kv_heads * head_dim]
  const float* v;            // [rows, num_kv_heads * head_dim]
  void* kv;                  // the pool: [layers][blocks][2][block_size][num_kv_heads][head_dim] of fp32 or bf16
  const int32_t* row_block;  // [rows]; negative: a padding row (a graph's bucket), written nowhere
  const int32_t* row_slot;   // [rows]
  int32_t rows, layer, num_blocks, block_size, num_kv_heads, head_dim;
  bool kv_bf16;                                         // the pool holds bf16 (KvDtype::kBfloat16)
  bool operator==(const WriteKvArgs&) const = default;  // a graph replay compares its launches
};
constexpr int kWriteKvThreads = 128;
inline LaunchConfig writeKvLaunch(int32_t rows) {
  return {{static_cast<uint32_t>(rows), 1, 1}, {kWriteKvThreads, 1, 1}, 0};
}
TANDEM_KERNEL writeKvKernel(const WriteKvArgs a) {
  const int r = blockX();
  if (a.row_block[r] < 0) return;  // the whole block: it has no barrier
  const int width = a.num_kv_heads * a.head_dim;
  const size_t k_at = kmath::kvOffset(a.layer, a.row_block[r], false, a.row_slot[r], 0, a.num_blocks, a.block_size,
                                      a.num_kv_heads, a.head_dim);
  const size_t v_at = kmath::kvOffset(a.layer, a.row_block[r], true, a.row_slot[r], 0, a.num_blocks, a.block_size,
                                      a.num_kv_heads, a.head_dim);
  const size_t src = static_cast<size_t>(r) * static_cast<size_t>(width);
  if (a.kv_bf16) {
    uint16_t* kv = static_cast<uint16_t*>(a.kv);
    for (int i = threadX(); i < width; i += blockDimX()) {
      kv[k_at + static_cast<size_t>(i)] = kmath::bf16Bits(a.k[src + static_cast<size_t>(i)]);
      kv[v_at + static_cast<size_t>(i)] = kmath::bf16Bits(a.v[src + static_cast<size_t>(i)]);
    }
    return;
  }
  float* kv = static_cast<float*>(a.kv);
  for (int i = threadX(); i < width; i += blockDimX()) {
    kv[k_at + static_cast<size_t>(i)] = a.k[src + static_cast<size_t>(i)];
    kv[v_at + static_cast<size_t>(i)] = a.v[src + static_cast<size_t>(i)];
  }
}

// ---- KV block copy: copy-on-write of a shared partial block -----------------
// Every layer's layer block of `src` into `dst` (KvStorage::copyBlock, whose
// bits it must leave: a copy), in 4-byte words whatever the pool's dtype (a
// layer block holds K and V, an even number of elements: a multiple of 4
// bytes in bf16 too). Grid: x = slices of the layer block, y = layers.

struct CopyKvBlockArgs {
  uint32_t* kv;  // the pool (WriteKvArgs::kv), as words
  int32_t src, dst, num_blocks;
  int64_t words_per_layer_block;                            // KvLayout::bytesPerLayerBlock / 4
  bool operator==(const CopyKvBlockArgs&) const = default;  // a graph replay compares its launches
};
constexpr int kCopyThreads = 256;
inline LaunchConfig copyKvBlockLaunch(int32_t num_layers, size_t words_per_layer_block) {
  uint32_t slices = ceilDiv(static_cast<int64_t>(words_per_layer_block), kCopyThreads);
  slices = slices > kMaxElementwiseBlocks ? kMaxElementwiseBlocks : slices;
  return {{slices, static_cast<uint32_t>(num_layers), 1}, {kCopyThreads, 1, 1}, 0};
}
TANDEM_KERNEL copyKvBlockKernel(const CopyKvBlockArgs a) {
  const size_t layer_base = static_cast<size_t>(blockY()) * static_cast<size_t>(a.num_blocks);
  const uint32_t* from =
      a.kv + (layer_base + static_cast<size_t>(a.src)) * static_cast<size_t>(a.words_per_layer_block);
  uint32_t* to = a.kv + (layer_base + static_cast<size_t>(a.dst)) * static_cast<size_t>(a.words_per_layer_block);
  const int64_t stride = static_cast<int64_t>(gridDimX()) * blockDimX();
  for (int64_t i = static_cast<int64_t>(blockX()) * blockDimX() + threadX(); i < a.words_per_layer_block; i += stride) {
    to[i] = from[i];
  }
}

// ---- KV block checksums --------------------------------------------------
// XXH64 (seed 0) of layer blocks: what the P/D protocol carries
// for each layer block a prefill agent announces (kvproto::layerBlockChecksum),
// computed where the pool is, so an agent whose pool UCX reads in device
// memory (no staging copy) neither copies a layer to the host to announce it
// nor to verify a pulled one. XXH64 runs four independent accumulators over
// 32-byte stripes: four lanes each run one over every stripe, and the first
// of the four merges them, hashes the tail and finishes. A layer block is a
// whole number of 4-byte words (CopyKvBlockArgs) at a 4-byte-aligned offset,
// so its 8-byte words are read as two 4-byte words (little-endian, as XXH64
// reads them on x86 and on the GPU) and its tail is 8-byte words and at most
// one 4-byte word. Layer blocks of any layers go in one launch, each named by
// its index in the pool (layer * num_blocks + block). Grid: x = groups of
// kChecksumBlocksPerLaunchBlock layer blocks.

struct KvChecksumArgs {
  const uint32_t* kv;           // the pool, as words
  const int64_t* layer_blocks;  // [count] layer * num_blocks + block
  uint64_t* out;                // [count] the checksums, in that order
  int32_t count;
  int64_t words_per_layer_block;                           // KvLayout::bytesPerLayerBlock / 4
  bool operator==(const KvChecksumArgs&) const = default;  // a graph replay compares its launches
};
constexpr int kChecksumThreads = 128;
constexpr int kChecksumBlocksPerLaunchBlock = kChecksumThreads / 4;
inline LaunchConfig kvChecksumLaunch(int32_t count) {
  return {{ceilDiv(count, kChecksumBlocksPerLaunchBlock), 1, 1}, {kChecksumThreads, 1, 1}, 0};
}
namespace xxh64 {
constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t kPrime2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t kPrime3 = 0x165667B19E3779F9ull;
constexpr uint64_t kPrime4 = 0x85EBCA77C2B2AE63ull;
constexpr uint64_t kPrime5 = 0x27D4EB2F165667C5ull;
TANDEM_DEVICE uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
TANDEM_DEVICE uint64_t step(uint64_t acc, uint64_t input) { return rotl(acc + input * kPrime2, 31) * kPrime1; }
TANDEM_DEVICE uint64_t mergeStep(uint64_t h, uint64_t v) { return (h ^ step(0, v)) * kPrime1 + kPrime4; }
TANDEM_DEVICE uint64_t word(const uint32_t* p) {
  return static_cast<uint64_t>(p[0]) | (static_cast<uint64_t>(p[1]) << 32);
}
}  // namespace xxh64
TANDEM_KERNEL kvChecksumKernel(const KvChecksumArgs a) {
  const int item = blockX() * kChecksumBlocksPerLaunchBlock + threadX() / 4;
  const int lane = threadX() % 4;
  const int64_t words = a.words_per_layer_block;
  const int64_t stripes = words / 8;  // 32 bytes each
  const uint32_t* p = nullptr;
  uint64_t acc = 0;
  if (item < a.count) {
    p = a.kv + static_cast<size_t>(a.layer_blocks[item]) * static_cast<size_t>(words);
    // XXH64's seeds of v1..v4 with seed 0.
    acc = lane == 0 ? xxh64::kPrime1 + xxh64::kPrime2 : lane == 1 ? xxh64::kPrime2 : lane == 2 ? 0 : 0 - xxh64::kPrime1;
    for (int64_t s = 0; s < stripes; ++s) acc = xxh64::step(acc, xxh64::word(p + s * 8 + lane * 2));
  }
  // Every lane takes part in the exchanges (full-warp shuffles).
  const int first = (threadX() % kWarpSize) & ~3;
  const uint64_t v1 = shflIdx(acc, first), v2 = shflIdx(acc, first + 1), v3 = shflIdx(acc, first + 2),
                 v4 = shflIdx(acc, first + 3);
  if (item >= a.count || lane != 0) return;
  uint64_t h;
  if (stripes > 0) {
    h = xxh64::rotl(v1, 1) + xxh64::rotl(v2, 7) + xxh64::rotl(v3, 12) + xxh64::rotl(v4, 18);
    h = xxh64::mergeStep(h, v1);
    h = xxh64::mergeStep(h, v2);
    h = xxh64::mergeStep(h, v3);
    h = xxh64::mergeStep(h, v4);
  } else {
    h = xxh64::kPrime5;
  }
  h += static_cast<uint64_t>(words) * 4;
  int64_t i = stripes * 8;
  for (; i + 2 <= words; i += 2)
    h = xxh64::rotl(h ^ xxh64::step(0, xxh64::word(p + i)), 27) * xxh64::kPrime1 + xxh64::kPrime4;
  if (i < words)
    h = xxh64::rotl(h ^ (static_cast<uint64_t>(p[i]) * xxh64::kPrime1), 23) * xxh64::kPrime2 + xxh64::kPrime3;
  h ^= h >> 33;
  h *= xxh64::kPrime2;
  h ^= h >> 29;
  h *= xxh64::kPrime3;
  h ^= h >> 32;
  a.out[item] = h;
}

// ---- Paged attention, split over the keys ----------------------------------
// One block of kAttentionWarps warps per (group of query heads, row, split).
// The query heads of a block share one KV head (GQA: query head h reads KV
// head kmath::kvHeadFor(h)), so a block reads each key's K and V once for
// all of them: attentionHeadsPerBlock of them, the largest divisor of the
// GQA group size up to kAttentionMaxHeadsPerBlock. A row at position p sees
// keys [0, p]; they are cut into attentionSplits(p + 1) splits of
// attentionSplitKeys(p + 1) keys (a function of the row's own position
// only, never of the batch: batch invariance). A split's keys go in tiles of
// 32, tile t to warp t % kAttentionWarps; each warp keeps an online softmax
// (o, m, l) per head over its tiles, the block merges the warps' in warp
// order into the split's partial, and attentionCombineKernel merges the
// partials in split order. Prefill rows (causal, chunked) and decode rows
// take the same path, so a row's bits do not depend on which kind of step
// computes it. Per tile and head, in the same order on every lane:
//   s_j = (q . k_j) * scale            (sequential over head_dim; lane j reads key j)
//   m'  = max(m, s_0..s_31)            (sequential)
//   p_j = expIeee(s_j - m')            (0 for keys past the row)
//   l   = l * expIeee(m - m') + sum p_j   (sequential; the factor is 0 when m = -inf)
//   o_d = o_d * that factor + sum_j p_j v_j[d]   (j in key order; lane i holds dims i, i + 32, ...)
// and the merge of warps w = 0..7 (those with keys): M = max m_w,
// L = sum l_w expIeee(m_w - M), O_d = sum o_w[d] expIeee(m_w - M).
// A head's bits do not depend on how many heads share its block.
// Memory: each lane looks its key's block up once and shares the V offset,
// so every load of a tile is independent (K in 16-byte loads, 8-byte from a
// bf16 pool, four keys' V
// rows in flight at a time). A GPU mostly waits on their latency, so eight
// warps share a split (docs/cuda.md, "Attention on a GPU").
// Not bitwise the CPU backend (whose softmax is base 2 over 64-key blocks
// with a lazy rescale): the tests hold it within 2e-5 relative of it.

constexpr int kAttentionWarps = 8;
constexpr int kAttentionThreads = kAttentionWarps * kWarpSize;
constexpr int kAttentionTile = kWarpSize;
constexpr int kAttentionMaxHeadDim = 256;
constexpr int kAttentionDimsPerLane = kAttentionMaxHeadDim / kWarpSize;
constexpr int kAttentionMaxHeadsPerBlock = 4;
// Keys per split below which a row has one split, and the most splits a row
// gets (bounds the partials' workspace).
constexpr int32_t kAttentionSplitKeys = 512;
constexpr int32_t kAttentionMaxSplits = 16;

TANDEM_HD inline int32_t attentionSplits(int32_t visible) {
  const int32_t s = (visible + kAttentionSplitKeys - 1) / kAttentionSplitKeys;
  return s < 1 ? 1 : (s > kAttentionMaxSplits ? kAttentionMaxSplits : s);
}
// Keys per split: a multiple of the tile, at least visible / splits.
TANDEM_HD inline int32_t attentionSplitKeys(int32_t visible) {
  const int32_t splits = attentionSplits(visible);
  const int32_t per = (visible + splits - 1) / splits;
  return (per + kAttentionTile - 1) / kAttentionTile * kAttentionTile;
}
// Floats of one (split, head) partial: o[head_dim], m, l.
TANDEM_HD inline int32_t attentionPartialFloats(int32_t head_dim) { return head_dim + 2; }
// Query heads per block: the largest divisor of the GQA group (query heads
// per KV head) up to kAttentionMaxHeadsPerBlock.
TANDEM_HD inline int32_t attentionHeadsPerBlock(int32_t num_heads, int32_t num_kv_heads) {
  const int32_t group = num_heads / num_kv_heads;
  for (int32_t h = kAttentionMaxHeadsPerBlock; h > 1; --h) {
    if (group % h == 0) return h;
  }
  return 1;
}

struct AttentionArgs {
  const float* q;               // [rows, num_heads * head_dim], rotated
  float* out;                   // [rows, num_heads * head_dim]
  const void* kv;               // the pool (WriteKvArgs::kv), fp32 or bf16 (kv_bf16)
  const int32_t* block_tables;  // every row's chunk's block table, concatenated
  const int32_t* row_pos;       // [rows] the row's position (it sees keys [0, row_pos]); negative: a
                                //   padding row (a graph's bucket), which reads no keys and gets zeros
  const int32_t* row_table;     // [rows] where its block table starts in block_tables
  const int32_t* row_split;     // [rows] its first split's index in `partial`
  float* partial;               // [splits of all rows][num_heads][attentionPartialFloats]
  int32_t rows, layer, num_blocks, block_size, num_heads, num_kv_heads, head_dim;
  float scale;   // kmath::attentionScale(head_dim)
  bool kv_bf16;  // the pool holds bf16: K and V widened to fp32 as they are read
  bool operator==(const AttentionArgs&) const = default;  // a graph replay compares its launches
};
// Shared memory of attentionSplitKernel: per warp its tile's V offsets
// (int64, first for alignment); the block's queries [heads][head_dim]; per
// warp its tile's scores and weights [heads][32] and its (o, m, l) per head
// for the merge.
TANDEM_HD inline size_t attentionWarpFloats(int32_t heads, int32_t head_dim) {
  return static_cast<size_t>(heads) * (2 * kAttentionTile + static_cast<size_t>(attentionPartialFloats(head_dim)));
}
TANDEM_HD inline size_t attentionSplitSharedBytes(int32_t heads, int32_t head_dim) {
  return static_cast<size_t>(kAttentionWarps) * kAttentionTile * sizeof(int64_t) +
         (static_cast<size_t>(heads) * static_cast<size_t>(head_dim) +
          kAttentionWarps * attentionWarpFloats(heads, head_dim)) *
             sizeof(float);
}
// Grid: x = groups of query heads, y = rows, z = the most splits any row has.
inline LaunchConfig attentionSplitLaunch(int32_t rows, int32_t num_heads, int32_t num_kv_heads, int32_t max_splits,
                                         int32_t head_dim) {
  const int32_t heads = attentionHeadsPerBlock(num_heads, num_kv_heads);
  return {{static_cast<uint32_t>(num_heads / heads), static_cast<uint32_t>(rows), static_cast<uint32_t>(max_splits)},
          {kAttentionThreads, 1, 1},
          attentionSplitSharedBytes(heads, head_dim)};
}
TANDEM_KERNEL attentionSplitKernel(const AttentionArgs a) {
  constexpr int H = kAttentionMaxHeadsPerBlock;  // register arrays' size; `heads` of them are used
  const int32_t heads = attentionHeadsPerBlock(a.num_heads, a.num_kv_heads);
  const int h0 = blockX() * heads, row = blockY(), split = blockZ();
  if (a.row_pos[row] < 0) return;  // a padding row (the whole block)
  const int32_t visible = a.row_pos[row] + 1;
  if (split >= attentionSplits(visible)) return;  // the whole block: no barrier is left waiting
  const int32_t split_keys = attentionSplitKeys(visible);
  const int32_t k0 = split * split_keys;
  const int32_t k1 = k0 + split_keys < visible ? k0 + split_keys : visible;
  const int kv_head = kmath::kvHeadFor(h0, a.num_heads, a.num_kv_heads);
  const int lane = laneId(), warp = warpId();
  const int hd = a.head_dim;
  int64_t* v_off = sharedMemory<int64_t>() + warp * kAttentionTile;  // [32] this warp's tile's V offsets
  float* q = reinterpret_cast<float*>(sharedMemory<int64_t>() + kAttentionWarps * kAttentionTile);  // [heads][hd]
  float* warp_floats = q + heads * hd;
  float* s_tile = warp_floats + static_cast<size_t>(warp) * attentionWarpFloats(heads, hd);  // [heads][32] scores
  float* p_tile = s_tile + heads * kAttentionTile;                                           // [heads][32] weights
  float* mine = p_tile + heads * kAttentionTile;  // [heads][hd + 2]: (o, m, l) per head
  const float* qg = a.q + (static_cast<size_t>(row) * static_cast<size_t>(a.num_heads) + static_cast<size_t>(h0)) *
                              static_cast<size_t>(hd);  // the block's heads are adjacent
  for (int i = threadX(); i < heads * hd; i += blockDimX()) q[i] = qg[i];
  syncThreads();
  const int32_t* table = a.block_tables + a.row_table[row];
  // K rows and the queries start 16-byte aligned (a bf16 pool's K rows
  // 8-byte aligned) when head_dim is a multiple of 4 and the pool is (a GPU
  // allocation always is).
  const bool vector_loads = hd % 4 == 0 && reinterpret_cast<uintptr_t>(a.kv) % alignof(Float4) == 0;
  float o[H][kAttentionDimsPerLane];  // fixed counts, so registers
  float m[H], l[H];
  for (int g = 0; g < H; ++g) {
    for (float& x : o[g]) x = 0.0f;
    m[g] = -INFINITY;
    l[g] = 0.0f;
  }
  const int32_t tiles = (k1 - k0 + kAttentionTile - 1) / kAttentionTile;
  // The warp alone (syncWarp, not syncThreads). The scores are written after
  // the weights' barrier of the last tile, the weights and offsets after the
  // scores' barrier: every lane has read the last ones by then.
  for (int32_t t = warp; t < tiles; t += kAttentionWarps) {
    const int32_t t0 = k0 + t * kAttentionTile;
    const int32_t key = t0 + lane;
    float s[H];
    int64_t v_at = 0;
    if (key < k1) {
      const int32_t block = table[kmath::blockIndexOf(key, a.block_size)];
      const int32_t slot = kmath::slotOf(key, a.block_size);
      const size_t k_at =
          kmath::kvOffset(a.layer, block, false, slot, kv_head, a.num_blocks, a.block_size, a.num_kv_heads, hd);
      v_at = static_cast<int64_t>(
          kmath::kvOffset(a.layer, block, true, slot, kv_head, a.num_blocks, a.block_size, a.num_kv_heads, hd));
      float acc[H] = {};
      int i = 0;
      if (vector_loads) {
        for (; i + 4 <= hd; i += 4) {  // K and q four dims at a time, each head's products in order
          const Float4 x = a.kv_bf16 ? load4Bf16(static_cast<const uint16_t*>(a.kv) + k_at + i)
                                     : load4(static_cast<const float*>(a.kv) + k_at + i);
          for (int g = 0; g < H; ++g) {
            if (g < heads) {
              const Float4 qh = load4(q + g * hd + i);
              acc[g] += qh.x * x.x;
              acc[g] += qh.y * x.y;
              acc[g] += qh.z * x.z;
              acc[g] += qh.w * x.w;
            }
          }
        }
      }
      for (; i < hd; ++i) {
        const float x = kvLoad(a.kv, a.kv_bf16, k_at + static_cast<size_t>(i));
        for (int g = 0; g < H; ++g) {
          if (g < heads) acc[g] += q[g * hd + i] * x;
        }
      }
      for (int g = 0; g < H; ++g) s[g] = acc[g] * a.scale;
    } else {
      for (float& x : s) x = -INFINITY;
    }
    for (int g = 0; g < heads; ++g) s_tile[g * kAttentionTile + lane] = s[g];
    syncWarp();
    float factor[H];
    for (int g = 0; g < H; ++g) {
      if (g >= heads) continue;
      float m_new = m[g];
      for (int j = 0; j < kAttentionTile; ++j) m_new = fmaxf(m_new, s_tile[g * kAttentionTile + j]);
      factor[g] = m[g] == -INFINITY ? 0.0f : kmath::expIeee(m[g] - m_new);
      p_tile[g * kAttentionTile + lane] = key < k1 ? kmath::expIeee(s[g] - m_new) : 0.0f;
      m[g] = m_new;
    }
    v_off[lane] = v_at;
    syncWarp();
    const int32_t keys = k1 - t0 < kAttentionTile ? k1 - t0 : kAttentionTile;
    for (int g = 0; g < H; ++g) {
      if (g >= heads) continue;
      l[g] *= factor[g];
      for (int j = 0; j < keys; ++j) l[g] += p_tile[g * kAttentionTile + j];
      for (float& x : o[g]) x *= factor[g];
    }
    int j = 0;
    for (; j + 4 <= keys; j += 4) {  // four keys' V rows in flight, added in key order
      const size_t v0 = static_cast<size_t>(v_off[j]), v1 = static_cast<size_t>(v_off[j + 1]);
      const size_t v2 = static_cast<size_t>(v_off[j + 2]), v3 = static_cast<size_t>(v_off[j + 3]);
      for (int d = 0; d < kAttentionDimsPerLane; ++d) {
        const int c = d * kWarpSize + lane;
        if (c >= hd) continue;
        const auto cc = static_cast<size_t>(c);
        const float x0 = kvLoad(a.kv, a.kv_bf16, v0 + cc), x1 = kvLoad(a.kv, a.kv_bf16, v1 + cc);
        const float x2 = kvLoad(a.kv, a.kv_bf16, v2 + cc), x3 = kvLoad(a.kv, a.kv_bf16, v3 + cc);
        for (int g = 0; g < H; ++g) {
          if (g >= heads) continue;
          const float* p = p_tile + g * kAttentionTile + j;
          o[g][d] += p[0] * x0;
          o[g][d] += p[1] * x1;
          o[g][d] += p[2] * x2;
          o[g][d] += p[3] * x3;
        }
      }
    }
    for (; j < keys; ++j) {
      const auto v = static_cast<size_t>(v_off[j]);
      for (int d = 0; d < kAttentionDimsPerLane; ++d) {
        const int c = d * kWarpSize + lane;
        if (c >= hd) continue;
        const float x = kvLoad(a.kv, a.kv_bf16, v + static_cast<size_t>(c));
        for (int g = 0; g < H; ++g) {
          if (g < heads) o[g][d] += p_tile[g * kAttentionTile + j] * x;
        }
      }
    }
  }
  for (int g = 0; g < H; ++g) {
    if (g >= heads) continue;
    float* to = mine + g * attentionPartialFloats(hd);
    for (int d = 0; d < kAttentionDimsPerLane; ++d) {
      if (d * kWarpSize + lane < hd) to[d * kWarpSize + lane] = o[g][d];
    }
    if (lane == 0) {
      to[hd] = m[g];
      to[hd + 1] = l[g];
    }
  }
  syncThreads();
  // Warp g merges head g's (o, m, l) of the block's warps, in warp order.
  for (int g = warp; g < heads; g += kAttentionWarps) {
    const int32_t stride = attentionPartialFloats(hd);
    auto from = [&](int w) {
      return warp_floats + static_cast<size_t>(w) * attentionWarpFloats(heads, hd) +
             static_cast<size_t>(2 * heads * kAttentionTile + g * stride);
    };
    float m_all = -INFINITY;
    for (int w = 0; w < kAttentionWarps; ++w) m_all = fmaxf(m_all, from(w)[hd]);
    float l_all = 0.0f;
    for (int w = 0; w < kAttentionWarps; ++w) {
      if (from(w)[hd + 1] > 0.0f) l_all += from(w)[hd + 1] * kmath::expIeee(from(w)[hd] - m_all);
    }
    float* part = a.partial + (static_cast<size_t>(a.row_split[row] + split) * static_cast<size_t>(a.num_heads) +
                               static_cast<size_t>(h0 + g)) *
                                  static_cast<size_t>(stride);
    for (int d = lane; d < hd; d += kWarpSize) {
      float acc = 0.0f;
      for (int w = 0; w < kAttentionWarps; ++w) {
        if (from(w)[hd + 1] > 0.0f) acc += from(w)[d] * kmath::expIeee(from(w)[hd] - m_all);
      }
      part[d] = acc;
    }
    if (lane == 0) {
      part[hd] = m_all;
      part[hd + 1] = l_all;
    }
  }
}

// Grid: x = query heads, y = rows.
inline LaunchConfig attentionCombineLaunch(int32_t rows, int32_t num_heads) {
  return {{static_cast<uint32_t>(num_heads), static_cast<uint32_t>(rows), 1}, {kWarpSize, 1, 1}, 0};
}
// out = sum_s o_s e^(m_s - m) / sum_s l_s e^(m_s - m), m = max_s m_s, in split
// order. With one split the factor is exactly 1 (expIeee(0) = 1): out = o / l.
TANDEM_KERNEL attentionCombineKernel(const AttentionArgs a) {
  const int h = blockX(), row = blockY();
  const int hd = a.head_dim;
  float* out = a.out + (static_cast<size_t>(row) * static_cast<size_t>(a.num_heads) + static_cast<size_t>(h)) *
                           static_cast<size_t>(hd);
  if (a.row_pos[row] < 0) {  // a padding row: zeros, not 0 / 0
    for (int d = laneId(); d < hd; d += kWarpSize) out[d] = 0.0f;
    return;
  }
  const int32_t splits = attentionSplits(a.row_pos[row] + 1);
  const size_t stride = static_cast<size_t>(a.num_heads) * static_cast<size_t>(attentionPartialFloats(hd));
  const float* first = a.partial + static_cast<size_t>(a.row_split[row]) * stride +
                       static_cast<size_t>(h) * static_cast<size_t>(attentionPartialFloats(hd));
  float m = -INFINITY;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, first[static_cast<size_t>(s) * stride + static_cast<size_t>(hd)]);
  float l = 0.0f;
  for (int s = 0; s < splits; ++s) {
    const float* part = first + static_cast<size_t>(s) * stride;
    if (part[hd + 1] > 0.0f) l += part[hd + 1] * kmath::expIeee(part[hd] - m);
  }
  for (int d = laneId(); d < hd; d += kWarpSize) {
    float acc = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float* part = first + static_cast<size_t>(s) * stride;
      if (part[hd + 1] > 0.0f) acc += part[d] * kmath::expIeee(part[hd] - m);
    }
    out[d] = acc / l;
  }
}

}  // namespace tandem::gpu
