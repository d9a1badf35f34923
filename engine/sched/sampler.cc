#include "engine/sched/sampler.h"

#include <algorithm>
#include <cmath>

namespace tandem::engine {
namespace {

uint64_t splitmix(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

SamplerRng::SamplerRng(uint64_t seed) {
  for (auto& s : s_) s = splitmix(seed);
}

uint64_t SamplerRng::next() {
  uint64_t result = rotl(s_[1] * 5, 7) * 9;
  uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

TokenId sampleToken(std::span<const float> logits, const SamplingParams& p, SamplerRng& rng,
                    std::vector<std::pair<float, TokenId>>* scratch) {
  const int vocab = static_cast<int>(logits.size());
  if (p.temperature <= 0.0f) {
    int best = 0;
    for (int i = 1; i < vocab; ++i) {
      if (logits[static_cast<size_t>(i)] > logits[static_cast<size_t>(best)]) best = i;
    }
    return best;
  }
  // Candidates sorted by logit, descending (ties by id for determinism).
  auto& c = *scratch;
  c.resize(static_cast<size_t>(vocab));
  for (int i = 0; i < vocab; ++i) c[static_cast<size_t>(i)] = {logits[static_cast<size_t>(i)], i};
  auto order = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t keep = c.size();
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < c.size()) {
    keep = static_cast<size_t>(p.top_k);
    std::partial_sort(c.begin(), c.begin() + static_cast<ptrdiff_t>(keep), c.end(), order);
  } else {
    std::sort(c.begin(), c.end(), order);
  }
  // Softmax over the kept candidates at the given temperature.
  const double inv_t = 1.0 / static_cast<double>(p.temperature);
  const double max_logit = c[0].first;
  std::vector<double> probs(keep);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) {
    probs[i] = std::exp((static_cast<double>(c[i].first) - max_logit) * inv_t);
    sum += probs[i];
  }
  // Nucleus: the smallest prefix whose mass reaches top_p (at least one token).
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

}  // namespace tandem::engine
