// Every portable CUDA kernel (engine/backend/cuda/kernels.h), run on the CPU
// through the executor (KernelBackend), against the CPU backend on the same
// inputs: bitwise where the arithmetic is the same by design (RMSNorm, RoPE,
// SwiGLU, bias, gather, KV write), within a stated tolerance for attention,
// over shapes at the edges (one element, widths around multiples of 8 and of
// the block, positions past the CPU's RoPE table, GQA ratios 1 to 4, head
// sizes that are not multiples of 32, block sizes that are not powers of 2,
// one-token chunks, split boundaries and the split cap). Attention is also
// held to batch invariance (a row's bits alone = in any batch or chunking).
// CTest runs this file again with the executor shuffling thread order
// (kernels_test.shuffle), which a missing barrier would not survive.
// Launch shapes are checked against the H100's and H200's limits.

#include <cmath>
#include <cstring>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/cuda/device_limits.h"
#include "engine/backend/cuda/kernel_backend.h"
#include "engine/backend/cuda/kernels.h"
#include "engine/backend/kernel_math.h"
#include "src/common/block_hash.h"

namespace tandem::engine {
namespace {

std::vector<float> randomFloats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

bool sameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class KernelsTest : public ::testing::Test {
 protected:
  void TearDown() override { EXPECT_TRUE(gpu_.status().ok()) << gpu_.status(); }
  // `v` as the kernel backend's memory, in place (its residentWeight is the
  // host memory itself, tracked): the backend refuses any other pointer.
  template <typename T>
  T* on(std::vector<T>& v) {
    const std::span<const float> floats(reinterpret_cast<const float*>(v.data()), v.size() * sizeof(T) / sizeof(float));
    adopted_.push_back(gpu_.residentWeight(floats));
    return v.data();
  }
  template <typename T>
  const T* on(const std::vector<T>& v) {
    return on(const_cast<std::vector<T>&>(v));
  }
  CpuBackend cpu_{CpuBackendOptions{.num_threads = 1}};
  KernelBackend gpu_;
  std::vector<std::unique_ptr<BackendBuffer>> adopted_;
};

TEST_F(KernelsTest, RmsNormIsBitwiseTheCpuBackendsAtEveryWidth) {
  for (int dim : {1, 7, 8, 9, 16, 64, 100, 255, 4097}) {
    for (int rows : {1, 3}) {
      const std::vector<float> x = randomFloats(static_cast<size_t>(rows * dim), 11 + dim, 3.0f);
      const std::vector<float> w = randomFloats(static_cast<size_t>(dim), 12 + dim);
      std::vector<float> a(x.size()), b(x.size());
      cpu_.rmsNorm(x.data(), w.data(), a.data(), rows, dim, 1e-6f);
      gpu_.rmsNorm(on(x), on(w), on(b), rows, dim, 1e-6f);
      EXPECT_TRUE(sameBits(a, b)) << "dim " << dim << " rows " << rows;
      // In place, as the model calls it.
      std::vector<float> in_place = x;
      gpu_.rmsNorm(on(in_place), on(w), in_place.data(), rows, dim, 1e-6f);
      EXPECT_TRUE(sameBits(a, in_place)) << "in place, dim " << dim;
    }
  }
}

TEST_F(KernelsTest, RopeIsBitwiseTheCpuBackendsPastItsTableToo) {
  for (int head_dim : {2, 32, 64, 128}) {
    const int heads = 3;
    std::vector<float> inv_freq;
    for (int i = 0; i < head_dim / 2; ++i) inv_freq.push_back(kmath::ropeInvFreq(i, head_dim, 500000.0f));
    // 40000 is past the CPU backend's cos/sin table (it computes those rows directly).
    const std::vector<int32_t> positions = {0, 1, 2, 63, 1000, 32767, 32768, 40000};
    const auto rows = static_cast<int32_t>(positions.size());
    const std::vector<float> x = randomFloats(static_cast<size_t>(rows * heads * head_dim), 20 + head_dim);
    std::vector<float> a = x, b = x;
    cpu_.rope(a.data(), rows, heads, head_dim, positions.data(), inv_freq);
    gpu_.rope(on(b), rows, heads, head_dim, positions.data(), inv_freq);
    EXPECT_TRUE(sameBits(a, b)) << "head_dim " << head_dim;
  }
}

TEST_F(KernelsTest, SwigluBiasAddAndGatherAreBitwiseTheCpuBackends) {
  for (int64_t n : {int64_t{1}, int64_t{255}, int64_t{256}, int64_t{257}, int64_t{70000}, int64_t{1} << 21}) {
    std::vector<float> gate = randomFloats(static_cast<size_t>(n), 30, 4.0f);
    const std::vector<float> up = randomFloats(static_cast<size_t>(n), 31);
    if (n > 4) {  // e^x's clamps, and zero
      gate[0] = -100.0f;
      gate[1] = 100.0f;
      gate[2] = 0.0f;
      gate[3] = -0.0f;
    }
    std::vector<float> a(gate.size()), b(gate.size());
    cpu_.swiglu(gate.data(), up.data(), a.data(), n);
    gpu_.swiglu(on(gate), on(up), on(b), n);
    EXPECT_TRUE(sameBits(a, b)) << "swiglu n " << n;
  }
  for (auto [rows, dim] : {std::pair{1, 1}, {3, 96}, {17, 300}}) {
    const std::vector<float> y = randomFloats(static_cast<size_t>(rows * dim), 40);
    const std::vector<float> bias = randomFloats(static_cast<size_t>(dim), 41);
    std::vector<float> a = y, b = y;
    cpu_.addBias(a.data(), bias.data(), rows, dim);
    gpu_.addBias(on(b), on(bias), rows, dim);
    EXPECT_TRUE(sameBits(a, b)) << "bias " << rows << "x" << dim;
  }
  for (int64_t n : {int64_t{1}, int64_t{257}, int64_t{70000}}) {  // a tensor-parallel rank's residual add
    const std::vector<float> x = randomFloats(static_cast<size_t>(n), 42), y = randomFloats(static_cast<size_t>(n), 43);
    std::vector<float> a = x, b = x;
    cpu_.add(a.data(), y.data(), n);
    gpu_.add(on(b), on(y), n);
    EXPECT_TRUE(sameBits(a, b)) << "add n " << n;
  }
  const std::vector<float> table = randomFloats(50 * 72, 50);
  const std::vector<int32_t> ids = {49, 0, 7, 7, 13};
  std::vector<float> a(ids.size() * 72), b(ids.size() * 72);
  cpu_.gatherRows(table.data(), ids.data(), static_cast<int32_t>(ids.size()), 72, a.data());
  gpu_.gatherRows(on(table), ids.data(), static_cast<int32_t>(ids.size()), 72, on(b));
  EXPECT_TRUE(sameBits(a, b));
}

// The embedding lookup: with fp32 projections the table's own values; with
// bf16 projections (--dtype bfloat16) the table is kept in bf16 (half the
// bytes) and each value read is its bf16 rounding, bitwise the CPU
// backend's bf16 mode and the rounding of the fp32 value.
TEST_F(KernelsTest, EmbeddingIsTheTablesValuesOrTheirBf16RoundingBitwiseTheCpuBackends) {
  const int32_t dim = 72;
  const std::vector<float> table = randomFloats(50 * dim, 51, 3.0f);
  const std::vector<int32_t> ids = {49, 0, 7, 7, 13};
  const auto n = static_cast<int32_t>(ids.size());
  for (GemmDtype dtype : {GemmDtype::kFloat32, GemmDtype::kBfloat16}) {
    const bool bf16 = dtype == GemmDtype::kBfloat16;
    SCOPED_TRACE(gemmDtypeName(dtype));
    CpuBackend cpu(CpuBackendOptions{.num_threads = 1, .gemm_dtype = dtype});
    KernelBackend gpu(KernelBackendOptions{.gemm = {.gemm_dtype = dtype}});
    const auto cpu_table = cpu.prepareEmbedding(table, dim);
    const auto gpu_table = gpu.prepareEmbedding(table, dim);
    ASSERT_TRUE(cpu_table && gpu_table) << gpu.status();
    EXPECT_EQ(gpu_table->bf16(), bf16);
    EXPECT_EQ(gpu_table->rows(), 50);
    EXPECT_EQ(gpu_table->bytes(), table.size() * (bf16 ? 2 : 4));
    std::vector<float> a(ids.size() * dim), b(ids.size() * dim), want(ids.size() * dim);
    cpu.embed(*cpu_table, ids.data(), n, a.data());
    auto out = gpu.allocate(b.size());
    gpu.embed(*gpu_table, ids.data(), n, out->data());
    gpu.finishKvCopies();  // synchronizes: the launch has run (the executor's memory is the host's)
    std::memcpy(b.data(), out->data(), b.size() * sizeof(float));
    for (size_t r = 0; r < ids.size(); ++r) {
      for (int32_t i = 0; i < dim; ++i) {
        const float v = table[static_cast<size_t>(ids[r]) * dim + static_cast<size_t>(i)];
        want[r * dim + static_cast<size_t>(i)] = bf16 ? kmath::roundToBf16(v) : v;
      }
    }
    EXPECT_TRUE(sameBits(a, want));
    EXPECT_TRUE(sameBits(b, want));
    EXPECT_TRUE(gpu.status().ok()) << gpu.status();
  }
}

// ---- Paged KV: write and attention ------------------------------------------

struct AttentionCase {
  std::string name;
  AttentionShape shape;
  int block_size;
  KvDtype kv_dtype = KvDtype::kFloat32;
};
void PrintTo(const AttentionCase& c, std::ostream* os) { *os << c.name; }

// A chunk with its own block table (blocks drawn from a shuffled pool).
struct TestChunk {
  int32_t start_pos, num_rows;
  std::vector<BlockId> table;
};

class PagedKernelsTest : public KernelsTest, public ::testing::WithParamInterface<AttentionCase> {
 protected:
  static constexpr int kLayers = 2;
  // Enough blocks for every test's chunks (about 11,000 positions in all).
  static int numBlocks() { return 13000 / GetParam().block_size + 100; }

  KvLayout layout() const {
    const AttentionCase& c = GetParam();
    return {kLayers, numBlocks(), c.block_size, c.shape.num_kv_heads, c.shape.head_dim, c.kv_dtype};
  }
  // Chunks whose block tables use distinct blocks of the pool.
  std::vector<TestChunk> makeChunks(const std::vector<std::pair<int32_t, int32_t>>& spans) {
    std::vector<int32_t> pool(static_cast<size_t>(numBlocks()));
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), std::mt19937(5));
    size_t next = 0;
    std::vector<TestChunk> out;
    for (auto [start, rows] : spans) {
      TestChunk c{start, rows, {}};
      for (int32_t i = 0; i < kmath::blocksFor(start + rows, GetParam().block_size); ++i) {
        c.table.push_back(BlockId(pool.at(next++)));
      }
      out.push_back(std::move(c));
    }
    return out;
  }
  static std::vector<ChunkDesc> descs(const std::vector<TestChunk>& chunks) {
    std::vector<ChunkDesc> d;
    int32_t row = 0;
    for (const TestChunk& c : chunks) {
      d.push_back({row, c.num_rows, c.start_pos, c.table});
      row += c.num_rows;
    }
    return d;
  }
  static int32_t totalRows(const std::vector<TestChunk>& chunks) {
    int32_t n = 0;
    for (const TestChunk& c : chunks) n += c.num_rows;
    return n;
  }
  // Fills the pool with random K and V (a bf16 pool: their bf16 roundings).
  static void randomize(KvStorage& kv, uint32_t seed) {
    const std::vector<float> v = randomFloats(kv.layout().totalElements(), seed);
    if (kv.layout().dtype == KvDtype::kFloat32) {
      std::memcpy(kv.bytes().data(), v.data(), v.size() * sizeof(float));
      return;
    }
    for (size_t i = 0; i < v.size(); ++i) {
      const uint16_t h = kmath::bf16Bits(v[i]);
      std::memcpy(kv.bytes().data() + 2 * i, &h, 2);
    }
  }
  std::vector<float> attend(Backend& b, const std::vector<TestChunk>& chunks, const KvStorage& kv,
                            const std::vector<float>& q, int layer = 1) {
    const AttentionShape& s = GetParam().shape;
    std::vector<float> out(static_cast<size_t>(totalRows(chunks)) * s.num_heads * s.head_dim);
    const std::vector<ChunkDesc> d = descs(chunks);
    b.attention(layer, on(q), d, kv, s, on(out));  // (on: backend memory for gpu_; the CPU backend takes any)
    return out;
  }
  std::vector<float> queries(int32_t rows, uint32_t seed) {
    const AttentionShape& s = GetParam().shape;
    return randomFloats(static_cast<size_t>(rows) * s.num_heads * s.head_dim, seed);
  }
};

TEST_P(PagedKernelsTest, WriteKvIsBitwiseTheCpuBackends) {
  const std::vector<TestChunk> chunks = makeChunks({{0, 45}, {37, 20}, {0, 1}, {511, 1}, {1500, 1}});
  const int32_t rows = totalRows(chunks);
  const size_t width = static_cast<size_t>(layout().num_kv_heads) * layout().head_dim;
  const std::vector<float> k = randomFloats(rows * width, 60), v = randomFloats(rows * width, 61);
  KvStorage a(layout()), b(layout());
  const std::vector<ChunkDesc> d = descs(chunks);
  cpu_.writeKv(1, k.data(), v.data(), d, a);
  gpu_.writeKv(1, on(k), on(v), d, b);
  EXPECT_EQ(std::memcmp(a.bytes().data(), b.bytes().data(), a.bytes().size()), 0);
}

TEST_P(PagedKernelsTest, CopyKvBlockIsBitwiseKvStoragesCopy) {
  KvStorage a(layout()), b(layout());
  randomize(a, 65);
  std::memcpy(b.bytes().data(), a.bytes().data(), a.bytes().size());
  for (auto [src, dst] : {std::pair{3, 7}, {0, numBlocks() - 1}, {numBlocks() - 1, 1}}) {
    a.copyBlock(BlockId(src), BlockId(dst));
    gpu_.copyKvBlock(b, BlockId(src), BlockId(dst));
  }
  EXPECT_EQ(std::memcmp(a.bytes().data(), b.bytes().data(), a.bytes().size()), 0);
}

// The P/D checksums of a device pool (kvChecksumKernel) are XXH64's, the
// library's, bit for bit: over layer blocks whose sizes hit every branch of
// the hash (under one 32-byte stripe, whole stripes, stripes with 8-byte and
// 4-byte tails), for blocks in any order, repeated, across launch blocks
// (more than kChecksumBlocksPerLaunchBlock), on every layer, and every
// layer's in one launch.
TEST_F(KernelsTest, KvChecksumIsXxh64OfEachLayerBlock) {
  struct Shape {
    int block_size, heads, head_dim;
    KvDtype dtype;
  };
  // Layer block bytes: 4, 12, 36, 60, 40, 4352, 3584.
  for (const Shape& s :
       {Shape{1, 1, 1, KvDtype::kBfloat16}, Shape{1, 1, 3, KvDtype::kBfloat16}, Shape{1, 1, 9, KvDtype::kBfloat16},
        Shape{1, 1, 15, KvDtype::kBfloat16}, Shape{1, 1, 5, KvDtype::kFloat32}, Shape{16, 2, 34, KvDtype::kBfloat16},
        Shape{7, 2, 64, KvDtype::kFloat32}}) {
    const KvLayout layout{.num_layers = 3,
                          .num_blocks = 70,
                          .block_size = s.block_size,
                          .num_kv_heads = s.heads,
                          .head_dim = s.head_dim,
                          .dtype = s.dtype};
    SCOPED_TRACE(testing::Message() << "layer block of " << layout.bytesPerLayerBlock() << " bytes");
    KvStorage host(layout);
    std::mt19937 rng(80);
    for (std::byte& b : host.bytes()) b = static_cast<std::byte>(rng());
    auto memory = gpu_.kvMemory(layout.totalBytes());
    ASSERT_TRUE(memory.ok()) << memory.status();
    KvStorage device(layout, std::move(*memory));
    gpu_.uploadKv(device, 0, host.bytes());
    gpu_.finishKvCopies();
    std::vector<BlockId> blocks;
    for (int i = 0; i < 40; ++i) blocks.push_back(BlockId((i * 37 + 5) % layout.num_blocks));
    blocks.push_back(BlockId(0));
    blocks.push_back(BlockId(layout.num_blocks - 1));
    blocks.push_back(blocks.front());  // a block twice
    // Each layer alone, then every layer's blocks in one launch.
    std::vector<KvLayerBlock> all;
    for (int layer = 0; layer <= layout.num_layers; ++layer) {
      std::vector<KvLayerBlock> items;
      if (layer < layout.num_layers) {
        for (BlockId b : blocks) items.push_back({.layer = layer, .block = b});
        all.insert(all.end(), items.begin(), items.end());
      } else {
        items.assign(all.rbegin(), all.rend());  // layers mixed, last first
      }
      std::vector<uint64_t> want(items.size()), got(items.size(), 0), cpu(items.size(), 0);
      for (size_t i = 0; i < items.size(); ++i) {
        want[i] =
            layerBlockChecksum({host.layerBlockBytes(items[i].layer, items[i].block), layout.bytesPerLayerBlock()});
      }
      gpu_.checksumKv(device, items, got);
      EXPECT_EQ(want, got) << (layer < layout.num_layers ? "layer " + std::to_string(layer) : "every layer");
      // The CPU backend's, on the host pool: the same.
      cpu_.checksumKv(host, items, cpu);
      EXPECT_EQ(want, cpu);
    }
  }
}

// The CPU backend's softmax is base 2 over 64-key blocks with a lazy rescale;
// the kernel's is base e over 32-key tiles: the same math in a different
// order and with different e^x approximations (both ~1e-7 relative), over up
// to 9,000 keys. Outputs are weighted means of N(0, 1) values; the largest
// difference measured over these shapes is 2e-6.
constexpr float kAttentionTolerance = 1e-5f;

TEST_P(PagedKernelsTest, AttentionMatchesTheCpuBackendWithinTolerance) {
  KvStorage kv(layout());
  randomize(kv, 70);
  // A prompt, a later chunk of one, a one-token prompt, decodes around the
  // first split boundary (512), three splits, and past the 16-split cap.
  const std::vector<TestChunk> chunks =
      makeChunks({{0, 45}, {37, 20}, {0, 1}, {510, 1}, {511, 1}, {512, 1}, {1500, 1}, {9000, 1}});
  const std::vector<float> q = queries(totalRows(chunks), 71);
  const std::vector<float> want = attend(cpu_, chunks, kv, q);
  const std::vector<float> got = attend(gpu_, chunks, kv, q);
  ASSERT_EQ(want.size(), got.size());
  float worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << i;
    worst = std::max(worst, std::fabs(got[i] - want[i]) / std::max(1.0f, std::fabs(want[i])));
  }
  EXPECT_LE(worst, kAttentionTolerance);
  RecordProperty("max_error", std::to_string(worst));
}

TEST_P(PagedKernelsTest, AttentionRowsAreBatchInvariant) {
  KvStorage kv(layout());
  randomize(kv, 80);
  // One call with everything, against each chunk alone and the prompt chunked.
  const std::vector<TestChunk> all = makeChunks({{0, 45}, {1500, 1}, {9000, 1}, {600, 3}});
  const std::vector<float> q = queries(totalRows(all), 81);
  const std::vector<float> together = attend(gpu_, all, kv, q);
  const AttentionShape& s = GetParam().shape;
  const size_t width = static_cast<size_t>(s.num_heads) * s.head_dim;
  size_t row = 0;
  for (const TestChunk& c : all) {
    // The chunk alone, then split in two chunks of the same sequence.
    std::vector<float> qc(q.begin() + static_cast<long>(row * width),
                          q.begin() + static_cast<long>((row + c.num_rows) * width));
    const std::vector<float> alone = attend(gpu_, {c}, kv, qc);
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), together.begin() + static_cast<long>(row * width)))
        << "chunk at " << c.start_pos;
    if (c.num_rows > 1) {
      const int32_t first = c.num_rows / 2;
      TestChunk head{c.start_pos, first, c.table}, tail{c.start_pos + first, c.num_rows - first, c.table};
      std::vector<float> q1(qc.begin(), qc.begin() + static_cast<long>(first * width));
      std::vector<float> q2(qc.begin() + static_cast<long>(first * width), qc.end());
      std::vector<float> split = attend(gpu_, {head}, kv, q1);
      const std::vector<float> rest = attend(gpu_, {tail}, kv, q2);
      split.insert(split.end(), rest.begin(), rest.end());
      EXPECT_TRUE(sameBits(split, alone)) << "chunked at " << c.start_pos;
    }
    row += static_cast<size_t>(c.num_rows);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PagedKernelsTest,
                         ::testing::Values(AttentionCase{"mha_d32_b16", {4, 4, 32}, 16},
                                           AttentionCase{"gqa4_d64_b7", {8, 2, 64}, 7},
                                           AttentionCase{"gqa2_d48_b32", {6, 3, 48}, 32},
                                           AttentionCase{"mqa_d256_b16", {2, 1, 256}, 16},
                                           // A bf16 pool (--kv-dtype bfloat16): K in 8-byte loads, and
                                           // a head_dim that is no multiple of 4 (every element alone).
                                           AttentionCase{"gqa4_d64_b7_bf16", {8, 2, 64}, 7, KvDtype::kBfloat16},
                                           AttentionCase{"gqa2_d34_b16_bf16", {4, 2, 34}, 16, KvDtype::kBfloat16},
                                           AttentionCase{"mqa_d256_b16_bf16", {2, 1, 256}, 16, KvDtype::kBfloat16}),
                         [](const ::testing::TestParamInfo<AttentionCase>& i) { return i.param.name; });

TEST(KernelLaunchTest, EveryLaunchShapeFitsTheSupportedGpus) {
  // The largest shapes the engine asks for: 8192-row prefill steps, 128
  // heads of 256, a 2^31-element SwiGLU, the split cap.
  const std::vector<std::pair<std::string, gpu::LaunchConfig>> launches = {
      {"rmsNorm", gpu::rmsNormLaunch(8192 * 128)},
      {"rope", gpu::ropeLaunch(8192)},
      {"elementwise", gpu::elementwiseLaunch(int64_t{1} << 31)},
      {"gatherRows", gpu::gatherRowsLaunch(8192)},
      {"writeKv", gpu::writeKvLaunch(8192)},
      {"copyKvBlock", gpu::copyKvBlockLaunch(128, size_t{2} * 128 * 8 * 128)},
      {"kvChecksum", gpu::kvChecksumLaunch(1 << 20)},
      {"attentionSplit (MHA)",
       gpu::attentionSplitLaunch(8192, 128, 128, gpu::kAttentionMaxSplits, gpu::kAttentionMaxHeadDim)},
      {"attentionSplit (GQA, the most heads per block)",
       gpu::attentionSplitLaunch(8192, 128, 128 / gpu::kAttentionMaxHeadsPerBlock, gpu::kAttentionMaxSplits,
                                 gpu::kAttentionMaxHeadDim)},
      {"attentionCombine", gpu::attentionCombineLaunch(8192, 128)},
  };
  for (const gpu::DeviceLimits& d : gpu::kSupportedDevices) {
    for (const auto& [name, c] : launches) {
      EXPECT_LE(static_cast<int>(c.block.x), d.max_threads_per_block) << d.name << " " << name;
      EXPECT_EQ(c.block.x % static_cast<uint32_t>(d.warp_size), 0u) << d.name << " " << name;
      EXPECT_LE(c.grid.x, d.max_grid_x) << d.name << " " << name;
      EXPECT_LE(c.grid.y, d.max_grid_y) << d.name << " " << name;
      EXPECT_LE(c.grid.z, d.max_grid_z) << d.name << " " << name;
      EXPECT_LE(c.shared_bytes, d.max_shared_bytes_default) << d.name << " " << name;
    }
  }
}

}  // namespace
}  // namespace tandem::engine
