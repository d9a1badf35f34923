// Prints a digest of everything the engine computes for a fixed workload on
// the built-in tiny model: the logits of a chunked prefill and of decode
// steps (GEMMs, attention, RMSNorm, RoPE with its libm cos/sin/pow table,
// SwiGLU), the cached K/V, and seeded temperature / top-p samples (libm exp).
// cross_cpu_determinism.sh runs it under every SIMD level and with glibc's
// AVX2/FMA code paths switched off, and requires one digest: the bits a
// machine computes do not depend on its CPU (docs/engine.md, "Determinism").

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/model/llama.h"
#include "engine/model/weights.h"
#include "engine/sched/sampler.h"

namespace {

using namespace tandem;
using namespace tandem::engine;

// FNV-1a, 64 bits: enough to tell two byte streams apart here.
struct Digest {
  uint64_t h = 0xcbf29ce484222325ull;
  void add(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  }
};

}  // namespace

int main() {
  const std::shared_ptr<const ModelWeights> weights = makeRandomWeights(tinyModelConfig(), 20261124);
  const ModelConfig& c = weights->config;
  CpuBackend backend;
  auto model = LlamaModel::create(weights, backend);
  if (!model.ok()) {
    std::fprintf(stderr, "model: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  constexpr int32_t kBlockSize = 16;
  constexpr int kPrompt = 40, kChunk = 16, kDecodes = 4;
  KvStorage kv(kvLayoutFor(c, 4, kBlockSize));
  std::vector<BlockId> table = {BlockId(2), BlockId(0), BlockId(3), BlockId(1)};
  std::vector<TokenId> tokens;
  for (int i = 0; i < kPrompt; ++i) tokens.push_back(static_cast<TokenId>((i * 37 + 11) % c.vocab_size));

  Digest logits_digest, sample_digest;
  SamplerRng rng(42);
  SamplerScratch scratch;
  const SamplingParams sampling{.temperature = 0.8f, .top_p = 0.9f};
  std::vector<float> logits;
  int32_t pos = 0;
  while (pos < kPrompt + kDecodes) {
    const int32_t n = pos < kPrompt ? std::min(kChunk, kPrompt - pos) : 1;
    SequenceChunk chunk{.tokens = std::span<const TokenId>(tokens).subspan(static_cast<size_t>(pos), static_cast<size_t>(n)),
                        .start_pos = pos,
                        .block_table = table,
                        .want_logits = pos + n >= kPrompt};
    const absl::Status st = (*model)->forward(std::span<const SequenceChunk>(&chunk, 1), kv, &logits);
    if (!st.ok()) {
      std::fprintf(stderr, "forward: %s\n", std::string(st.message()).c_str());
      return 1;
    }
    pos += n;
    if (!chunk.want_logits) continue;
    logits_digest.add(logits.data(), logits.size() * sizeof(float));
    // Many draws from these logits exercise the sampler's exp; the greedy
    // token continues the sequence.
    for (int draw = 0; draw < 64; ++draw) {
      const TokenId t = sampleToken(logits, sampling, rng, &scratch);
      sample_digest.add(&t, sizeof(t));
    }
    const TokenId next = sampleToken(logits, SamplingParams{.temperature = 0.0f}, rng, &scratch);
    if (pos >= static_cast<int32_t>(tokens.size())) tokens.push_back(next);
  }
  Digest kv_digest;
  kv_digest.add(kv.bytes().data(), kv.bytes().size());
  std::printf("logits %016llx kv %016llx samples %016llx (simd %s)\n",
              static_cast<unsigned long long>(logits_digest.h), static_cast<unsigned long long>(kv_digest.h),
              static_cast<unsigned long long>(sample_digest.h), std::string(simdLevelName(backend.simdLevel())).c_str());
  return 0;
}
