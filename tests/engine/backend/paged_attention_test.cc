// CpuBackend::attention against a dense reference: contiguous K/V, no block
// tables, double precision, written straight from the definition.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/kernel_math.h"

namespace tandem::engine {
namespace {

// One sequence of a test batch: KV of positions [0, start_pos + num_rows) is
// cached; the chunk queries rows at positions start_pos .. start_pos+num_rows-1.
struct SeqSpec {
  int32_t start_pos;
  int32_t num_rows;
};

struct Sequence {
  SeqSpec spec;
  std::vector<float> k;  // [len, num_kv_heads, head_dim] dense
  std::vector<float> v;  // [len, num_kv_heads, head_dim]
  std::vector<BlockId> block_table;
};

struct Fixture {
  AttentionShape shape;
  KvLayout layout;
  std::vector<Sequence> seqs;
  std::vector<ChunkDesc> chunks;
  std::vector<float> q;  // [total_rows, num_heads * head_dim]
  int32_t total_rows = 0;
};

// Builds sequences whose blocks are drawn from a shuffled pool, so block
// tables are non-contiguous and interleaved between sequences, and writes
// their dense K/V into `kv` directly (independent of writeKv).
Fixture makeFixture(const AttentionShape& shape, int32_t block_size, const std::vector<SeqSpec>& specs, uint32_t seed) {
  Fixture f;
  f.shape = shape;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  int32_t blocks_needed = 0;
  for (const SeqSpec& s : specs) blocks_needed += (s.start_pos + s.num_rows + block_size - 1) / block_size;
  f.layout = KvLayout{.num_layers = 2,
                      .num_blocks = blocks_needed + 3,
                      .block_size = block_size,
                      .num_kv_heads = shape.num_kv_heads,
                      .head_dim = shape.head_dim};
  std::vector<int32_t> pool(static_cast<size_t>(f.layout.num_blocks));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  size_t next = 0;
  const size_t width = static_cast<size_t>(shape.num_kv_heads * shape.head_dim);
  for (const SeqSpec& spec : specs) {
    Sequence seq;
    seq.spec = spec;
    const int32_t len = spec.start_pos + spec.num_rows;
    seq.k.resize(static_cast<size_t>(len) * width);
    seq.v.resize(static_cast<size_t>(len) * width);
    for (float& x : seq.k) x = dist(rng);
    for (float& x : seq.v) x = dist(rng);
    for (int32_t b = 0; b < (len + block_size - 1) / block_size; ++b) seq.block_table.push_back(BlockId(pool[next++]));
    f.seqs.push_back(std::move(seq));
  }
  const size_t q_width = static_cast<size_t>(shape.num_heads * shape.head_dim);
  for (const Sequence& seq : f.seqs) f.total_rows += seq.spec.num_rows;
  f.q.resize(static_cast<size_t>(f.total_rows) * q_width);
  for (float& x : f.q) x = dist(rng);
  int32_t row = 0;
  for (const Sequence& seq : f.seqs) {
    f.chunks.push_back(ChunkDesc{.row_begin = row,
                                 .num_rows = seq.spec.num_rows,
                                 .start_pos = seq.spec.start_pos,
                                 .block_table = seq.block_table});
    row += seq.spec.num_rows;
  }
  return f;
}

void fillCache(const Fixture& f, KvStorage& kv, int32_t layer) {
  const size_t width = static_cast<size_t>(f.shape.num_kv_heads * f.shape.head_dim);
  for (const Sequence& seq : f.seqs) {
    const int32_t len = seq.spec.start_pos + seq.spec.num_rows;
    for (int32_t p = 0; p < len; ++p) {
      const BlockId block = seq.block_table[static_cast<size_t>(p / f.layout.block_size)];
      const int32_t slot = p % f.layout.block_size;
      std::memcpy(kv.key(layer, block, slot), seq.k.data() + static_cast<size_t>(p) * width, width * sizeof(float));
      std::memcpy(kv.value(layer, block, slot), seq.v.data() + static_cast<size_t>(p) * width, width * sizeof(float));
    }
  }
}

// Dense causal GQA attention in double.
std::vector<double> referenceAttention(const Fixture& f) {
  const int32_t H = f.shape.num_heads, KVH = f.shape.num_kv_heads, D = f.shape.head_dim;
  const int32_t group = H / KVH;
  std::vector<double> out(f.q.size());
  int32_t row = 0;
  for (const Sequence& seq : f.seqs) {
    for (int32_t r = 0; r < seq.spec.num_rows; ++r, ++row) {
      const int32_t pos = seq.spec.start_pos + r;
      for (int32_t h = 0; h < H; ++h) {
        const int32_t kvh = h / group;
        const float* qh = f.q.data() + (static_cast<size_t>(row) * H + h) * D;
        std::vector<double> scores(static_cast<size_t>(pos + 1));
        double max_s = -1e300;
        for (int32_t j = 0; j <= pos; ++j) {
          const float* kj = seq.k.data() + (static_cast<size_t>(j) * KVH + kvh) * D;
          double s = 0;
          for (int32_t d = 0; d < D; ++d) s += static_cast<double>(qh[d]) * kj[d];
          scores[static_cast<size_t>(j)] = s / std::sqrt(static_cast<double>(D));
          max_s = std::max(max_s, scores[static_cast<size_t>(j)]);
        }
        double sum = 0;
        for (double& s : scores) sum += (s = std::exp(s - max_s));
        for (int32_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int32_t j = 0; j <= pos; ++j) {
            acc += scores[static_cast<size_t>(j)] * seq.v[(static_cast<size_t>(j) * KVH + kvh) * D + d];
          }
          out[(static_cast<size_t>(row) * H + h) * D + d] = acc / sum;
        }
      }
    }
  }
  return out;
}

std::vector<float> runAttention(CpuBackend& backend, const Fixture& f, const KvStorage& kv, int32_t layer) {
  std::vector<float> out(f.q.size(), std::nanf(""));
  backend.attention(layer, f.q.data(), f.chunks, kv, f.shape, out.data());
  return out;
}

void expectMatchesReference(const Fixture& f, const std::vector<float>& got, const char* what) {
  const auto want = referenceAttention(f);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 2e-5 * (1 + std::abs(want[i]))) << what << " element " << i;
  }
}

bool bitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Case {
  const char* name;
  AttentionShape shape;
  std::vector<SeqSpec> seqs;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      // One fresh prefill, multi-head.
      {"prefill_mha", {.num_heads = 2, .num_kv_heads = 2, .head_dim = 8}, {{0, 9}}},
      // GQA 8:2 (the tiny model's ratio), prefill chunk continuing a cached prefix.
      {"chunk_gqa", {.num_heads = 8, .num_kv_heads = 2, .head_dim = 16}, {{13, 7}}},
      // MQA, head_dim not a multiple of 8.
      {"decode_mqa", {.num_heads = 6, .num_kv_heads = 1, .head_dim = 12}, {{20, 1}}},
      // Mixed: fresh prefill, continuing chunk, two decodes.
      {"mixed_batch", {.num_heads = 4, .num_kv_heads = 2, .head_dim = 32}, {{0, 11}, {5, 6}, {30, 1}, {0, 1}}},
      // Long enough to cross many 64-key blocks of the kernel, chunks not aligned to them (the tiny model's shape).
      {"long_gqa", {.num_heads = 8, .num_kv_heads = 2, .head_dim = 32}, {{0, 150}, {70, 90}, {200, 1}, {63, 2}}},
      // head_dim above one vector and not a multiple of one; a group wider than the kernel's.
      {"long_wide_heads", {.num_heads = 12, .num_kv_heads = 2, .head_dim = 40}, {{0, 70}, {129, 3}}},
      // A decode batch: enough single-row chunks that one work item takes all KV heads of a chunk.
      {"decode_batch",
       {.num_heads = 8, .num_kv_heads = 2, .head_dim = 32},
       {{0, 1}, {200, 1}, {63, 1}, {64, 1}, {130, 1}, {5, 1}, {90, 1}, {17, 1}, {150, 1}, {31, 1}, {77, 1}, {1, 1}}},
  };
  return all;
}

TEST(PagedAttention, MatchesDenseReference) {
  CpuBackend backend;
  uint32_t seed = 1;
  for (const Case& c : cases()) {
    for (int32_t block_size : {1, 3, 4, 16}) {
      SCOPED_TRACE(::testing::Message() << c.name << " block_size=" << block_size);
      Fixture f = makeFixture(c.shape, block_size, c.seqs, seed++);
      KvStorage kv(f.layout);
      fillCache(f, kv, /*layer=*/1);
      expectMatchesReference(f, runAttention(backend, f, kv, 1), c.name);
    }
  }
}

TEST(PagedAttention, ReadsOnlyItsLayer) {
  CpuBackend backend;
  const Case& c = cases()[3];
  Fixture f = makeFixture(c.shape, 4, c.seqs, 99);
  KvStorage kv(f.layout);
  fillCache(f, kv, /*layer=*/1);
  const auto before = runAttention(backend, f, kv, 1);
  // Garbage in layer 0 must not change layer 1's result.
  for (int b = 0; b < f.layout.num_blocks; ++b) {
    float* lb = kv.layerBlock(0, BlockId(b));
    std::fill(lb, lb + f.layout.elementsPerLayerBlock(), 1e6f);
  }
  EXPECT_EQ(runAttention(backend, f, kv, 1), before);
}

// The engine's determinism rests on this: a row's output is bitwise the same
// whether its chunk runs alone, with others, split into pieces at any row, or
// as single rows.
TEST(PagedAttention, RowsIndependentOfBatchComposition) {
  CpuBackend backend;
  for (size_t case_index : {3, 4, 6}) {
    const Case& c = cases()[case_index];
    SCOPED_TRACE(c.name);
    Fixture f = makeFixture(c.shape, 3, c.seqs, 7);
    KvStorage kv(f.layout);
    fillCache(f, kv, 0);
    const auto batched = runAttention(backend, f, kv, 0);
    const size_t q_width = static_cast<size_t>(c.shape.num_heads * c.shape.head_dim);

    for (const ChunkDesc& chunk : f.chunks) {
      const float* q = f.q.data() + static_cast<size_t>(chunk.row_begin) * q_width;
      const float* want = batched.data() + static_cast<size_t>(chunk.row_begin) * q_width;
      // The chunk alone, at row 0.
      ChunkDesc alone = chunk;
      alone.row_begin = 0;
      std::vector<float> out(static_cast<size_t>(chunk.num_rows) * q_width);
      backend.attention(0, q, std::span<const ChunkDesc>(&alone, 1), kv, c.shape, out.data());
      EXPECT_EQ(std::memcmp(out.data(), want, out.size() * sizeof(float)), 0) << "chunk at row " << chunk.row_begin;
      // Split in two at every 7th row, both pieces in one call.
      for (int32_t split = 1; split < chunk.num_rows; split += 7) {
        const ChunkDesc pieces[2] = {
            {.row_begin = 0, .num_rows = split, .start_pos = chunk.start_pos, .block_table = chunk.block_table},
            {.row_begin = split,
             .num_rows = chunk.num_rows - split,
             .start_pos = chunk.start_pos + split,
             .block_table = chunk.block_table}};
        std::fill(out.begin(), out.end(), std::nanf(""));
        backend.attention(0, q, pieces, kv, c.shape, out.data());
        EXPECT_EQ(std::memcmp(out.data(), want, out.size() * sizeof(float)), 0)
            << "chunk at row " << chunk.row_begin << " split at " << split;
      }
      // Each row as a one-token chunk (a decode at that position).
      for (int32_t r = 0; r < chunk.num_rows; ++r) {
        ChunkDesc one{
            .row_begin = 0, .num_rows = 1, .start_pos = chunk.start_pos + r, .block_table = chunk.block_table};
        std::vector<float> row_out(q_width);
        backend.attention(0, q + static_cast<size_t>(r) * q_width, std::span<const ChunkDesc>(&one, 1), kv, c.shape,
                          row_out.data());
        EXPECT_EQ(std::memcmp(row_out.data(), want + static_cast<size_t>(r) * q_width, q_width * sizeof(float)), 0)
            << "row " << r << " of chunk at row " << chunk.row_begin;
      }
    }
  }
}

// Work is spread over a thread pool; how many threads must not change a bit.
TEST(PagedAttention, ThreadCountDoesNotChangeBits) {
  const Case& c = cases()[4];
  Fixture f = makeFixture(c.shape, 16, c.seqs, 11);
  KvStorage kv(f.layout);
  fillCache(f, kv, 0);
  CpuBackend single(CpuBackendOptions{.num_threads = 1});
  const auto want = runAttention(single, f, kv, 0);
  for (int threads : {2, 3, 5}) {
    CpuBackend pooled(CpuBackendOptions{.num_threads = threads});
    for (int rep = 0; rep < 3; ++rep)
      EXPECT_TRUE(bitwiseEqual(runAttention(pooled, f, kv, 0), want)) << threads << " threads";
  }
}

// Every SIMD level runs the same operations in the same order, so they agree
// bitwise (on the levels this machine supports; the portable one always runs).
TEST(PagedAttention, SimdLevelsAgreeBitwise) {
  for (size_t case_index : {1, 2, 4, 5, 6}) {
    const Case& c = cases()[case_index];
    SCOPED_TRACE(c.name);
    Fixture f = makeFixture(c.shape, 4, c.seqs, 13);
    KvStorage kv(f.layout);
    fillCache(f, kv, 0);
    CpuBackend portable(CpuBackendOptions{.simd = SimdLevel::kPortable});
    const auto want = runAttention(portable, f, kv, 0);
    expectMatchesReference(f, want, c.name);
    for (SimdLevel level : {SimdLevel::kAvx2, SimdLevel::kAvx512}) {
      if (!simdLevelSupported(level)) continue;
      CpuBackend vectorised(CpuBackendOptions{.simd = level});
      EXPECT_TRUE(bitwiseEqual(runAttention(vectorised, f, kv, 0), want)) << "level " << static_cast<int>(level);
    }
  }
}

// A bf16 pool (--kv-dtype bfloat16): writeKv stores each K and V element
// rounded to nearest even, and attention over it is bitwise attention over
// an fp32 pool holding those rounded values (widening is exact), on every
// path: packed prefill chunks, decodes packing their own keys, one item for
// all KV heads, every SIMD level.
TEST(PagedAttention, Bf16PoolIsAnFp32PoolOfRoundedValues) {
  for (const Case& c : cases()) {
    for (int32_t block_size : {3, 16}) {
      SCOPED_TRACE(::testing::Message() << c.name << " block_size=" << block_size);
      Fixture f = makeFixture(c.shape, block_size, c.seqs, 21);
      KvLayout bf16_layout = f.layout;
      bf16_layout.dtype = KvDtype::kBfloat16;
      KvStorage bf16(bf16_layout), rounded(f.layout);
      EXPECT_EQ(bf16.bytes().size() * 2, rounded.bytes().size());
      const size_t width = static_cast<size_t>(c.shape.num_kv_heads * c.shape.head_dim);
      CpuBackend writer;
      for (const Sequence& seq : f.seqs) {
        const int32_t len = seq.spec.start_pos + seq.spec.num_rows;
        const ChunkDesc all{.row_begin = 0, .num_rows = len, .start_pos = 0, .block_table = seq.block_table};
        writer.writeKv(1, seq.k.data(), seq.v.data(), std::span<const ChunkDesc>(&all, 1), bf16);
        for (int32_t p = 0; p < len; ++p) {
          const BlockId block = seq.block_table[static_cast<size_t>(p / block_size)];
          const int32_t slot = p % block_size;
          for (size_t i = 0; i < width; ++i) {
            const float k = kmath::roundToBf16(seq.k[static_cast<size_t>(p) * width + i]);
            const float v = kmath::roundToBf16(seq.v[static_cast<size_t>(p) * width + i]);
            ASSERT_EQ(bf16.keyAt(1, block, slot, i), k) << "position " << p << " element " << i;
            ASSERT_EQ(bf16.valueAt(1, block, slot, i), v) << "position " << p << " element " << i;
            rounded.key(1, block, slot)[i] = k;
            rounded.value(1, block, slot)[i] = v;
          }
        }
      }
      for (SimdLevel level : {SimdLevel::kPortable, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
        if (!simdLevelSupported(level)) continue;
        CpuBackend backend(CpuBackendOptions{.simd = level});
        EXPECT_TRUE(bitwiseEqual(runAttention(backend, f, bf16, 1), runAttention(backend, f, rounded, 1)))
            << "level " << static_cast<int>(level);
      }
    }
  }
}

// Large score spread: a naive exp without max subtraction would overflow.
TEST(PagedAttention, SoftmaxIsStableForLargeScores) {
  CpuBackend backend;
  AttentionShape shape{.num_heads = 2, .num_kv_heads = 1, .head_dim = 8};
  Fixture f = makeFixture(shape, 4, {{6, 3}}, 5);
  for (float& x : f.q) x *= 400.0f;  // scores in the thousands
  KvStorage kv(f.layout);
  fillCache(f, kv, 0);
  const auto got = runAttention(backend, f, kv, 0);
  for (float x : got) ASSERT_TRUE(std::isfinite(x));
  expectMatchesReference(f, got, "large scores");
}

}  // namespace
}  // namespace tandem::engine
