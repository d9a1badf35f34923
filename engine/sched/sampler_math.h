#pragma once
// The sampler's arithmetic, shared by the CPU sampler (sampler.cc) and the
// GPU sampling kernel (engine/backend/cuda/sampling_kernel.h), so both make
// the same sequence of operations on the same candidates: __host__
// __device__, raw pointers, nothing that allocates. The definition of the
// sampling itself is in sampler.cc (sampleExact).

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "engine/backend/kernel_math.h"

namespace tandem::engine::sampling {

// A candidate whose exponent argument (logit - max) / T is below this has
// p < 2^-54 (e^-40 ~ 4e-18). The top candidate's p is exactly 1, so every sum
// of p's is >= 1, and adding such a p rounds back to the same double: it
// changes neither the sum nor the top-p prefix. Only a draw that walks past
// every larger candidate could pick it; the sampler then decides exactly.
constexpr double kNegligibleExponent = -40.0;

// Candidate `id` as a 64-bit word: a sort key in the upper half (ascending
// keys are logits descending; the float's bits mapped to an unsigned integer
// of the same order, -0 folded into +0 since they are equal logits) and the
// id in the lower half. Keys are unique (the id is in them), so any correct
// sort gives the same order.
TANDEM_HD inline uint64_t candidateKey(float logit, int32_t id) {
  uint32_t bits = static_cast<uint32_t>(kmath::floatBits(logit + 0.0f));
  bits = (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;  // ascending with the logit
  return (static_cast<uint64_t>(~bits) << 32) | static_cast<uint32_t>(id);
}
TANDEM_HD inline int32_t candidateId(uint64_t c) { return static_cast<int32_t>(static_cast<uint32_t>(c)); }

// probs[i] = exp((logit of candidate i - max_logit) * inv_t) for the first
// `keep` candidates of `order`; returns their sum, added in that order.
TANDEM_HD inline double weightCandidates(const float* logits, const uint64_t* order, size_t keep, double max_logit,
                                         double inv_t, double* probs) {
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) {
    probs[i] = exp((static_cast<double>(logits[candidateId(order[i])]) - max_logit) * inv_t);
    sum += probs[i];
  }
  return sum;
}

// The shortest prefix of probs[0, keep) whose normalised mass reaches
// top_p, or all `keep` if none does (*reached says which).
TANDEM_HD inline size_t topPPrefix(const double* probs, size_t keep, double sum, float top_p, bool* reached) {
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

TANDEM_HD inline double sumOf(const double* probs, size_t n) {
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += probs[i];
  return sum;
}

// The first i < n at which r minus probs[0..i] drops below 0; n if none.
TANDEM_HD inline size_t walk(const double* probs, size_t n, double r) {
  for (size_t i = 0; i < n; ++i) {
    r -= probs[i];
    if (r < 0) return i;
  }
  return n;
}

// What pickFromSorted returns where only the exact definition can decide.
constexpr int32_t kDecideExactly = -1;

// The token of a temperature / top-k / top-p draw `u`, given the
// non-negligible candidates (kNegligibleExponent) sorted into `order`
// (count of them), `limit` = top_k if on and below the vocabulary, else the
// vocabulary size; probs has room for count values. kDecideExactly where
// the negligible candidates left out could change the token (sampler.cc
// then runs the definition over the whole vocabulary).
TANDEM_HD inline int32_t pickFromSorted(const float* logits, const uint64_t* order, size_t count, size_t limit,
                                        double max_logit, double inv_t, float top_p, double u, double* probs) {
  const size_t keep = limit < count ? limit : count;
  // Whether the definition's kept candidates go on past ours (with negligible ones).
  const bool truncated = keep < limit;
  double sum = weightCandidates(logits, order, keep, max_logit, inv_t, probs);
  size_t nucleus = keep;
  if (top_p < 1.0f) {
    bool reached;
    nucleus = topPPrefix(probs, keep, sum, top_p, &reached);
    if (!reached && truncated) return kDecideExactly;
    sum = sumOf(probs, nucleus);
  }
  if (const size_t i = walk(probs, nucleus, u * sum); i < nucleus) return candidateId(order[i]);
  // The definition would walk on into the negligible candidates when there are any.
  if (truncated && nucleus == keep) return kDecideExactly;
  return candidateId(order[nucleus - 1]);
}

}  // namespace tandem::engine::sampling
