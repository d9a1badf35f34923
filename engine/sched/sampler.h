#pragma once
// Token sampling: greedy, temperature, top-k, top-p, with a per-request
// random stream so a seeded request is reproducible regardless of what else
// is in the batch.

#include <cstdint>
#include <span>
#include <vector>

#include "engine/sched/request.h"
#include "src/common/ids.h"

namespace tandem::engine {

// xoshiro256** seeded through splitmix64; fully specified so seeded outputs
// are identical on every machine.
class SamplerRng {
 public:
  explicit SamplerRng(uint64_t seed = 0);
  uint64_t next();
  // Uniform in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }

 private:
  uint64_t s_[4];
};

// Buffers sampleToken reuses between calls (no allocation once warmed up).
struct SamplerScratch {
  std::vector<uint64_t> order;  // candidates (key, id), sorted into logit descending, then id ascending
  std::vector<uint64_t> tmp;    // the sort's other buffer
  std::vector<double> probs;    // unnormalised probabilities, in candidate order
};

// Picks the next token from `logits` ([vocab]).
// Greedy (temperature 0) takes the lowest id among equal maxima and draws
// nothing from `rng`; otherwise exactly one draw (Engine::completeImport
// relies on this to continue a stream begun on another engine).
TokenId sampleToken(std::span<const float> logits, const SamplingParams& params, SamplerRng& rng,
                    SamplerScratch* scratch);

// The same with the draw given: `u` is what rng.uniform() would have
// returned (ignored when greedy). For a device sampler that takes its draws
// from the requests' SamplerRng on the host and leaves some rows to this.
TokenId sampleTokenWithDraw(std::span<const float> logits, const SamplingParams& params, double u,
                            SamplerScratch* scratch);

}  // namespace tandem::engine
