#pragma once
// Token sampling on the device, one block per row of logits, with the CPU
// sampler's semantics (engine/sched/sampler.cc) and its arithmetic
// (sampler_math.h, shared):
// - greedy (temperature <= 0): the lowest id among the largest non-NaN
//   logits; id 0 when logits[0] is NaN (the CPU's sequential scan never
//   moves off a NaN first entry);
// - otherwise the candidates whose (logit - max) / T is not negligible,
//   sorted (bitonic, in shared memory; keys are unique, so the order is the
//   CPU's radix sort's), then sampling::pickFromSorted on one thread with the
//   request's one uniform draw, which the host takes from the request's
//   SamplerRng as the CPU sampler does.
// A row the kernel cannot decide exactly — more than kSampleMaxCandidates
// candidates, NaN or infinite maxima, or a draw that walks into the
// negligible tail — comes back as kSampleOnHost, and the host runs the CPU
// sampler's exact path on it (KernelBackend::sample). On the executor the
// result is the CPU sampler's, bit for bit (tests/engine/backend/cuda/
// sampling_kernel_test.cc). On a GPU the weights' double-precision exp is
// CUDA's (within 1 ulp of glibc's, not always equal), so a draw within about
// 1e-16 of a boundary between two tokens can pick the neighbour: the only
// difference, and one no test here can show.

#include <cstdint>

#include "engine/backend/cuda/portable.h"
#include "engine/sched/sampler_math.h"

namespace tandem::gpu {

constexpr int kSampleThreads = 256;
constexpr int kSampleMaxCandidates = 4096;
constexpr int32_t kSampleOnHost = -1;

struct SampleArgs {
  const float* logits;       // [rows, vocab]
  const float* temperature;  // [rows]
  const int32_t* top_k;      // [rows] 0 = off
  const float* top_p;        // [rows] 1 = off
  const double* uniform;     // [rows] the request's draw in [0, 1) (unused when greedy)
  double* probs;             // [rows, kSampleMaxCandidates] scratch
  int32_t* out;              // [rows] the token, or kSampleOnHost
  int32_t rows, vocab;
  bool operator==(const SampleArgs&) const = default;  // a graph replay compares its launches
};

// Shared memory: the candidates' keys, then the reductions' values, ids and counts.
constexpr size_t kSampleSharedBytes = kSampleMaxCandidates * sizeof(uint64_t) +
                                      kSampleThreads * (sizeof(float) + sizeof(int32_t)) +
                                      (kSampleThreads + 1) * sizeof(int32_t);
inline LaunchConfig sampleLaunch(int32_t rows) {
  return {{static_cast<uint32_t>(rows), 1, 1}, {kSampleThreads, 1, 1}, kSampleSharedBytes};
}

TANDEM_KERNEL sampleKernel(const SampleArgs a) {
  namespace sampling = ::tandem::engine::sampling;
  constexpr int32_t kNone = 0x7fffffff;
  const int row = blockX(), t = threadX(), n = blockDimX();
  const float* x = a.logits + static_cast<size_t>(row) * static_cast<size_t>(a.vocab);
  uint64_t* keys = sharedMemory<uint64_t>();
  float* red_v = reinterpret_cast<float*>(keys + kSampleMaxCandidates);
  int32_t* red_i = reinterpret_cast<int32_t*>(red_v + kSampleThreads);
  int32_t* counts = red_i + kSampleThreads;  // [threads + 1]

  // The largest non-NaN logit and its lowest id: each thread scans its ids
  // in ascending order, then a fixed tree combines (larger value, else lower id).
  float bv = -INFINITY;
  int32_t bi = kNone;
  for (int32_t i = t; i < a.vocab; i += n) {
    const float v = x[i];
    if (v == v && (bi == kNone || v > bv)) {
      bv = v;
      bi = i;
    }
  }
  red_v[t] = bv;
  red_i[t] = bi;
  syncThreads();
  for (int stride = n / 2; stride > 0; stride /= 2) {
    if (t < stride) {
      const float v2 = red_v[t + stride];
      const int32_t i2 = red_i[t + stride];
      if (i2 != kNone && (red_i[t] == kNone || v2 > red_v[t] || (v2 == red_v[t] && i2 < red_i[t]))) {
        red_v[t] = v2;
        red_i[t] = i2;
      }
    }
    syncThreads();
  }
  const bool first_is_nan = !(x[0] == x[0]);
  if (a.temperature[row] <= 0.0f) {
    if (t == 0) a.out[row] = first_is_nan ? 0 : red_i[0];
    return;
  }
  const double max_logit = red_v[0];
  const double inv_t = 1.0 / static_cast<double>(a.temperature[row]);

  // The non-negligible candidates, compacted: thread t takes a contiguous
  // range of ids, counts, a prefix sum places each thread's keys.
  const int32_t per = (a.vocab + n - 1) / n;
  const int32_t i0 = t * per < a.vocab ? t * per : a.vocab;
  const int32_t i1 = i0 + per < a.vocab ? i0 + per : a.vocab;
  int32_t mine = 0;
  for (int32_t i = i0; i < i1; ++i) {
    mine += (static_cast<double>(x[i]) - max_logit) * inv_t >= sampling::kNegligibleExponent;
  }
  counts[t] = mine;
  syncThreads();
  if (t == 0) {
    int32_t total = 0;
    for (int j = 0; j < n; ++j) {
      const int32_t c = counts[j];
      counts[j] = total;
      total += c;
    }
    counts[n] = total;
  }
  syncThreads();
  const int32_t total = counts[n];
  // NaN or infinite maxima leave no candidates; too many do not fit: the host decides.
  if (first_is_nan || total == 0 || total > kSampleMaxCandidates) {
    if (t == 0) a.out[row] = kSampleOnHost;
    return;
  }
  int32_t at = counts[t];
  for (int32_t i = i0; i < i1; ++i) {
    if ((static_cast<double>(x[i]) - max_logit) * inv_t >= sampling::kNegligibleExponent) {
      keys[at++] = sampling::candidateKey(x[i], i);
    }
  }
  int32_t size = 1;
  while (size < total) size *= 2;
  for (int32_t i = total + t; i < size; i += n) keys[i] = ~uint64_t{0};  // padding sorts last
  syncThreads();

  // Bitonic sort, ascending.
  for (int32_t k = 2; k <= size; k *= 2) {
    for (int32_t j = k / 2; j > 0; j /= 2) {
      for (int32_t i = t; i < size; i += n) {
        const int32_t partner = i ^ j;
        if (partner > i) {
          const uint64_t lo = keys[i], hi = keys[partner];
          const bool ascending = (i & k) == 0;
          if ((lo > hi) == ascending) {
            keys[i] = hi;
            keys[partner] = lo;
          }
        }
      }
      syncThreads();
    }
  }

  if (t == 0) {
    const int32_t k = a.top_k[row];
    const size_t limit = k > 0 && k < a.vocab ? static_cast<size_t>(k) : static_cast<size_t>(a.vocab);
    const int32_t token = sampling::pickFromSorted(
        x, keys, static_cast<size_t>(total), limit, max_logit, inv_t, a.top_p[row], a.uniform[row],
        a.probs + static_cast<size_t>(row) * static_cast<size_t>(kSampleMaxCandidates));
    a.out[row] = token == sampling::kDecideExactly ? kSampleOnHost : token;
  }
}

}  // namespace tandem::gpu
