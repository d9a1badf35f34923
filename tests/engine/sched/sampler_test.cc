#include "engine/sched/sampler.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

namespace tandem::engine {
namespace {

std::vector<float> logits() { return {0.1f, 2.0f, 1.5f, -1.0f, 2.0f, 0.5f}; }

TEST(SamplerTest, GreedyTakesLowestIdAmongMaxima) {
  SamplerRng rng(1);
  std::vector<std::pair<float, TokenId>> scratch;
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(sampleToken(logits(), p, rng, &scratch), 1);
}

TEST(SamplerTest, TopKOneAndTinyTopPAreGreedy) {
  SamplerRng rng(2);
  std::vector<std::pair<float, TokenId>> scratch;
  SamplingParams k1;
  k1.temperature = 1.0f;
  k1.top_k = 1;
  SamplingParams p0;
  p0.temperature = 1.0f;
  p0.top_p = 1e-6f;
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(sampleToken(logits(), k1, rng, &scratch), 1);
    EXPECT_EQ(sampleToken(logits(), p0, rng, &scratch), 1);
  }
}

TEST(SamplerTest, TopKRestrictsSupportAndFrequenciesFollowSoftmax) {
  SamplerRng rng(3);
  std::vector<std::pair<float, TokenId>> scratch;
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 3;  // ids 1, 4 (2.0) and 2 (1.5)
  std::map<TokenId, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++counts[sampleToken(logits(), p, rng, &scratch)];
  EXPECT_EQ(counts.size(), 3u);
  EXPECT_TRUE(counts.contains(1) && counts.contains(4) && counts.contains(2));
  // P(2) = e^1.5 / (2 e^2 + e^1.5) = 0.233
  EXPECT_NEAR(counts[2] / static_cast<double>(n), 0.233, 0.02);
  EXPECT_NEAR(counts[1] / static_cast<double>(n), 0.383, 0.02);
}

TEST(SamplerTest, TopPKeepsSmallestNucleus) {
  SamplerRng rng(4);
  std::vector<std::pair<float, TokenId>> scratch;
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.5f;  // the two 2.0 logits hold ~0.62 of the mass together; one alone ~0.31
  std::map<TokenId, int> counts;
  for (int i = 0; i < 5000; ++i) ++counts[sampleToken(logits(), p, rng, &scratch)];
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_TRUE(counts.contains(1) && counts.contains(4));
}

TEST(SamplerTest, SameSeedSameStream) {
  SamplerRng a(42), b(42), c(43);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    uint64_t x = a.next();
    EXPECT_EQ(x, b.next());
    differs |= x != c.next();
  }
  EXPECT_TRUE(differs);
  SamplerRng r(7);
  for (int i = 0; i < 1000; ++i) {
    double u = r.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
}

}  // namespace
}  // namespace tandem::engine
