#include "engine/kv/layer_announcer.h"

#include <gtest/gtest.h>

#include <random>

namespace tandem::engine {
namespace {

constexpr int kBlockSize = 4;

// A leased prefill of `prompt_len` tokens whose prompt blocks (ids 10, 11,
// ...) were allocated and reported at admission.
std::unique_ptr<Sequence> leasedPrefill(int prompt_len) {
  RequestSpec spec;
  spec.lease = LeaseSpec{.id = 1};
  auto s = std::make_unique<Sequence>(RequestId(9), std::move(spec), kBlockSize);
  s->tokens.assign(static_cast<size_t>(prompt_len), 5);
  s->num_prompt_tokens = prompt_len;
  for (int i = 0; i < (prompt_len + kBlockSize - 1) / kBlockSize; ++i) s->blocks.push_back(BlockId(10 + i));
  s->kv_blocks_reported = true;
  return s;
}

std::vector<int> ids(std::span<const BlockId> blocks) {
  std::vector<int> out;
  for (BlockId b : blocks) out.push_back(b.value());
  return out;
}

TEST(LayerAnnouncerTest, EarlierChunksAnnounceAfterTheRunTheLastDuringIt) {
  // 10 tokens in chunks of 4, 3 and 3: blocks [10, 11, 12].
  LayerAnnouncer a(kBlockSize);
  auto s = leasedPrefill(10);
  EXPECT_EQ(a.numPromptBlocks(*s), 3u);

  EXPECT_FALSE(a.duringRun({s.get(), 4}).has_value());
  s->num_computed = 4;
  auto first = a.afterRun(*s);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->id, RequestId(9));
  EXPECT_EQ(first->first_block, 0u);
  EXPECT_EQ(ids(first->blocks), std::vector<int>{10});

  EXPECT_FALSE(a.duringRun({s.get(), 3}).has_value());
  s->num_computed = 7;
  EXPECT_FALSE(a.afterRun(*s).has_value()) << "block 11 is not full yet";

  auto last = a.duringRun({s.get(), 3});
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->first_block, 1u);
  EXPECT_EQ(ids(last->blocks), (std::vector<int>{11, 12})) << "the partial last block included";
  s->num_computed = 10;
  EXPECT_FALSE(a.afterRun(*s).has_value()) << "announced during the run already";
  EXPECT_EQ(s->blocks_announced, 3);
}

TEST(LayerAnnouncerTest, EveryBlockIsAnnouncedExactlyOnceInOrderWhateverTheChunking) {
  LayerAnnouncer a(kBlockSize);
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const int len = 1 + static_cast<int>(rng() % 40);
    auto s = leasedPrefill(len);
    std::vector<int> count(s->blocks.size(), 0);
    size_t next = 0;  // announcements come in block order
    auto record = [&](const LayerReady& r) {
      EXPECT_EQ(r.first_block, next) << "trial " << trial;
      for (size_t i = 0; i < r.blocks.size(); ++i) ++count[r.first_block + i];
      next = r.first_block + r.blocks.size();
    };
    while (s->num_computed < len) {
      const int n = std::min(len - s->num_computed, 1 + static_cast<int>(rng() % 9));
      if (auto r = a.duringRun({s.get(), n})) record(*r);
      s->num_computed += n;
      if (auto r = a.afterRun(*s)) record(*r);
    }
    EXPECT_EQ(count, std::vector<int>(s->blocks.size(), 1)) << "trial " << trial << ", " << len << " tokens";
  }
}

TEST(LayerAnnouncerTest, OnlyReportedLeasedPrefillsAnnounce) {
  LayerAnnouncer a(kBlockSize);
  auto unreported = leasedPrefill(8);
  unreported->kv_blocks_reported = false;
  unreported->num_computed = 4;
  EXPECT_FALSE(a.afterRun(*unreported).has_value());
  EXPECT_EQ(unreported->blocks_announced, 0);

  auto plain = std::make_unique<Sequence>(RequestId(3), RequestSpec{}, kBlockSize);
  plain->tokens.assign(8, 5);
  plain->num_prompt_tokens = 8;
  plain->blocks = {BlockId(1), BlockId(2)};
  EXPECT_FALSE(LayerAnnouncer::announces(*plain));
  EXPECT_FALSE(a.duringRun({plain.get(), 8}).has_value());

  auto decoding = leasedPrefill(8);
  decoding->tokens.push_back(6);  // its first output token: the prompt was announced
  EXPECT_FALSE(LayerAnnouncer::announces(*decoding));
  EXPECT_FALSE(a.duringRun({decoding.get(), 1}).has_value());
}

}  // namespace
}  // namespace tandem::engine
