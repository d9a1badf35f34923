#include "engine/sched/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <utility>

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

// Candidate `id` as a 64-bit word: a sort key in the upper half (ascending
// keys are logits descending; the float's bits mapped to an unsigned integer
// of the same order, -0 folded into +0 since they are equal logits) and the
// id in the lower half.
uint64_t candidate(float logit, TokenId id) {
  uint32_t bits = std::bit_cast<uint32_t>(logit + 0.0f);
  bits = (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;  // ascending with the logit
  return (static_cast<uint64_t>(~bits) << 32) | static_cast<uint32_t>(id);
}
TokenId idOf(uint64_t c) { return static_cast<TokenId>(static_cast<uint32_t>(c)); }

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

// The steps both samplers share, so that they do the same arithmetic.

// s.probs[i] = exp((logit of candidate i - max_logit) / T) for the first
// `keep` candidates of s.order; returns their sum, added in that order.
double weightCandidates(std::span<const float> logits, size_t keep, double max_logit, double inv_t, SamplerScratch& s) {
  s.probs.resize(keep);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) {
    s.probs[i] = std::exp((static_cast<double>(logits[static_cast<size_t>(idOf(s.order[i]))]) - max_logit) * inv_t);
    sum += s.probs[i];
  }
  return sum;
}

// The shortest prefix of probs[0, keep) whose normalised mass reaches
// top_p, or all `keep` if none does (*reached says which).
size_t topPPrefix(const std::vector<double>& probs, size_t keep, double sum, float top_p, bool* reached) {
  double acc = 0;
  size_t n = 0;
  bool hit = false;
  while (n < keep && !hit) {
    acc += probs[n] / sum;
    ++n;
    hit = acc >= static_cast<double>(top_p);
  }
  *reached = hit;
  return n;
}

double sumOf(const std::vector<double>& probs, size_t n) {
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += probs[i];
  return sum;
}

// The first i < n at which r minus probs[0..i] drops below 0; n if none.
size_t walk(const std::vector<double>& probs, size_t n, double r) {
  for (size_t i = 0; i < n; ++i) {
    r -= probs[i];
    if (r < 0) return i;
  }
  return n;
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
// the top_k: the order is total.)
TokenId sampleExact(std::span<const float> logits, const SamplingParams& p, double u, SamplerScratch& s) {
  const size_t vocab = logits.size();
  s.order.resize(vocab);
  for (size_t i = 0; i < vocab; ++i) s.order[i] = candidate(logits[i], static_cast<TokenId>(i));
  sortCandidates(s.order, s.tmp);
  size_t keep = p.top_k > 0 && static_cast<size_t>(p.top_k) < vocab ? static_cast<size_t>(p.top_k) : vocab;
  const double inv_t = 1.0 / static_cast<double>(p.temperature);
  const double max_logit = logits[static_cast<size_t>(idOf(s.order[0]))];
  double sum = weightCandidates(logits, keep, max_logit, inv_t, s);
  if (p.top_p < 1.0f) {
    bool reached;
    keep = topPPrefix(s.probs, keep, sum, p.top_p, &reached);
    sum = sumOf(s.probs, keep);
  }
  const size_t i = walk(s.probs, keep, u * sum);
  return idOf(s.order[i < keep ? i : keep - 1]);
}

// A candidate whose exponent argument (logit - max) / T is below this has
// p < 2^-54 (e^-40 ~ 4e-18). The top candidate's p is exactly 1, so every sum
// of p's is >= 1, and adding such a p rounds back to the same double: it
// changes neither the sum nor the top-p prefix. Only a draw that walks past
// every larger candidate could pick it; sampleToken then falls back to sampleExact.
constexpr double kNegligibleExponent = -40.0;

}  // namespace

TokenId sampleToken(std::span<const float> logits, const SamplingParams& p, SamplerRng& rng, SamplerScratch* scratch) {
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
  const double u = rng.uniform();  // the one draw (nothing else reads rng)
  const double inv_t = 1.0 / static_cast<double>(p.temperature);
  float max = logits[0];
  for (int i = 1; i < vocab; ++i) max = logits[static_cast<size_t>(i)] > max ? logits[static_cast<size_t>(i)] : max;
  const double max_logit = max;
  s.order.clear();
  for (int i = 0; i < vocab; ++i) {
    const float x = logits[static_cast<size_t>(i)];
    if ((static_cast<double>(x) - max_logit) * inv_t >= kNegligibleExponent) s.order.push_back(candidate(x, i));
  }
  if (s.order.empty()) return sampleExact(logits, p, u, s);  // NaN logits: the definition decides
  const size_t limit = p.top_k > 0 && p.top_k < vocab ? static_cast<size_t>(p.top_k) : static_cast<size_t>(vocab);
  const size_t keep = std::min(limit, s.order.size());
  // Whether sampleExact's kept candidates go on past ours (with negligible ones).
  const bool truncated = keep < limit;
  sortCandidates(s.order, s.tmp);
  double sum = weightCandidates(logits, keep, max_logit, inv_t, s);
  size_t nucleus = keep;
  if (p.top_p < 1.0f) {
    bool reached;
    nucleus = topPPrefix(s.probs, keep, sum, p.top_p, &reached);
    if (!reached && truncated) return sampleExact(logits, p, u, s);
    sum = sumOf(s.probs, nucleus);
  }
  if (const size_t i = walk(s.probs, nucleus, u * sum); i < nucleus) return idOf(s.order[i]);
  // sampleExact would walk on into the negligible candidates when there are any.
  if (truncated && nucleus == keep) return sampleExact(logits, p, u, s);
  return idOf(s.order[nucleus - 1]);
}

}  // namespace tandem::engine
