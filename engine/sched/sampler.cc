#include "engine/sched/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <utility>

#include "engine/sched/sampler_math.h"

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

namespace {

using sampling::candidateId;
using sampling::candidateKey;

// Sorts candidates given in id order into the sampling order: logit
// descending, ties by id ascending. A stable LSD radix sort on the key byte
// by byte (a byte all candidates share is skipped), so equal keys keep their
// id order. Branch-free per candidate: std::sort's mispredicted comparisons
// made it most of a step's sampling time (~1.5 us for 100 candidates).
void sortCandidates(std::vector<uint64_t>& v, std::vector<uint64_t>& tmp) {
  if (v.size() < 2) return;
  uint32_t count[4][256] = {};
  for (uint64_t c : v) {
    for (int b = 0; b < 4; ++b) ++count[b][(c >> (32 + 8 * b)) & 0xff];
  }
  tmp.resize(v.size());
  for (int b = 0; b < 4; ++b) {
    const int shift = 32 + 8 * b;
    if (count[b][(v[0] >> shift) & 0xff] == v.size()) continue;
    uint32_t next = 0;
    for (uint32_t& n : count[b]) next += std::exchange(n, next);
    for (uint64_t c : v) tmp[count[b][(c >> shift) & 0xff]++] = c;
    v.swap(tmp);
  }
}

// The definition of temperature / top-k / top-p sampling, over the whole
// vocabulary, given the one uniform draw u:
//   candidates in order (logit descending, id ascending), the first top_k kept;
//   p_i = exp((logit_i - max) / T), summed in that order;
//   top_p < 1: the shortest prefix whose normalised mass reaches top_p, re-summed;
//   r = u * sum, minus p_i in order until it drops below 0.
// sampleToken gives exactly this token without sorting or exponentiating
// candidates that cannot change it, and falls back to this where they could.
// (Sorting all candidates and keeping the first top_k is the same as sorting
// the top_k: the order is total.) The arithmetic is sampler_math.h's, which
// the GPU sampling kernel shares.
TokenId sampleExact(std::span<const float> logits, const SamplingParams& p, double u, SamplerScratch& s) {
  const size_t vocab = logits.size();
  s.order.resize(vocab);
  for (size_t i = 0; i < vocab; ++i) s.order[i] = candidateKey(logits[i], static_cast<TokenId>(i));
  sortCandidates(s.order, s.tmp);
  size_t keep = p.top_k > 0 && static_cast<size_t>(p.top_k) < vocab ? static_cast<size_t>(p.top_k) : vocab;
  const double inv_t = 1.0 / static_cast<double>(p.temperature);
  const double max_logit = logits[static_cast<size_t>(candidateId(s.order[0]))];
  s.probs.resize(keep);
  double sum = sampling::weightCandidates(logits.data(), s.order.data(), keep, max_logit, inv_t, s.probs.data());
  if (p.top_p < 1.0f) {
    bool reached;
    keep = sampling::topPPrefix(s.probs.data(), keep, sum, p.top_p, &reached);
    sum = sampling::sumOf(s.probs.data(), keep);
  }
  const size_t i = sampling::walk(s.probs.data(), keep, u * sum);
  return candidateId(s.order[i < keep ? i : keep - 1]);
}

}  // namespace

TokenId sampleToken(std::span<const float> logits, const SamplingParams& p, SamplerRng& rng, SamplerScratch* scratch) {
  // The one draw (nothing else reads rng); greedy draws nothing.
  const double u = p.temperature <= 0.0f ? 0.0 : rng.uniform();
  return sampleTokenWithDraw(logits, p, u, scratch);
}

TokenId sampleTokenWithDraw(std::span<const float> logits, const SamplingParams& p, double u,
                            SamplerScratch* scratch) {
  const int vocab = static_cast<int>(logits.size());
  if (p.temperature <= 0.0f) {
    int best = 0;
    for (int i = 1; i < vocab; ++i) {
      if (logits[static_cast<size_t>(i)] > logits[static_cast<size_t>(best)]) best = i;
    }
    return best;
  }
  // sampleExact, without its full sort and its exp per vocabulary entry: only
  // candidates that are not negligible are sorted and exponentiated.
  SamplerScratch& s = *scratch;
  const double inv_t = 1.0 / static_cast<double>(p.temperature);
  float max = logits[0];
  for (int i = 1; i < vocab; ++i) max = logits[static_cast<size_t>(i)] > max ? logits[static_cast<size_t>(i)] : max;
  const double max_logit = max;
  s.order.clear();
  for (int i = 0; i < vocab; ++i) {
    const float x = logits[static_cast<size_t>(i)];
    if ((static_cast<double>(x) - max_logit) * inv_t >= sampling::kNegligibleExponent) {
      s.order.push_back(candidateKey(x, i));
    }
  }
  if (s.order.empty()) return sampleExact(logits, p, u, s);  // NaN logits: the definition decides
  const size_t limit = p.top_k > 0 && p.top_k < vocab ? static_cast<size_t>(p.top_k) : static_cast<size_t>(vocab);
  sortCandidates(s.order, s.tmp);
  s.probs.resize(std::min(limit, s.order.size()));
  const int32_t token = sampling::pickFromSorted(logits.data(), s.order.data(), s.order.size(), limit, max_logit,
                                                 inv_t, p.top_p, u, s.probs.data());
  return token == sampling::kDecideExactly ? sampleExact(logits, p, u, s) : token;
}

}  // namespace tandem::engine
