// Tensor parallelism on the CPU (tensor_parallel.h): shardWeights' slicing
// and errors, the in-process all-reduce's order, and TP=N forward passes
// against the plain (TP=1) LlamaModel for the tiny model and every family.

#include "engine/model/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/model/model_loader.h"
#include "tests/engine/model/random_tokens.h"
#include "tests/engine/model/scratch_dir.h"

namespace tandem::engine {
namespace {

using ::testing::HasSubstr;
using testing::randomTokens;

constexpr uint64_t kSeed = 20240611;
constexpr int kBlockSize = 4;
constexpr int kNumBlocks = 16;  // 64 positions: the prompt and the decode steps fit

// TP=N logits match TP=1 to within kRelTolerance · max|logit of TP=1| per
// step. The all-reduce adds the ranks' partial o_proj / down_proj products
// in a different order from one GEMM over the whole row, so the residual
// stream differs by rounding (a few ulp) after the first layer and that
// propagates. Measured (this test prints it): the worst max|diff| /
// max|logit| over the prompt and decode steps is 1.6e-6 (tiny, TP=8); the
// families at TP=2 stay below 7e-7. The bound leaves a 6x margin and is far
// below what a wrong head, KV-head or column mapping does (0.4 to 1.3 when
// rank 1 was given rank 0's KV heads). The cache's K/V of layers after the
// first are held to the same bound relative to their max |K| or |V|
// (measured worst 1.7e-6).
constexpr double kRelTolerance = 1e-5;

// A prompt prefilled in chunks of `chunk` tokens, then one fixed token per
// decode step (not greedy: TP=1 and TP=N see the same inputs however close
// their logits are). Steps produce the logits of the prompt's last token and
// of each decode token.
struct Script {
  std::vector<TokenId> prompt;
  std::vector<TokenId> decode;
  size_t chunk = 1000;
};

Script makeScript(const ModelConfig& c, size_t chunk = 1000) {
  return Script{.prompt = randomTokens(21, 7, c.vocab_size), .decode = randomTokens(4, 8, c.vocab_size), .chunk = chunk};
}

using ForwardFn = std::function<absl::Status(std::span<const SequenceChunk>, std::vector<float>*)>;

// [steps][vocab] logits of the script; one sequence in blocks 0, 1, ...
std::vector<std::vector<float>> runScript(const Script& s, const ForwardFn& forward) {
  std::vector<BlockId> table;
  for (int b = 0; b < kNumBlocks; ++b) table.push_back(BlockId(b));
  std::vector<std::vector<float>> out;
  std::vector<float> logits;
  auto step = [&](std::span<const TokenId> tokens, size_t start, bool want) {
    const SequenceChunk chunk{.tokens = tokens,
                              .start_pos = static_cast<int32_t>(start),
                              .block_table = table,
                              .want_logits = want};
    const absl::Status st = forward(std::span<const SequenceChunk>(&chunk, 1), &logits);
    EXPECT_TRUE(st.ok()) << st;
    if (want) out.push_back(logits);
  };
  for (size_t pos = 0; pos < s.prompt.size(); pos += s.chunk) {
    const size_t n = std::min(s.chunk, s.prompt.size() - pos);
    step(std::span<const TokenId>(s.prompt).subspan(pos, n), pos, pos + n == s.prompt.size());
  }
  for (size_t i = 0; i < s.decode.size(); ++i) {
    step(std::span<const TokenId>(s.decode).subspan(i, 1), s.prompt.size() + i, true);
  }
  return out;
}

// The plain model (TP=1) on its own backend and cache.
struct Plain {
  CpuBackend backend{CpuBackendOptions{.num_threads = 1}};
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<KvStorage> kv;

  explicit Plain(std::shared_ptr<const ModelWeights> weights) {
    auto m = LlamaModel::create(std::move(weights), backend);
    EXPECT_TRUE(m.ok()) << m.status();
    model = std::move(*m);
    kv = std::make_unique<KvStorage>(kvLayoutFor(model->config(), kNumBlocks, kBlockSize));
  }
  std::vector<std::vector<float>> run(const Script& s) {
    return runScript(s, [this](std::span<const SequenceChunk> b, std::vector<float>* l) {
      return model->forward(b, *kv, l);
    });
  }
};

std::unique_ptr<TensorParallelModel> makeTp(const ModelWeights& full, int world) {
  auto tp = TensorParallelModel::create(
      full, TensorParallelOptions{.world = world, .num_blocks = kNumBlocks, .block_size = kBlockSize});
  EXPECT_TRUE(tp.ok()) << tp.status();
  return tp.ok() ? std::move(*tp) : nullptr;
}

// Runs the script on `tp`, checking after every step that each rank's logits
// are bitwise rank 0's.
std::vector<std::vector<float>> runTp(TensorParallelModel& tp, const Script& s) {
  return runScript(s, [&tp](std::span<const SequenceChunk> b, std::vector<float>* l) {
    absl::Status st = tp.forward(b, l);
    for (int r = 1; r < tp.world(); ++r) {
      EXPECT_EQ(tp.rankLogits(r).size(), l->size());
      if (l->empty()) continue;  // a step without logits (memcmp must not see their null data)
      EXPECT_EQ(std::memcmp(tp.rankLogits(r).data(), l->data(), l->size() * sizeof(float)), 0)
          << "rank " << r << "'s logits differ from rank 0's";
    }
    return st;
  });
}

double maxAbs(std::span<const float> v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

double maxAbsDiff(std::span<const float> a, std::span<const float> b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

// One layer block's K (kv == 0) or V (kv == 1) rows of KV head `head`,
// positions [0, tokens), as a flat [tokens, head_dim] vector.
std::vector<float> kvHead(const KvStorage& kv, int layer, int kv_index, int head, int tokens) {
  const KvLayout& l = kv.layout();
  std::vector<float> out;
  for (int p = 0; p < tokens; ++p) {
    const BlockId block(p / l.block_size);
    const int slot = p % l.block_size;
    const float* row = kv_index == 0 ? kv.key(layer, block, slot) : kv.value(layer, block, slot);
    out.insert(out.end(), row + static_cast<size_t>(head) * l.head_dim, row + static_cast<size_t>(head + 1) * l.head_dim);
  }
  return out;
}

// TP=world against TP=1 on `weights`: logits within tolerance, ranks bitwise
// equal (runTp), and each rank's cache = its KV heads of the plain cache:
// layer 0 bitwise (its K/V come from the replicated embeddings through the
// rank's rows of k_proj/v_proj, before any all-reduce), later layers within
// tolerance. Returns the worst relative logit difference seen.
double expectMatchesPlain(std::shared_ptr<const ModelWeights> weights, int world, const std::string& what) {
  SCOPED_TRACE(what + ", TP=" + std::to_string(world));
  const ModelConfig& c = weights->config;
  const Script script = makeScript(c);
  Plain plain(weights);
  const auto want = plain.run(script);
  auto tp = makeTp(*weights, world);
  if (tp == nullptr) return 0;
  const auto got = runTp(*tp, script);
  EXPECT_EQ(got.size(), want.size());
  double worst = 0;     // logits
  double worst_kv = 0;  // layers >= 1 of the cache
  for (size_t t = 0; t < std::min(got.size(), want.size()); ++t) {
    const double scale = maxAbs(want[t]);
    const double diff = maxAbsDiff(got[t], want[t]);
    worst = std::max(worst, diff / scale);
    EXPECT_LE(diff, kRelTolerance * scale) << "step " << t;
  }
  const int tokens = static_cast<int>(script.prompt.size() + script.decode.size());
  const int local_kv = c.num_kv_heads / world;
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(tp->shardConfig(r).num_kv_heads, local_kv);
    EXPECT_EQ(tp->kv(r).layout().num_kv_heads, local_kv);
    for (int layer = 0; layer < c.num_layers; ++layer) {
      for (int kvi = 0; kvi < 2; ++kvi) {
        for (int h = 0; h < local_kv; ++h) {
          const auto mine = kvHead(tp->kv(r), layer, kvi, h, tokens);
          const auto full = kvHead(*plain.kv, layer, kvi, r * local_kv + h, tokens);
          if (layer == 0) {
            EXPECT_EQ(std::memcmp(mine.data(), full.data(), mine.size() * sizeof(float)), 0)
                << "layer 0 " << (kvi == 0 ? "K" : "V") << " of rank " << r << " local KV head " << h;
          } else {
            worst_kv = std::max(worst_kv, maxAbsDiff(mine, full) / maxAbs(full));
            EXPECT_LE(maxAbsDiff(mine, full), kRelTolerance * maxAbs(full))
                << "layer " << layer << " " << (kvi == 0 ? "K" : "V") << " of rank " << r << " local KV head " << h;
          }
        }
      }
    }
  }
  std::printf("%s TP=%d: max |logit diff| / max |logit| = %.3g; KV after layer 0: max |diff| / max |x| = %.3g\n",
              what.c_str(), world, worst, worst_kv);
  return worst;
}

// The tiny model with every query head its own KV head, so TP=4 and TP=8 fit.
std::shared_ptr<const ModelWeights> tinyMhaWeights() {
  ModelConfig c = tinyModelConfig();
  c.num_kv_heads = c.num_heads;
  return makeRandomWeights(c, kSeed);
}

// ---- shardWeights -----------------------------------------------------------

TEST(ShardWeights, SlicesHeadsColumnsAndIntermediate) {
  const auto full = makeRandomWeights(*smallArchConfig("qwen2"), kSeed);  // q/k/v biases
  const ModelConfig& c = full->config;
  constexpr int kWorld = 2;
  for (int r = 0; r < kWorld; ++r) {
    auto shard = shardWeights(*full, r, kWorld);
    ASSERT_TRUE(shard.ok()) << shard.status();
    const ModelConfig& s = shard->config;
    EXPECT_EQ(s.num_heads, c.num_heads / kWorld);
    EXPECT_EQ(s.num_kv_heads, c.num_kv_heads / kWorld);
    EXPECT_EQ(s.intermediate_size, c.intermediate_size / kWorld);
    EXPECT_EQ(s.hidden_size, c.hidden_size);
    EXPECT_EQ(s.head_dim, c.head_dim);
    EXPECT_EQ(shard->embed, full->embed);
    EXPECT_EQ(shard->lm_head, full->lm_head);
    EXPECT_EQ(shard->final_norm, full->final_norm);
    const LayerWeights& fl = full->layers[1];
    const LayerWeights& sl = shard->layers[1];
    const int64_t hidden = c.hidden_size;
    // KV head r·KV/world + j of the full model is the shard's KV head j.
    for (int j = 0; j < s.num_kv_heads; ++j) {
      const int64_t full_head = r * s.num_kv_heads + j;
      for (int64_t i = 0; i < c.head_dim * hidden; ++i) {
        ASSERT_EQ(sl.wk[j * c.head_dim * hidden + i], fl.wk[full_head * c.head_dim * hidden + i]);
        ASSERT_EQ(sl.wv[j * c.head_dim * hidden + i], fl.wv[full_head * c.head_dim * hidden + i]);
      }
      for (int d = 0; d < c.head_dim; ++d) ASSERT_EQ(sl.bk[j * c.head_dim + d], fl.bk[full_head * c.head_dim + d]);
    }
    // Query head r·H/world + j, its o_proj columns, and its KV head under GQA.
    const int group = c.num_heads / c.num_kv_heads;
    for (int j = 0; j < s.num_heads; ++j) {
      const int64_t full_head = r * s.num_heads + j;
      EXPECT_EQ(j / group + r * s.num_kv_heads, full_head / group) << "GQA mapping of local head " << j;
      for (int64_t i = 0; i < c.head_dim * hidden; ++i) {
        ASSERT_EQ(sl.wq[j * c.head_dim * hidden + i], fl.wq[full_head * c.head_dim * hidden + i]);
      }
      for (int d = 0; d < c.head_dim; ++d) ASSERT_EQ(sl.bq[j * c.head_dim + d], fl.bq[full_head * c.head_dim + d]);
      for (int64_t row = 0; row < hidden; ++row) {
        for (int d = 0; d < c.head_dim; ++d) {
          ASSERT_EQ(sl.wo[row * s.qDim() + j * c.head_dim + d], fl.wo[row * c.qDim() + full_head * c.head_dim + d]);
        }
      }
    }
    const int64_t i0 = static_cast<int64_t>(r) * s.intermediate_size;
    for (int64_t i = 0; i < s.intermediate_size; ++i) {
      for (int64_t k = 0; k < hidden; ++k) {
        ASSERT_EQ(sl.w_gate[i * hidden + k], fl.w_gate[(i0 + i) * hidden + k]);
        ASSERT_EQ(sl.w_up[i * hidden + k], fl.w_up[(i0 + i) * hidden + k]);
        ASSERT_EQ(sl.w_down[k * s.intermediate_size + i], fl.w_down[k * c.intermediate_size + i0 + i]);
      }
    }
  }
}

TEST(ShardWeights, ReplicatesQwen3QueryKeyNorms) {
  const auto full = makeRandomWeights(*smallArchConfig("qwen3"), kSeed, {.random_norm_gains = true});
  auto shard = shardWeights(*full, 1, 2);
  ASSERT_TRUE(shard.ok()) << shard.status();
  for (size_t l = 0; l < full->layers.size(); ++l) {
    EXPECT_EQ(shard->layers[l].q_norm, full->layers[l].q_norm);
    EXPECT_EQ(shard->layers[l].k_norm, full->layers[l].k_norm);
    EXPECT_EQ(shard->layers[l].q_norm.size(), static_cast<size_t>(full->config.head_dim));
  }
}

TEST(ShardWeights, RejectsBadWorldRankAndShapes) {
  const ModelConfig tiny = tinyModelConfig();  // 8 query heads, 2 KV heads, intermediate 688
  const ModelWeights only_config{.config = tiny};
  auto error = [&](const ModelWeights& w, int rank, int world) {
    auto shard = shardWeights(w, rank, world);
    EXPECT_FALSE(shard.ok());
    EXPECT_EQ(shard.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(shard.status().message());
  };
  EXPECT_THAT(error(only_config, 0, 0), HasSubstr("world size must be >= 1, got 0"));
  EXPECT_THAT(error(only_config, 0, -2), HasSubstr("world size must be >= 1, got -2"));
  EXPECT_THAT(error(only_config, -1, 2), HasSubstr("rank -1 is outside [0, 2)"));
  EXPECT_THAT(error(only_config, 2, 2), HasSubstr("rank 2 is outside [0, 2)"));
  EXPECT_THAT(error(only_config, 0, 3), HasSubstr("num_attention_heads (8) is not divisible by the world size 3"));
  EXPECT_THAT(error(only_config, 0, 4), HasSubstr("num_key_value_heads (2) is not divisible by the world size 4"));
  ModelWeights odd_mlp{.config = tiny};
  odd_mlp.config.intermediate_size = 689;
  EXPECT_THAT(error(odd_mlp, 1, 2), HasSubstr("intermediate_size (689) is not divisible by the world size 2"));
  // TensorParallelModel::create passes the same errors on.
  auto tp = TensorParallelModel::create(*makeRandomWeights(tiny, kSeed), TensorParallelOptions{.world = 4});
  ASSERT_FALSE(tp.ok());
  EXPECT_THAT(tp.status().message(), HasSubstr("num_key_value_heads (2) is not divisible by the world size 4"));
  tp = TensorParallelModel::create(*makeRandomWeights(tiny, kSeed), TensorParallelOptions{.world = 0});
  ASSERT_FALSE(tp.ok());
  EXPECT_THAT(tp.status().message(), HasSubstr("world size must be >= 1, got 0"));
}

// ---- InProcessAllReduce -------------------------------------------------------

// A rank's load (loadModelShard, layer by layer) is the whole model's load
// sharded afterwards, bit for bit, for every family and rank, with a
// checkpoint in bf16 (widened on read) as well as fp32.
TEST(ShardWeights, LoadingAShardIsShardingTheLoadedModel) {
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  };
  for (const std::string family : {"tiny", "llama3", "qwen2", "qwen3"}) {
    for (const DType dtype : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(family);
      testing::ScratchDir dir;
      const ModelConfig c = family == "tiny" ? tinyModelConfig() : *smallArchConfig(family);
      ASSERT_TRUE(writeModelDir(dir.path(), *makeRandomWeights(c, kSeed, {.random_norm_gains = true}), dtype).ok());
      auto full = loadModelWeights(dir.path());
      ASSERT_TRUE(full.ok()) << full.status();
      for (int rank = 0; rank < 2; ++rank) {
        auto want = shardWeights(**full, rank, 2);
        auto got = loadModelShard(dir.path(), rank, 2);
        ASSERT_TRUE(want.ok() && got.ok()) << got.status();
        EXPECT_EQ((*got)->config.num_heads, want->config.num_heads);
        EXPECT_EQ((*got)->config.num_kv_heads, want->config.num_kv_heads);
        EXPECT_EQ((*got)->config.intermediate_size, want->config.intermediate_size);
        EXPECT_TRUE(same((*got)->embed, want->embed));
        EXPECT_TRUE(same((*got)->lm_head, want->lm_head));
        EXPECT_TRUE(same((*got)->final_norm, want->final_norm));
        ASSERT_EQ((*got)->layers.size(), want->layers.size());
        for (size_t i = 0; i < want->layers.size(); ++i) {
          const LayerWeights &g = (*got)->layers[i], &w = want->layers[i];
          for (auto [a, b] : {std::pair{&g.wq, &w.wq}, {&g.wk, &w.wk}, {&g.wv, &w.wv}, {&g.wo, &w.wo},
                              {&g.w_gate, &w.w_gate}, {&g.w_up, &w.w_up}, {&g.w_down, &w.w_down},
                              {&g.attn_norm, &w.attn_norm}, {&g.ffn_norm, &w.ffn_norm}, {&g.bq, &w.bq},
                              {&g.bk, &w.bk}, {&g.bv, &w.bv}, {&g.q_norm, &w.q_norm}, {&g.k_norm, &w.k_norm}}) {
            EXPECT_TRUE(same(*a, *b)) << "layer " << i << " rank " << rank;
          }
        }
      }
    }
  }
  // A model that does not split, or a rank outside the world, fails naming
  // it before any tensor is read (the checkpoint here is not even there).
  testing::ScratchDir bare;
  std::ofstream(bare.file("config.json")) << R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 100, "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000})";
  EXPECT_THAT(std::string(loadModelShard(bare.path(), 0, 4).status().message()),
              HasSubstr("num_key_value_heads (2) is not divisible by the world size 4"));
  EXPECT_THAT(std::string(loadModelShard(bare.path(), 2, 2).status().message()),
              HasSubstr("rank 2 is outside [0, 2)"));
  EXPECT_THAT(std::string(loadModelShard(bare.path(), 0, 2).status().message()), HasSubstr("no weights"));
}

TEST(InProcessAllReduce, EveryRankGetsTheRankOrderSum) {
  constexpr int kWorld = 3;
  constexpr int kCalls = 200;
  constexpr int64_t kN = 5;
  InProcessAllReduce all_reduce(kWorld);
  // Values whose fp32 sum depends on the order: in rank order (big - big) + s
  // is s; (big + s) - big would round s to a multiple of big's ulp (8 or more).
  auto input = [](int rank, int call, int64_t i) -> float {
    const float big = 1e8f * static_cast<float>(1 + (call + i) % 3);
    return rank == 0 ? big : rank == 1 ? -big : static_cast<float>(call + i);
  };
  std::vector<std::vector<float>> results(kWorld, std::vector<float>(static_cast<size_t>(kCalls * kN)));
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      for (int call = 0; call < kCalls; ++call) {
        float* data = results[static_cast<size_t>(r)].data() + call * kN;
        for (int64_t i = 0; i < kN; ++i) data[i] = input(r, call, i);
        all_reduce.allReduce(r, data, kN);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int call = 0; call < kCalls; ++call) {
    for (int64_t i = 0; i < kN; ++i) {
      const float want = (input(0, call, i) + input(1, call, i)) + input(2, call, i);
      for (int r = 0; r < kWorld; ++r) {
        ASSERT_EQ(results[static_cast<size_t>(r)][static_cast<size_t>(call * kN + i)], want)
            << "rank " << r << ", call " << call << ", element " << i;
      }
    }
  }
}

// ---- Forward passes -----------------------------------------------------------

TEST(TensorParallelModel, TinyModelTp2MatchesTp1) {
  expectMatchesPlain(makeRandomWeights(tinyModelConfig(), kSeed), 2, "tiny");
}

TEST(TensorParallelModel, TinyMhaTp4AndTp8MatchTp1) {
  const auto weights = tinyMhaWeights();
  expectMatchesPlain(weights, 4, "tiny (8 KV heads)");
  expectMatchesPlain(weights, 8, "tiny (8 KV heads)");
}

TEST(TensorParallelModel, EveryFamilyTp2MatchesTp1) {
  for (const char* family : {"llama3", "qwen2", "qwen3"}) {
    expectMatchesPlain(makeRandomWeights(*smallArchConfig(family), kSeed, {.random_norm_gains = true}), 2, family);
  }
}

TEST(TensorParallelModel, Tp1IsBitwiseThePlainModel) {
  // World 1: the all-reduce hands the partial back unchanged and x += partial
  // adds the same product the folded GEMM adds.
  const std::shared_ptr<const ModelWeights> weights = makeRandomWeights(tinyModelConfig(), kSeed);
  const Script script = makeScript(weights->config);
  Plain plain(weights);
  const auto want = plain.run(script);
  auto tp = makeTp(*weights, 1);
  ASSERT_NE(tp, nullptr);
  const auto got = runTp(*tp, script);
  ASSERT_EQ(got.size(), want.size());
  for (size_t t = 0; t < got.size(); ++t) {
    EXPECT_EQ(std::memcmp(got[t].data(), want[t].data(), got[t].size() * sizeof(float)), 0) << "step " << t;
  }
}

TEST(TensorParallelModel, Tp2IsDeterministicAcrossRunsAndChunking) {
  const auto weights = makeRandomWeights(*smallArchConfig("qwen3"), kSeed);
  auto first = makeTp(*weights, 2);
  auto second = makeTp(*weights, 2);
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  const auto a = runTp(*first, makeScript(weights->config));
  const auto b = runTp(*second, makeScript(weights->config));
  auto chunked = makeTp(*weights, 2);
  ASSERT_NE(chunked, nullptr);
  const auto c = runTp(*chunked, makeScript(weights->config, /*chunk=*/5));
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), c.size());
  for (size_t t = 0; t < a.size(); ++t) {
    EXPECT_EQ(std::memcmp(a[t].data(), b[t].data(), a[t].size() * sizeof(float)), 0) << "run 2, step " << t;
    EXPECT_EQ(std::memcmp(a[t].data(), c[t].data(), a[t].size() * sizeof(float)), 0) << "chunked, step " << t;
  }
}

}  // namespace
}  // namespace tandem::engine
