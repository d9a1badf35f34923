// The sampling kernel (engine/backend/cuda/sampling_kernel.h) on the CPU
// executor picks exactly the CPU sampler's token for the same logits, params
// and draw: greedy and temperature / top-k / top-p over random rows, with the
// edges the CPU sampler defines (ties, -0 and +0, NaN first or later, +inf,
// all-equal rows with more candidates than the kernel holds). Rows the kernel
// leaves to the host are few and are still the CPU sampler's tokens. An
// engine that samples where the logits are made (EngineOptions::
// sample_on_device) gives the tokens of one that samples on the host.

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "engine/backend/cuda/kernel_backend.h"
#include "engine/backend/cuda/sampling_kernel.h"
#include "engine/model/llama.h"
#include "engine/sched/sampler.h"
#include "tests/engine/engine_test_util.h"

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

// The engine step with the kernel backend: sampling on the device (each
// request's draw taken before the step, the kernel over the logits in device
// memory, one token per row downloaded) gives every request the tokens the
// host sampler gives it, for greedy, temperature, top-k and top-p requests
// with seeds, batched together.
TEST(DeviceSamplingTest, TheEngineSamplesTheSameTokensOnTheDeviceAsOnTheHost) {
  auto run = [](bool on_device, KernelBackend** backend_out) {
    auto backend = std::make_unique<KernelBackend>();
    *backend_out = backend.get();
    EngineOptions o;
    o.num_blocks = 64;
    o.block_size = 16;
    o.max_num_seqs = 8;
    o.seed = 11;
    o.sample_on_device = on_device;
    auto h = std::make_unique<testing::Harness>(o, true, std::move(backend));
    std::mt19937 rng(5);
    const struct {
      float temperature;
      int top_k;
      float top_p;
    } mixes[] = {{0.0f, 0, 1.0f}, {0.7f, 20, 1.0f}, {1.0f, 0, 0.9f}, {1.5f, 0, 1.0f}, {0.9f, 5, 0.5f}};
    std::vector<RequestId> ids;
    for (int i = 0; i < 10; ++i) {
      RequestSpec spec = testing::greedy(testing::randomPrompt(rng, 5 + 7 * i), 12);
      spec.sampling.temperature = mixes[i % 5].temperature;
      spec.sampling.top_k = mixes[i % 5].top_k;
      spec.sampling.top_p = mixes[i % 5].top_p;
      if (i % 2 == 0) spec.sampling.seed = 1000 + static_cast<uint64_t>(i);
      ids.push_back(h->add(spec));
    }
    h->runToCompletion();
    std::vector<std::vector<TokenId>> tokens;
    for (RequestId id : ids) tokens.push_back(h->outcome(id).tokens);
    return std::make_pair(std::move(h), tokens);
  };
  KernelBackend* device_backend = nullptr;
  KernelBackend* host_backend = nullptr;
  const auto [device_engine, on_device] = run(true, &device_backend);
  const auto [host_engine, on_host] = run(false, &host_backend);
  ASSERT_EQ(on_device.size(), on_host.size());
  for (size_t i = 0; i < on_device.size(); ++i) {
    EXPECT_EQ(on_device[i].size(), 12u) << "request " << i;
    EXPECT_EQ(on_device[i], on_host[i]) << "request " << i;
  }
  // Every token of the first engine came from the kernel (the tiny model's
  // 100 candidates fit it); the second never ran it.
  EXPECT_EQ(device_backend->rowsSampledOnDevice(), 10 * 12);
  EXPECT_EQ(device_backend->rowsSampledOnHost(), 0);
  EXPECT_EQ(host_backend->rowsSampledOnDevice(), 0);
}

// Backend::sampleLogits on the kernel backend: a row the kernel decides
// comes back as a token; a row with more candidates than the kernel holds
// (5,000 equal logits) has its logits row downloaded and sampled on the host
// with the same draw: the CPU sampler's token either way.
TEST(DeviceSamplingTest, ARowTheKernelHandsBackIsSampledOnTheHostWithTheSameDraw) {
  KernelBackend backend;
  const int32_t vocab = 5000, dim = 4;
  const std::vector<float> w(static_cast<size_t>(vocab) * dim, 0.0f);  // every logit 0
  const auto lm_head = backend.prepareWeight(w.data(), vocab, dim);
  const std::vector<float> ones(2 * dim, 1.0f);  // outlives `hidden`: the executor may use it in place
  const auto hidden = backend.residentWeight(ones);
  ASSERT_TRUE(lm_head && hidden) << backend.status();
  std::vector<SamplingParams> params(2);
  params[0].temperature = 0.0f;  // greedy: the kernel decides (the lowest id of the equal maxima)
  params[1].temperature = 1.0f;  // 5,000 candidates: handed back
  const std::vector<double> draws = {0.0, 0.37};
  std::vector<TokenId> tokens(2, -7);
  backend.sampleLogits(hidden->data(), *lm_head, 2, params, draws, tokens);
  ASSERT_TRUE(backend.status().ok()) << backend.status();
  SamplerScratch scratch;
  const std::vector<float> zeros(static_cast<size_t>(vocab), 0.0f);
  EXPECT_EQ(tokens[0], sampleTokenWithDraw(zeros, params[0], draws[0], &scratch));
  EXPECT_EQ(tokens[1], sampleTokenWithDraw(zeros, params[1], draws[1], &scratch));
  EXPECT_NE(tokens[1], 0) << "a draw of 0.37 over equal weights is not the first token";
  EXPECT_EQ(backend.rowsSampledOnDevice(), 1);
  EXPECT_EQ(backend.rowsSampledOnHost(), 1);
}

// LlamaModel::forward refuses sampling spans that do not match the batch's
// rows that want logits, naming the counts.
TEST(DeviceSamplingTest, AForwardWithSamplingForTheWrongRowsIsRefused) {
  KernelBackend backend;
  auto model = LlamaModel::create(testing::tinyWeights(), backend);
  ASSERT_TRUE(model.ok()) << model.status();
  const KvLayout layout = kvLayoutFor(testing::tinyWeights()->config, 8, 16);
  auto memory = backend.kvMemory(layout.totalBytes());
  ASSERT_TRUE(memory.ok()) << memory.status();
  KvStorage kv(layout, std::move(*memory));
  const std::vector<TokenId> tokens = {1, 2, 3};
  const std::vector<BlockId> table = {BlockId(0)};
  const SequenceChunk chunk{.tokens = tokens, .start_pos = 0, .block_table = table, .want_logits = true};
  const std::vector<SamplingParams> params(2);
  const std::vector<double> draws(2);
  std::vector<TokenId> out(2);
  const LlamaModel::Sampling sampling{params, draws, out};
  std::vector<float> logits;
  const absl::Status s = (*model)->forward(std::span<const SequenceChunk>(&chunk, 1), kv, &logits, nullptr, &sampling);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("sampling is for 2 rows"), std::string::npos) << s;
  EXPECT_NE(s.message().find("the batch has 1 chunks that want logits"), std::string::npos) << s;
}

}  // namespace
}  // namespace tandem::engine
