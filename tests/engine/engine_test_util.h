#pragma once
// A harness that drives a real Engine (tiny random-weight model, the CPU
// backend unless given another) step by step, checking the pool invariants
// after every step.

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "engine/model/tokenizer.h"
#include "engine/model/weights.h"
#include "src/common/clock.h"

namespace tandem::engine::testing {

inline std::shared_ptr<const ModelWeights> tinyWeights() {
  static std::shared_ptr<const ModelWeights> w = makeRandomWeights(tinyModelConfig(), 1234);
  return w;
}

// Printable-ASCII token ids of the byte tokenizer (5..99).
inline std::vector<TokenId> randomPrompt(std::mt19937& rng, int n) {
  std::vector<TokenId> p(static_cast<size_t>(n));
  for (auto& t : p) t = static_cast<TokenId>(5 + rng() % 95);
  return p;
}

struct Outcome {
  std::vector<TokenId> tokens;
  std::vector<BlockId> kv_blocks;  // from the kv_blocks update (P/D: leases and imports)
  std::string text;
  bool finished = false;
  int num_finished_updates = 0;
  RequestUpdate final;
};

class Harness {
 public:
  // `weights`: tinyWeights() when null.
  explicit Harness(EngineOptions options, bool with_tokenizer = true, std::unique_ptr<Backend> backend = nullptr,
                   std::shared_ptr<const ModelWeights> weights = nullptr) {
    std::shared_ptr<const Tokenizer> tok;
    if (with_tokenizer) tok = std::make_shared<ByteTokenizer>();
    auto e = Engine::create(options, weights ? std::move(weights) : tinyWeights(),
                            backend ? std::move(backend) : makeCpuBackend(), tok, clock);
    EXPECT_TRUE(e.ok()) << e.status();
    engine = std::move(*e);
  }

  RequestId add(RequestSpec spec) {
    auto out = std::make_shared<Outcome>();
    RequestId id = engine->addRequest(std::move(spec), [out](const RequestUpdate& u) {
      if (!u.kv_blocks.empty()) out->kv_blocks = u.kv_blocks;
      out->tokens.insert(out->tokens.end(), u.new_tokens.begin(), u.new_tokens.end());
      out->text += u.text_delta;
      if (u.finished) {
        out->finished = true;
        ++out->num_finished_updates;
        out->final = u;
      }
    });
    outcomes[id] = out;
    return id;
  }

  // One step plus the invariant check.
  StepStats step() {
    StepStats s = engine->step();
    absl::Status inv = engine->checkInvariants();
    EXPECT_TRUE(inv.ok()) << inv;
    return s;
  }

  void runToCompletion(int max_steps = 20000) {
    for (int i = 0; i < max_steps && engine->hasWork(); ++i) step();
    ASSERT_FALSE(engine->hasWork()) << "engine did not drain in " << max_steps << " steps";
  }

  const Outcome& outcome(RequestId id) { return *outcomes.at(id); }

  FakeClock clock;
  std::unique_ptr<Engine> engine;
  std::map<RequestId, std::shared_ptr<Outcome>> outcomes;
};

// A small pool for engines on the (slow) kernel backend: 64 blocks of 16,
// 8 sequences, 256 tokens a step.
inline EngineOptions smallPoolOptions() {
  EngineOptions o;
  o.num_blocks = 64;
  o.block_size = 16;
  o.max_num_batched_tokens = 256;
  o.max_num_seqs = 8;
  o.seed = 7;
  return o;
}

inline RequestSpec greedy(std::vector<TokenId> prompt, int max_tokens) {
  RequestSpec s;
  s.prompt = std::move(prompt);
  s.sampling.temperature = 0;
  s.sampling.max_tokens = max_tokens;
  s.sampling.ignore_eos = true;
  return s;
}

}  // namespace tandem::engine::testing
