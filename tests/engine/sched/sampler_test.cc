#include "engine/sched/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <random>
#include <vector>

namespace tandem::engine {
namespace {

std::vector<float> logits() { return {0.1f, 2.0f, 1.5f, -1.0f, 2.0f, 0.5f}; }

TEST(SamplerTest, GreedyTakesLowestIdAmongMaxima) {
  SamplerRng rng(1);
  SamplerScratch scratch;
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(sampleToken(logits(), p, rng, &scratch), 1);
}

TEST(SamplerTest, TopKOneAndTinyTopPAreGreedy) {
  SamplerRng rng(2);
  SamplerScratch scratch;
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
  SamplerScratch scratch;
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
  SamplerScratch scratch;
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

// The sampler as first written (full sort of (logit, id) pairs, an exp per
// vocabulary entry): sampleToken must pick exactly its token for every draw.
TokenId referenceSample(std::span<const float> logits, const SamplingParams& p, SamplerRng& rng) {
  std::vector<std::pair<float, TokenId>> c(logits.size());
  for (size_t i = 0; i < c.size(); ++i) c[i] = {logits[i], static_cast<TokenId>(i)};
  auto order = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t keep = c.size();
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < c.size()) {
    keep = static_cast<size_t>(p.top_k);
    std::partial_sort(c.begin(), c.begin() + static_cast<ptrdiff_t>(keep), c.end(), order);
  } else {
    std::sort(c.begin(), c.end(), order);
  }
  const double inv_t = 1.0 / static_cast<double>(p.temperature);
  const double max_logit = c[0].first;
  std::vector<double> probs(keep);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) {
    probs[i] = std::exp((static_cast<double>(c[i].first) - max_logit) * inv_t);
    sum += probs[i];
  }
  if (p.top_p < 1.0f) {
    double acc = 0;
    size_t n = 0;
    while (n < keep) {
      acc += probs[n] / sum;
      ++n;
      if (acc >= static_cast<double>(p.top_p)) break;
    }
    keep = n;
    sum = 0;
    for (size_t i = 0; i < keep; ++i) sum += probs[i];
  }
  double r = rng.uniform() * sum;
  for (size_t i = 0; i < keep; ++i) {
    r -= probs[i];
    if (r < 0) return c[i].second;
  }
  return c[keep - 1].second;
}

TEST(SamplerTest, SameTokensAsTheFullSortDefinition) {
  std::mt19937 gen(11);
  SamplerScratch scratch;
  for (int trial = 0; trial < 3000; ++trial) {
    const int vocab = 1 + static_cast<int>(gen() % 300);
    // Narrow and very wide logit ranges (the wide ones leave most candidates
    // negligible), coarse values for ties, and -0 next to +0.
    const float spread = std::array<float, 4>{0.5f, 4.0f, 60.0f, 400.0f}[gen() % 4];
    const bool coarse = gen() % 3 == 0;
    std::vector<float> logits(static_cast<size_t>(vocab));
    for (float& x : logits) {
      x = std::normal_distribution<float>(0.0f, spread)(gen);
      if (coarse) x = std::round(x);
      if (gen() % 20 == 0) x = gen() % 2 == 0 ? 0.0f : -0.0f;
    }
    SamplingParams p;
    p.temperature = std::array<float, 4>{0.05f, 0.7f, 1.0f, 3.0f}[gen() % 4];
    p.top_k = gen() % 3 == 0 ? static_cast<int>(gen() % 50) : 0;
    p.top_p = std::array<float, 5>{1.0f, 0.95f, 0.5f, 1e-6f, 0.9999999f}[gen() % 5];
    const uint64_t seed = gen();
    SamplerRng a(seed), b(seed);
    for (int draw = 0; draw < 5; ++draw) {
      ASSERT_EQ(sampleToken(logits, p, a, &scratch), referenceSample(logits, p, b))
          << "trial " << trial << " draw " << draw;
    }
  }
}

}  // namespace
}  // namespace tandem::engine
