#include "engine/backend/kernel_math.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "engine/kv/kv_storage.h"

namespace tandem::engine {
namespace {

TEST(KernelMath, PositionMapsToBlockAndSlot) {
  EXPECT_EQ(kmath::blockIndexOf(0, 16), 0);
  EXPECT_EQ(kmath::slotOf(0, 16), 0);
  EXPECT_EQ(kmath::blockIndexOf(15, 16), 0);
  EXPECT_EQ(kmath::slotOf(15, 16), 15);
  EXPECT_EQ(kmath::blockIndexOf(16, 16), 1);
  EXPECT_EQ(kmath::slotOf(16, 16), 0);
  EXPECT_EQ(kmath::blockIndexOf(37, 5), 7);
  EXPECT_EQ(kmath::slotOf(37, 5), 2);
  for (int32_t block_size : {1, 3, 16}) {
    for (int32_t pos = 0; pos < 100; ++pos) {
      const int32_t b = kmath::blockIndexOf(pos, block_size);
      const int32_t s = kmath::slotOf(pos, block_size);
      EXPECT_EQ(b * block_size + s, pos);
      EXPECT_GE(s, 0);
      EXPECT_LT(s, block_size);
    }
  }
}

TEST(KernelMath, BlocksForRoundsUp) {
  EXPECT_EQ(kmath::blocksFor(0, 16), 0);
  EXPECT_EQ(kmath::blocksFor(1, 16), 1);
  EXPECT_EQ(kmath::blocksFor(16, 16), 1);
  EXPECT_EQ(kmath::blocksFor(17, 16), 2);
  EXPECT_EQ(kmath::blocksFor(7, 1), 7);
}

// The device-side offset must address exactly what KvStorage::key/value return.
TEST(KernelMath, KvOffsetMatchesKvStorage) {
  KvLayout layout{.num_layers = 3, .num_blocks = 5, .block_size = 4, .num_kv_heads = 2, .head_dim = 6};
  KvStorage kv(layout);
  const float* base = kv.key(0, BlockId(0), 0);
  for (int layer = 0; layer < layout.num_layers; ++layer) {
    for (int block = 0; block < layout.num_blocks; ++block) {
      for (int slot = 0; slot < layout.block_size; ++slot) {
        for (int head = 0; head < layout.num_kv_heads; ++head) {
          const size_t k_off = kmath::kvOffset(layer, block, false, slot, head, layout.num_blocks, layout.block_size,
                                               layout.num_kv_heads, layout.head_dim);
          const size_t v_off = kmath::kvOffset(layer, block, true, slot, head, layout.num_blocks, layout.block_size,
                                               layout.num_kv_heads, layout.head_dim);
          EXPECT_EQ(base + k_off, kv.key(layer, BlockId(block), slot) + head * layout.head_dim);
          EXPECT_EQ(base + v_off, kv.value(layer, BlockId(block), slot) + head * layout.head_dim);
        }
      }
    }
  }
}

TEST(KernelMath, GqaHeadMapping) {
  // 8 query heads over 2 KV heads: groups of 4 consecutive heads (HF repeat_kv).
  const std::vector<int32_t> want = {0, 0, 0, 0, 1, 1, 1, 1};
  for (int32_t h = 0; h < 8; ++h) EXPECT_EQ(kmath::kvHeadFor(h, 8, 2), want[static_cast<size_t>(h)]) << h;
  for (int32_t h = 0; h < 4; ++h) EXPECT_EQ(kmath::kvHeadFor(h, 4, 4), h);  // MHA
  for (int32_t h = 0; h < 6; ++h) EXPECT_EQ(kmath::kvHeadFor(h, 6, 1), 0);  // MQA
  EXPECT_EQ(kmath::kvHeadFor(5, 6, 3), 2);
}

TEST(KernelMath, CausalVisibilityAndScale) {
  EXPECT_EQ(kmath::visibleKeys(0, 0), 1);
  EXPECT_EQ(kmath::visibleKeys(10, 0), 11);
  EXPECT_EQ(kmath::visibleKeys(10, 4), 15);
  EXPECT_FLOAT_EQ(kmath::attentionScale(64), 0.125f);
  EXPECT_FLOAT_EQ(kmath::attentionScale(32), static_cast<float>(1.0 / std::sqrt(32.0)));
}

TEST(KernelMath, RopeFrequencies) {
  EXPECT_FLOAT_EQ(kmath::ropeInvFreq(0, 32, 10000.0f), 1.0f);
  for (int i = 0; i < 16; ++i) {
    EXPECT_FLOAT_EQ(kmath::ropeInvFreq(i, 32, 10000.0f), static_cast<float>(std::pow(10000.0, -2.0 * i / 32.0))) << i;
  }
  EXPECT_FLOAT_EQ(kmath::ropeInvFreq(3, 128, 500000.0f), static_cast<float>(std::pow(500000.0, -6.0 / 128.0)));
  EXPECT_EQ(kmath::ropeAngle(0, 5, 32, 10000.0f), 0.0f);
  EXPECT_FLOAT_EQ(kmath::ropeAngle(7, 1, 32, 10000.0f), 7.0f * static_cast<float>(std::pow(10000.0, -2.0 / 32.0)));
}

TEST(KernelMath, RopeRotatesHalfPairs) {
  const int32_t head_dim = 8;
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<float> orig = x;
  std::vector<float> c(4), s(4);
  const int32_t pos = 3;
  for (int32_t i = 0; i < 4; ++i) kmath::ropeCosSin(pos, i, head_dim, 10000.0f, &c[i], &s[i]);
  kmath::ropeRotateHead(x.data(), c.data(), s.data(), head_dim);
  for (int32_t i = 0; i < 4; ++i) {
    // Pair (i, i + 4) rotated by pos * theta^(-2i/d), computed independently.
    const double angle = pos * std::pow(10000.0, -2.0 * i / head_dim);
    const double a = orig[static_cast<size_t>(i)], b = orig[static_cast<size_t>(i + 4)];
    EXPECT_NEAR(x[static_cast<size_t>(i)], a * std::cos(angle) - b * std::sin(angle), 1e-5) << i;
    EXPECT_NEAR(x[static_cast<size_t>(i + 4)], b * std::cos(angle) + a * std::sin(angle), 1e-5) << i;
  }
  // Position 0 is the identity.
  std::vector<float> y = orig;
  for (int32_t i = 0; i < 4; ++i) kmath::ropeCosSin(0, i, head_dim, 10000.0f, &c[i], &s[i]);
  kmath::ropeRotateHead(y.data(), c.data(), s.data(), head_dim);
  EXPECT_EQ(y, orig);
}

TEST(KernelMath, Swiglu) {
  for (float g : {-4.0f, -0.5f, 0.0f, 0.3f, 2.0f, 9.0f}) {
    for (float u : {-1.5f, 0.0f, 2.0f}) {
      const double want = g / (1.0 + std::exp(-static_cast<double>(g))) * u;
      EXPECT_NEAR(kmath::swiglu(g, u), want, 1e-6 * (1 + std::abs(want))) << g << " " << u;
    }
  }
}

// bf16: round to nearest, ties to even; NaN stays a quiet NaN; overflow to
// infinity; widening is exact; and the safetensors conversions are these.
TEST(KernelMath, Bf16RoundsToNearestEven) {
  EXPECT_EQ(kmath::bf16Bits(1.0f), 0x3f80);
  EXPECT_EQ(kmath::bf16Value(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to the even (1).
  EXPECT_EQ(kmath::bf16Bits(1.0f + 0x1p-8f), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: to 1 + 2^-6.
  EXPECT_EQ(kmath::bf16Bits(1.0f + 3 * 0x1p-8f), 0x3f82);
  // Just above halfway rounds up.
  EXPECT_EQ(kmath::bf16Bits(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
  EXPECT_EQ(kmath::bf16Bits(-2.0f), 0xc000);
  EXPECT_EQ(kmath::bf16Bits(INFINITY), 0x7f80);
  EXPECT_EQ(kmath::bf16Bits(3.4e38f), 0x7f80);  // past bf16's largest finite value
  const uint16_t nan = kmath::bf16Bits(std::nanf(""));
  EXPECT_TRUE(std::isnan(kmath::bf16Value(nan)));
  // A signalling NaN whose payload sits in the low bits only stays a NaN.
  uint32_t snan_bits = 0x7f800001u;
  float snan;
  std::memcpy(&snan, &snan_bits, sizeof(snan));
  EXPECT_TRUE(std::isnan(kmath::bf16Value(kmath::bf16Bits(snan))));
  for (uint32_t h = 0; h < 0x10000; h += 37) {
    const auto bits = static_cast<uint16_t>(h);
    const float v = kmath::bf16Value(bits);
    if (std::isnan(v)) continue;
    EXPECT_EQ(kmath::bf16Bits(v), bits) << h;  // exact both ways
    EXPECT_EQ(kmath::roundToBf16(v), v) << h;
  }
}

}  // namespace
}  // namespace tandem::engine
