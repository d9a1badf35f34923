// The sampling kernel (engine/backend/cuda/sampling_kernel.h) on the CPU
// executor picks exactly the CPU sampler's token for the same logits, params
// and draw: greedy and temperature / top-k / top-p over random rows, with the
// edges the CPU sampler defines (ties, -0 and +0, NaN first or later, +inf,
// all-equal rows with more candidates than the kernel holds). Rows the kernel
// leaves to the host are few and are still the CPU sampler's tokens.

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "engine/backend/cuda/kernel_backend.h"
#include "engine/backend/cuda/sampling_kernel.h"
#include "engine/sched/sampler.h"

namespace tandem::engine {
namespace {

struct Batch {
  std::vector<float> logits;
  std::vector<SamplingParams> params;
  std::vector<double> uniforms;
};

// The CPU sampler's tokens for the batch: each row with a SamplerRng whose
// draw the batch records (the kernel gets the same draw).
std::vector<TokenId> cpuTokens(const Batch& b, int32_t vocab) {
  std::vector<TokenId> out;
  SamplerScratch scratch;
  for (size_t r = 0; r < b.params.size(); ++r) {
    out.push_back(sampleTokenWithDraw(std::span<const float>(b.logits).subspan(r * vocab, vocab), b.params[r],
                                      b.uniforms[r], &scratch));
  }
  return out;
}

TEST(SamplingKernelTest, PicksTheCpuSamplersTokenForEveryParameterMix) {
  const int32_t vocab = 3000;
  std::mt19937 rng(17);
  std::normal_distribution<float> logit(0.0f, 3.0f);
  Batch b;
  for (float t : {0.0f, 0.3f, 0.7f, 1.0f, 1.5f}) {
    for (int k : {0, 1, 40, 5000}) {
      for (float p : {1.0f, 0.95f, 0.5f}) {
        for (int rep = 0; rep < 3; ++rep) {
          for (int32_t i = 0; i < vocab; ++i) b.logits.push_back(logit(rng));
          b.params.push_back({.temperature = t, .top_k = k, .top_p = p});
          SamplerRng draw(static_cast<uint64_t>(b.params.size()));
          b.uniforms.push_back(draw.uniform());
        }
      }
    }
  }
  KernelBackend gpu;
  int on_host = 0;
  const std::vector<TokenId> got = gpu.sample(b.logits, vocab, b.params, b.uniforms, &on_host);
  ASSERT_TRUE(gpu.status().ok()) << gpu.status();
  EXPECT_EQ(got, cpuTokens(b, vocab));
  // Sharp enough rows fit the kernel's candidates: most are decided on the device.
  EXPECT_LT(on_host, static_cast<int>(b.params.size()) / 4) << on_host << " of " << b.params.size();
}

TEST(SamplingKernelTest, TheCpuSamplersEdgesGiveItsTokens) {
  const int32_t vocab = 5000;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<std::vector<float>> rows;
  std::vector<float> ties(vocab, -1.0f);
  ties[17] = ties[4000] = ties[9] = 2.0f;  // lowest id of the maxima: 9
  rows.push_back(ties);
  std::vector<float> zeros(vocab, -5.0f);
  zeros[30] = -0.0f;
  zeros[20] = 0.0f;
  rows.push_back(zeros);
  std::vector<float> nan_first(vocab, 0.5f);
  nan_first[0] = nan;
  nan_first[100] = 3.0f;
  rows.push_back(nan_first);
  std::vector<float> nan_later(vocab, 0.5f);
  nan_later[7] = nan;
  nan_later[100] = 3.0f;
  rows.push_back(nan_later);
  std::vector<float> with_inf(vocab, 0.0f);
  with_inf[42] = inf;
  rows.push_back(with_inf);
  rows.emplace_back(vocab, 1.0f);  // all equal: every id a candidate, more than the kernel holds
  Batch b;
  for (const auto& row : rows) {
    for (float t : {0.0f, 1.0f}) {
      for (float p : {1.0f, 0.3f}) {
        b.logits.insert(b.logits.end(), row.begin(), row.end());
        b.params.push_back({.temperature = t, .top_k = 0, .top_p = p});
        b.uniforms.push_back(0.5 + 0.01 * static_cast<double>(b.params.size()));
      }
    }
  }
  KernelBackend gpu;
  int on_host = 0;
  const std::vector<TokenId> got = gpu.sample(b.logits, vocab, b.params, b.uniforms, &on_host);
  ASSERT_TRUE(gpu.status().ok()) << gpu.status();
  const std::vector<TokenId> want = cpuTokens(b, vocab);
  for (size_t r = 0; r < want.size(); ++r) {
    EXPECT_EQ(got[r], want[r]) << "row " << r / 4 << ", temperature " << b.params[r].temperature << ", top_p "
                               << b.params[r].top_p;
  }
  EXPECT_EQ(got[0], 9);  // greedy over ties
  EXPECT_GT(on_host, 0);  // NaN first, +inf and the flat row are the host's
}

TEST(SamplingKernelTest, TheLaunchFitsItsSharedMemory) {
  EXPECT_LE(gpu::kSampleSharedBytes, size_t{48} * 1024);
  EXPECT_EQ(gpu::sampleLaunch(7).shared_bytes, gpu::kSampleSharedBytes);
}

}  // namespace
}  // namespace tandem::engine
