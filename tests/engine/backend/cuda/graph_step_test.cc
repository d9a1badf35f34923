// CUDA graphs on the CPU executor: a captured graph runs its launches only
// when launched, with the pointers it was captured with, reading what the
// memory holds then; nothing a GPU's stream capture forbids happens while
// capturing. And KernelBackend's graph steps (decode steps padded to a
// bucket, captured once per key, replayed after) give the launch-by-launch
// bits: through the model, across buckets, split buckets, a buffer that
// moved (the replay is refused and the step runs launch by launch), and
// through the engine with sampling on the device.

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/backend/cuda/device.h"
#include "engine/backend/cuda/kernel_backend.h"
#include "engine/model/llama.h"
#include "engine/model/weights.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/model/random_tokens.h"

namespace tandem::engine {
namespace {

using ::testing::HasSubstr;

TEST(ExecutorDeviceGraphTest, ACapturedGraphRunsOnlyWhenLaunchedAndReadsWhatTheMemoryHoldsThen) {
  gpu::ExecutorDevice device;
  constexpr int64_t n = 300;
  auto* x = static_cast<float*>(*device.allocate(n * sizeof(float)));
  auto* y = static_cast<float*>(*device.allocate(n * sizeof(float)));
  std::vector<float> host(n, 1.0f), ones(n, 1.0f), twos(n, 2.0f);
  ASSERT_TRUE(device.upload(x, host.data(), n * sizeof(float)).ok());
  ASSERT_TRUE(device.upload(y, ones.data(), n * sizeof(float)).ok());

  ASSERT_TRUE(device.beginCapture().ok());
  EXPECT_TRUE(device.capturing());
  ASSERT_TRUE(device.add(gpu::elementwiseLaunch(n), gpu::AddArgs{x, y, n}).ok());
  // What a GPU's stream capture forbids is refused, naming it.
  const absl::Status upload = device.upload(y, twos.data(), n * sizeof(float));
  EXPECT_EQ(upload.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(upload.message(), HasSubstr("upload while a graph is being captured"));
  EXPECT_FALSE(device.allocate(64).ok());
  EXPECT_FALSE(device.synchronize().ok());
  EXPECT_FALSE(device.uploadAsync(y, twos.data(), n * sizeof(float)).ok());
  EXPECT_FALSE(device.beginCapture().ok()) << "a second capture";
  absl::StatusOr<std::unique_ptr<gpu::DeviceGraph>> graph = device.endCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_FALSE(device.capturing());

  ASSERT_TRUE(device.download(host.data(), x, n * sizeof(float)).ok());
  EXPECT_EQ(host[0], 1.0f) << "the captured launch ran at capture";

  // y changes between launches: each launch reads what is there then.
  ASSERT_TRUE(device.upload(y, twos.data(), n * sizeof(float)).ok());
  ASSERT_TRUE(device.launchGraph(**graph).ok());
  ASSERT_TRUE(device.uploadAsync(y, ones.data(), n * sizeof(float)).ok());  // in stream order before the next
  ASSERT_TRUE(device.launchGraph(**graph).ok());
  ASSERT_TRUE(device.download(host.data(), x, n * sizeof(float)).ok());
  EXPECT_EQ(host[0], 4.0f);
  EXPECT_EQ(host[n - 1], 4.0f);

  // Releasing memory while capturing fails the capture.
  ASSERT_TRUE(device.beginCapture().ok());
  device.release(y);
  const absl::StatusOr<std::unique_ptr<gpu::DeviceGraph>> failed = device.endCapture();
  EXPECT_FALSE(failed.ok());
  EXPECT_THAT(failed.status().message(), HasSubstr("release while a graph is being captured"));
  EXPECT_FALSE(device.endCapture().ok()) << "endCapture without beginCapture";
  device.release(x);
}

TEST(KernelBackendGraphTest, TheEnvironmentPicksTheGraphLimitAndABadValueIsAnErrorNamingIt) {
  auto with = [](const char* value) {
    setenv("TANDEM_CUDA_GRAPHS", value, 1);
    absl::StatusOr<int32_t> rows = graphMaxRowsFromEnvironment();
    unsetenv("TANDEM_CUDA_GRAPHS");
    return rows;
  };
  EXPECT_EQ(*graphMaxRowsFromEnvironment(), kDefaultGraphMaxRows);
  EXPECT_EQ(*with("on"), kDefaultGraphMaxRows);
  EXPECT_EQ(*with("off"), 0);
  EXPECT_EQ(*with("0"), 0);
  EXPECT_EQ(*with("48"), 48);
  for (const char* bad : {"yes", "-3", "12rows"}) {
    const absl::StatusOr<int32_t> rows = with(bad);
    ASSERT_FALSE(rows.ok()) << bad;
    EXPECT_THAT(rows.status().message(), HasSubstr(std::string("TANDEM_CUDA_GRAPHS=") + bad));
  }
  setenv("TANDEM_CUDA_GRAPHS", "sometimes", 1);
  KernelBackend backend;
  unsetenv("TANDEM_CUDA_GRAPHS");
  EXPECT_THAT(backend.status().message(), HasSubstr("TANDEM_CUDA_GRAPHS=sometimes"));
}

// Sequences prefilled one per step, then decoded together with teacher-forced
// tokens; `plan` says, per decode step, which sequences decode and which new
// one (if any) is prefilled first. Returns every decode step's logits.
struct Seq {
  std::vector<TokenId> tokens;  // prompt, then the fed tokens
  std::vector<BlockId> table;
  int32_t cached = 0;  // positions in the cache
};

class DecodeRun {
 public:
  DecodeRun(Backend& backend, const std::shared_ptr<const ModelWeights>& weights)
      : weights_(weights), kv_(kvLayoutFor(weights->config, 96, 16)) {
    auto model = LlamaModel::create(weights, backend);
    EXPECT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
  }

  // A new sequence of `prompt` tokens, prefilled in one step.
  void prefill(int32_t prompt) {
    Seq s;
    s.tokens = testing::randomTokens(static_cast<size_t>(prompt) + 64, 900 + seqs_.size(), weights_->config.vocab_size);
    for (int32_t b = 0; b < (prompt + 64 + 15) / 16; ++b) s.table.push_back(BlockId(next_block_++));
    SequenceChunk c{.tokens = std::span<const TokenId>(s.tokens).first(static_cast<size_t>(prompt)),
                    .start_pos = 0,
                    .block_table = s.table,
                    .want_logits = true};
    std::vector<float> logits;
    EXPECT_TRUE(model_->forward(std::span<const SequenceChunk>(&c, 1), kv_, &logits).ok());
    s.cached = prompt;
    seqs_.push_back(std::move(s));
  }

  // One decode step of the sequences `which`.
  std::vector<float> decode(const std::vector<size_t>& which) {
    std::vector<SequenceChunk> batch;
    for (size_t i : which) {
      Seq& s = seqs_[i];
      batch.push_back(
          SequenceChunk{.tokens = std::span<const TokenId>(s.tokens).subspan(static_cast<size_t>(s.cached), 1),
                        .start_pos = s.cached,
                        .block_table = s.table,
                        .want_logits = true});
    }
    std::vector<float> logits;
    const absl::Status st = model_->forward(batch, kv_, &logits);
    EXPECT_TRUE(st.ok()) << st;
    EXPECT_EQ(logits.size(), which.size() * static_cast<size_t>(weights_->config.vocab_size))
        << "the padding rows' logits were returned";
    for (size_t i : which) ++seqs_[i].cached;
    return logits;
  }

 private:
  std::shared_ptr<const ModelWeights> weights_;
  KvStorage kv_;
  std::unique_ptr<LlamaModel> model_;
  std::vector<Seq> seqs_;
  int32_t next_block_ = 0;
};

// Decode steps of 3 rows (bucket 4, one padding row), a prefill longer than
// any before (the activations grow: the next replay finds a pointer moved),
// 4 rows with one crossing 512 keys (a new split bucket), then 2 rows.
std::vector<std::vector<float>> scenario(KernelBackend& backend, const std::shared_ptr<const ModelWeights>& weights) {
  DecodeRun run(backend, weights);
  std::vector<std::vector<float>> out;
  for (int32_t prompt : {5, 30, 200}) run.prefill(prompt);
  for (int s = 0; s < 4; ++s) out.push_back(run.decode({0, 1, 2}));
  run.prefill(509);
  for (int s = 0; s < 6; ++s) out.push_back(run.decode({0, 1, 2, 3}));
  for (int s = 0; s < 3; ++s) out.push_back(run.decode({1, 3}));
  EXPECT_TRUE(backend.status().ok()) << backend.status();
  return out;
}

class KernelBackendGraphFamilyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(KernelBackendGraphFamilyTest, GraphedDecodeStepsGiveTheLaunchByLaunchBits) {
  const ModelConfig config = GetParam() == "tiny" ? tinyModelConfig() : *smallArchConfig(GetParam());
  const std::shared_ptr<const ModelWeights> weights = makeRandomWeights(config, 20261127, {.random_norm_gains = true});
  KernelBackend graphed(KernelBackendOptions{.graph_max_rows = kDefaultGraphMaxRows});
  KernelBackend eager(KernelBackendOptions{.graph_max_rows = 0});
  const auto want = scenario(eager, weights);
  const auto got = scenario(graphed, weights);
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < want.size(); ++s) {
    ASSERT_EQ(got[s].size(), want[s].size()) << s;
    EXPECT_EQ(std::memcmp(got[s].data(), want[s].data(), want[s].size() * sizeof(float)), 0) << "decode step " << s;
  }
  const KernelBackend::GraphStats g = graphed.graphStats(), e = eager.graphStats();
  std::printf("%s: graphs captured %lld, replayed %lld, left %lld, padding rows %lld, held %lld\n", GetParam().c_str(),
              static_cast<long long>(g.captured), static_cast<long long>(g.replayed), static_cast<long long>(g.eager),
              static_cast<long long>(g.padding_rows), static_cast<long long>(g.graphs));
  // Keys (4 rows, 1 split), (4, 2) and (2, 2): each captured at least once.
  EXPECT_GE(g.captured, 3);
  EXPECT_GE(g.replayed, 6);
  EXPECT_GE(g.eager, 1) << "the replay after the activations grew was not refused";
  EXPECT_EQ(g.padding_rows, 4) << "4 steps of 3 rows padded to 4";
  EXPECT_EQ(g.graphs, 3);
  EXPECT_EQ(e.captured + e.replayed + e.eager + e.padding_rows, 0) << "graph_max_rows 0 still graphed";
}

INSTANTIATE_TEST_SUITE_P(Families, KernelBackendGraphFamilyTest, ::testing::Values("qwen3"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// Through the engine, sampling on the device: seeded sampling and greedy
// requests in one batch give the tokens of launch-by-launch steps and of the
// CPU engine, while the decode steps replay graphs.
TEST(KernelBackendGraphTest, TheEngineSamplesTheSameTokensFromGraphedSteps) {
  EngineOptions o;
  o.num_blocks = 64;
  o.block_size = 16;
  o.max_num_batched_tokens = 256;
  o.max_num_seqs = 8;
  o.seed = 7;
  // `before_end` runs while the harness still owns the backend.
  auto run = [&](std::unique_ptr<Backend> backend, const std::function<void()>& before_end = {}) {
    testing::Harness h(o, true, std::move(backend));
    std::mt19937 rng(5);
    std::vector<RequestId> ids;
    for (int i = 0; i < 5; ++i) {
      RequestSpec spec = testing::greedy(testing::randomPrompt(rng, 10 + 7 * i), 12);
      if (i % 2 == 1) {
        spec.sampling.temperature = 0.8f;
        spec.sampling.top_k = 20;
        spec.sampling.top_p = 0.9f;
        spec.sampling.seed = 100 + i;
      }
      ids.push_back(h.add(std::move(spec)));
    }
    h.runToCompletion();
    if (before_end) before_end();
    std::vector<std::vector<TokenId>> tokens;
    for (RequestId id : ids) tokens.push_back(h.outcome(id).tokens);
    return tokens;
  };
  auto graphed = std::make_unique<KernelBackend>(KernelBackendOptions{.graph_max_rows = kDefaultGraphMaxRows});
  const KernelBackend* view = graphed.get();
  KernelBackend::GraphStats stats;
  int64_t sampled_on_device = 0;
  const auto on_graphs = run(std::move(graphed), [&] {
    EXPECT_TRUE(view->status().ok()) << view->status();
    stats = view->graphStats();
    sampled_on_device = view->rowsSampledOnDevice();
  });
  const auto launch_by_launch = run(std::make_unique<KernelBackend>(KernelBackendOptions{.graph_max_rows = 0}));
  const auto on_cpu = run(makeCpuBackend());
  EXPECT_EQ(on_graphs, launch_by_launch);
  EXPECT_EQ(on_graphs, on_cpu);
  EXPECT_GE(stats.captured, 1);
  EXPECT_GE(stats.replayed, 3);
  EXPECT_GT(sampled_on_device, 0) << "the sampling kernel did not run";
}

}  // namespace
}  // namespace tandem::engine
