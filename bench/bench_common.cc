// ./tandem bench common — the block-hash chain against memcpy.
//
// The router hashes every prompt (tens of thousands of tokens for a coding
// agent) on the request path, so hashing must run at a good fraction of
// memory bandwidth. Yardstick: memcpy of the same bytes in the same run.

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "bench/bench_report.h"
#include "src/common/block_hash.h"

int main(int argc, char** argv) {
  using namespace tandem;
  constexpr size_t kTokens = 1 << 20;  // 1M tokens = 4 MiB, ~10 long agent prompts
  std::vector<TokenId> tokens(kTokens);
  std::mt19937 rng(42);
  for (auto& t : tokens) t = static_cast<TokenId>(rng() % 128000);
  std::vector<TokenId> dst(kTokens);
  const double bytes = static_cast<double>(kTokens * sizeof(TokenId));
  const int reps = 31;

  double memcpy_s = bench::medianSeconds([&] { std::memcpy(dst.data(), tokens.data(), bytes); }, reps);
  double memcpy_gbps = bytes / memcpy_s / 1e9;

  std::vector<bench::Result> results;
  for (int block_size : {16, 64, 512}) {
    volatile uint64_t sink = 0;
    double s = bench::medianSeconds(
        [&] {
          auto h = computeBlockHashes(tokens, block_size);
          sink = sink + h.back().value();
        },
        reps);
    results.push_back({.name = "block_hash_chain_b" + std::to_string(block_size),
                       .value = bytes / s / 1e9,
                       .unit = "GB/s",
                       .reference = memcpy_gbps,
                       .reference_name = "memcpy"});
  }
  return bench::writeReport("common", results, argc, argv);
}
