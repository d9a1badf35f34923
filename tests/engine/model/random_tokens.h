#pragma once
// Prompts for model tests: `n` token ids uniform in [0, vocab), the same for
// the same seed on every machine (std::mt19937 is fully specified; the
// distribution is libstdc++'s, which every test build uses).

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "src/common/ids.h"

namespace tandem::engine::testing {

inline std::vector<TokenId> randomTokens(size_t n, uint32_t seed, int vocab) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(0, vocab - 1);
  std::vector<TokenId> t(n);
  for (TokenId& x : t) x = dist(rng);
  return t;
}

}  // namespace tandem::engine::testing
