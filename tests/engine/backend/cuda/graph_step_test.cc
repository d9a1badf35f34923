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
#include <optional>
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
  EXPECT_FALSE(device.pinHost(twos.data(), n * sizeof(float)).ok());
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
  // Whatever the environment had is put back (every default-constructed
  // kernel backend reads it).
  const char* was = std::getenv("TANDEM_CUDA_GRAPHS");
  const std::optional<std::string> saved = was != nullptr ? std::optional<std::string>(was) : std::nullopt;
  auto set = [](const char* value) {
    if (value != nullptr) {
      setenv("TANDEM_CUDA_GRAPHS", value, 1);
    } else {
      unsetenv("TANDEM_CUDA_GRAPHS");
    }
  };
  auto with = [&](const char* value) {
    set(value);
    return graphMaxRowsFromEnvironment();
  };
  EXPECT_EQ(*with(nullptr), kDefaultGraphMaxRows);
  EXPECT_EQ(*with("on"), kDefaultGraphMaxRows);
  EXPECT_EQ(*with("off"), 0);
  EXPECT_EQ(*with("0"), 0);
  EXPECT_EQ(*with("48"), 48);
  EXPECT_EQ(*with("512"), KernelBackend::kMaxGraphRows);
  for (const char* bad : {"yes", "-3", "12rows", "513"}) {
    const absl::StatusOr<int32_t> rows = with(bad);
    ASSERT_FALSE(rows.ok()) << bad;
    EXPECT_THAT(rows.status().message(), HasSubstr(std::string("TANDEM_CUDA_GRAPHS=") + bad + ": expected on, off"));
  }
  set("sometimes");
  {
    KernelBackend backend;
    EXPECT_THAT(backend.status().message(), HasSubstr("TANDEM_CUDA_GRAPHS=sometimes"));
  }
  set(saved ? saved->c_str() : nullptr);
}

// A step driven by hand: add and gatherRows on small buffers, so that each
// way through a graph step can be forced. `x`, `y`, `other`, `src`, `dst` are
// host vectors the executor adopts as device memory (residentWeight), so
// they are read directly after each step.
struct Buffers {
  static constexpr int32_t kDim = 8, kSrcRows = 24, kMaxGathered = 20;
  std::vector<float> x, y, other, src, dst;
  std::vector<std::unique_ptr<BackendBuffer>> held;
  float *dx, *dy, *dother, *dsrc, *ddst;

  explicit Buffers(KernelBackend& b) {
    auto fill = [](std::vector<float>& v, size_t n, float base) {
      v.resize(n);
      for (size_t i = 0; i < n; ++i) v[i] = base + 0.25f * static_cast<float>(i);
    };
    fill(x, 2 * kDim, 1.0f);
    fill(y, 2 * kDim, 0.5f);
    fill(other, 2 * kDim, -3.0f);
    fill(src, kSrcRows * kDim, 10.0f);
    fill(dst, kMaxGathered * kDim, 0.0f);
    for (auto* v : {&x, &y, &other, &src, &dst}) held.push_back(b.residentWeight(*v));
    dx = held[0]->data(), dy = held[1]->data(), dother = held[2]->data(), dsrc = held[3]->data();
    ddst = held[4]->data();
  }
};

enum class Variant { kSame, kMovedPointer, kFewerCalls, kMoreRows };

// The step's calls, between beginStep and endStep.
void issueCalls(KernelBackend& b, Buffers& m, const std::vector<int32_t>& rows, Variant v) {
  b.add(m.dx, m.dy, 2 * Buffers::kDim);
  // Metadata: staged in a graph step. 20 rows do not fit the room 2 had.
  std::vector<int32_t> gathered = rows;
  if (v == Variant::kMoreRows) {
    for (int32_t r = 0; static_cast<int32_t>(gathered.size()) < Buffers::kMaxGathered; ++r) gathered.push_back(r);
  }
  b.gatherRows(m.dsrc, gathered.data(), static_cast<int32_t>(gathered.size()), Buffers::kDim, m.ddst);
  b.add(v == Variant::kMovedPointer ? m.dother : m.dx, m.dy, 2 * Buffers::kDim);
  if (v != Variant::kFewerCalls) b.add(m.dx, m.ddst, 2 * Buffers::kDim);
}

// Returns x, dst and other after the step.
std::vector<float> driveStep(KernelBackend& b, Buffers& m, const std::vector<int32_t>& rows, Variant v) {
  EXPECT_EQ(b.beginStep({.rows = 2, .decode = true, .max_position = 3}), 2);
  issueCalls(b, m, rows, v);
  b.endStep();
  EXPECT_TRUE(b.status().ok()) << b.status();
  std::vector<float> out = m.x;
  out.insert(out.end(), m.dst.begin(), m.dst.end());
  out.insert(out.end(), m.other.begin(), m.other.end());
  return out;
}

const std::vector<std::pair<std::vector<int32_t>, Variant>> kSteps = {
    {{0, 1}, Variant::kSame},          // warm-up: launch by launch
    {{2, 3}, Variant::kSame},          // captured
    {{5, 4}, Variant::kSame},          // replayed: reads this step's rows
    {{1, 5}, Variant::kMovedPointer},  // replay refused at the third call: left
    {{3, 3}, Variant::kSame},          // captured again
    {{4, 0}, Variant::kFewerCalls},    // fewer calls than the graph: left
    {{2, 1}, Variant::kSame},          // captured again
    {{0, 5}, Variant::kSame},          // replayed
    {{5, 2}, Variant::kMoreRows},      // no room mid-replay: the buffer grows, left
    {{1, 4}, Variant::kSame},          // captured again
    {{3, 0}, Variant::kSame},          // replayed
};

TEST(KernelBackendGraphTest, EveryWayThroughAGraphStepGivesTheLaunchByLaunchResults) {
  KernelBackend eager(KernelBackendOptions{.graph_max_rows = 0});
  KernelBackend graphed(KernelBackendOptions{.graph_max_rows = kDefaultGraphMaxRows});
  Buffers e(eager), g(graphed);
  for (size_t i = 0; i < kSteps.size(); ++i) {
    const auto want = driveStep(eager, e, kSteps[i].first, kSteps[i].second);
    const auto got = driveStep(graphed, g, kSteps[i].first, kSteps[i].second);
    EXPECT_EQ(got, want) << "step " << i;
  }
  const KernelBackend::GraphStats s = graphed.graphStats();
  EXPECT_EQ(s.warmed, 1);
  EXPECT_EQ(s.captured, 4);
  EXPECT_EQ(s.replayed, 3);
  EXPECT_EQ(s.left, 3);
  EXPECT_EQ(s.graphs, 1);
  EXPECT_TRUE(graphed.graphFailure().ok());
  const KernelBackend::MetadataUploads u = graphed.metadataUploads();
  EXPECT_GT(u.uploaded, 0);
}

// A device whose capture or graph launch fails when told to.
class FailingDevice : public gpu::ExecutorDevice {
 public:
  int fail_capture = 0, fail_launch = 0;  // calls to fail, from the next
  absl::Status beginCapture() override {
    if (fail_capture > 0 && fail_capture-- > 0) return absl::InternalError("injected: no capture");
    return ExecutorDevice::beginCapture();
  }
  absl::Status launchGraph(const gpu::DeviceGraph& graph) override {
    if (fail_launch > 0 && fail_launch-- > 0) return absl::InternalError("injected: no launch");
    return ExecutorDevice::launchGraph(graph);
  }
};

// A capture that fails turns graphs off for good; the step's deferred work
// and every later step run launch by launch, and the backend keeps serving.
TEST(KernelBackendGraphTest, AFailedCaptureTurnsGraphsOffAndTheStepsStillRun) {
  auto device = std::make_shared<FailingDevice>();
  KernelBackend graphed(device, KernelBackendOptions{.graph_max_rows = kDefaultGraphMaxRows});
  KernelBackend eager(KernelBackendOptions{.graph_max_rows = 0});
  Buffers e(eager), g(graphed);
  for (size_t i = 0; i < kSteps.size(); ++i) {
    if (i == 1) device->fail_capture = 1;  // step 1 captures
    const auto want = driveStep(eager, e, kSteps[i].first, Variant::kSame);
    const auto got = driveStep(graphed, g, kSteps[i].first, Variant::kSame);
    EXPECT_EQ(got, want) << "step " << i;
  }
  EXPECT_TRUE(graphed.status().ok()) << graphed.status();
  EXPECT_THAT(graphed.graphFailure().message(), HasSubstr("CUDA graphs turned off: injected: no capture"));
  EXPECT_EQ(graphed.graphMaxRows(), 0);
  const KernelBackend::GraphStats s = graphed.graphStats();
  EXPECT_EQ(s.captured + s.replayed + s.graphs, 0);
  EXPECT_EQ(s.left, 1);
}

// A graph launch that fails fails its step (part of the graph may have run:
// its calls are not run again), naming what to set to run without graphs.
TEST(KernelBackendGraphTest, AFailedGraphLaunchFailsTheStepNamingTheSetting) {
  for (const size_t failing_step : {1, 2}) {  // the capture's launch, a replay's
    SCOPED_TRACE(failing_step == 1 ? "capture" : "replay");
    auto device = std::make_shared<FailingDevice>();
    KernelBackend graphed(device, KernelBackendOptions{.graph_max_rows = kDefaultGraphMaxRows});
    Buffers g(graphed);
    for (size_t i = 0; i < failing_step; ++i) driveStep(graphed, g, kSteps[i].first, Variant::kSame);
    device->fail_launch = 1;
    EXPECT_EQ(graphed.beginStep({.rows = 2, .decode = true, .max_position = 3}), 2);
    issueCalls(graphed, g, kSteps[failing_step].first, Variant::kSame);
    graphed.endStep();
    EXPECT_THAT(graphed.status().message(), HasSubstr("a CUDA graph's launch failed (TANDEM_CUDA_GRAPHS=off"));
    EXPECT_THAT(graphed.status().message(), HasSubstr("injected: no launch"));
    EXPECT_EQ(graphed.graphMaxRows(), 0);
    EXPECT_EQ(graphed.graphStats().graphs, 0);
  }
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
  DecodeRun(Backend& backend, const std::shared_ptr<const ModelWeights>& weights, KvDtype kv_dtype = KvDtype::kFloat32)
      : weights_(weights), kv_(kvLayoutFor(weights->config, 96, 16, kv_dtype)) {
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
std::vector<std::vector<float>> scenario(KernelBackend& backend, const std::shared_ptr<const ModelWeights>& weights,
                                         KvDtype kv_dtype = KvDtype::kFloat32) {
  DecodeRun run(backend, weights, kv_dtype);
  std::vector<std::vector<float>> out;
  for (int32_t prompt : {5, 30, 200}) run.prefill(prompt);
  for (int s = 0; s < 4; ++s) out.push_back(run.decode({0, 1, 2}));
  run.prefill(509);
  for (int s = 0; s < 6; ++s) out.push_back(run.decode({0, 1, 2, 3}));
  for (int s = 0; s < 3; ++s) out.push_back(run.decode({1, 3}));
  EXPECT_TRUE(backend.status().ok()) << backend.status();
  return out;
}

// A family, and what its projections read: with bf16 (--dtype bfloat16)
// each projection's toBf16 launch and bf16 GEMM are graphed with the step,
// the bf16 input's buffer compared like any other pointer. And what the KV
// pool holds (--kv-dtype bfloat16: the writes and attention's reads of bf16).
struct GraphCase {
  std::string family;
  GemmDtype dtype;
  KvDtype kv_dtype = KvDtype::kFloat32;
};
void PrintTo(const GraphCase& c, std::ostream* os) {
  *os << c.family << " " << gemmDtypeName(c.dtype) << " kv " << kvDtypeName(c.kv_dtype);
}

class KernelBackendGraphFamilyTest : public ::testing::TestWithParam<GraphCase> {};

TEST_P(KernelBackendGraphFamilyTest, GraphedDecodeStepsGiveTheLaunchByLaunchBits) {
  const std::string& family = GetParam().family;
  const ModelConfig config = family == "tiny" ? tinyModelConfig() : *smallArchConfig(family);
  const std::shared_ptr<const ModelWeights> weights = makeRandomWeights(config, 20261127, {.random_norm_gains = true});
  const CpuBackendOptions gemm{.gemm_dtype = GetParam().dtype};
  KernelBackend graphed(KernelBackendOptions{.gemm = gemm, .graph_max_rows = kDefaultGraphMaxRows});
  KernelBackend eager(KernelBackendOptions{.gemm = gemm, .graph_max_rows = 0});
  const auto want = scenario(eager, weights, GetParam().kv_dtype);
  const auto got = scenario(graphed, weights, GetParam().kv_dtype);
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < want.size(); ++s) {
    ASSERT_EQ(got[s].size(), want[s].size()) << s;
    EXPECT_EQ(std::memcmp(got[s].data(), want[s].data(), want[s].size() * sizeof(float)), 0) << "decode step " << s;
  }
  const KernelBackend::GraphStats g = graphed.graphStats(), e = eager.graphStats();
  std::printf("%s: graphs captured %lld, replayed %lld, left %lld, padding rows %lld, held %lld\n", family.c_str(),
              static_cast<long long>(g.captured), static_cast<long long>(g.replayed), static_cast<long long>(g.left),
              static_cast<long long>(g.padding_rows), static_cast<long long>(g.graphs));
  // Keys (4 rows, 1 split): warm-up, capture, 2 replays; after the long
  // prefill a replay refused (left), a capture, a replay. (4, 2) and (2, 2):
  // warm-up, capture, replay each.
  EXPECT_EQ(g.warmed, 3);
  EXPECT_EQ(g.captured, 4);
  EXPECT_EQ(g.replayed, 5);
  EXPECT_EQ(g.left, 1) << "the replay after the activations grew was not refused";
  EXPECT_EQ(g.padding_rows, 4) << "4 steps of 3 rows padded to 4";
  EXPECT_EQ(g.graphs, 3);
  EXPECT_EQ(e.warmed + e.captured + e.replayed + e.left + e.padding_rows, 0) << "graph_max_rows 0 still graphed";
}

// bf16 projections and a bf16 pool in one case: each case runs a whole
// scenario twice on the executor.
INSTANTIATE_TEST_SUITE_P(Families, KernelBackendGraphFamilyTest,
                         ::testing::Values(GraphCase{"qwen3", GemmDtype::kFloat32},
                                           GraphCase{"qwen3", GemmDtype::kBfloat16, KvDtype::kBfloat16}),
                         [](const ::testing::TestParamInfo<GraphCase>& i) {
                           return i.param.family + "_" + gemmDtypeName(i.param.dtype) +
                                  (i.param.kv_dtype == KvDtype::kBfloat16 ? "_kv_bfloat16" : "");
                         });

// Through the engine, sampling on the device: seeded sampling and greedy
// requests in one batch give the tokens of launch-by-launch steps (and the
// greedy ones the CPU engine's), while the decode steps replay graphs.
TEST(KernelBackendGraphTest, TheEngineSamplesTheSameTokensFromGraphedSteps) {
  const EngineOptions o = testing::smallPoolOptions();
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
  // The CPU engine's logits are not the kernels' bit for bit (within 1e-4:
  // kernel_backend_test), so only the greedy requests are held to its tokens.
  ASSERT_EQ(on_cpu.size(), on_graphs.size());
  for (size_t i = 0; i < on_cpu.size(); i += 2) EXPECT_EQ(on_graphs[i], on_cpu[i]) << "greedy request " << i;
  EXPECT_GE(stats.captured, 1);
  EXPECT_GE(stats.replayed, 3);
  EXPECT_GT(sampled_on_device, 0) << "the sampling kernel did not run";
}

}  // namespace
}  // namespace tandem::engine
