// Tensor parallelism across processes (rank_group.h), with each follower on
// a thread of this process over a real socketpair: the group computes the
// in-process group's bits (the socket all-reduce adds in rank order), an
// engine whose rank 0 leads it serves what one process serves, and every
// way a rank can fail (gone before Hello, gone mid-step, a wrong Hello, a
// malformed frame) is an error that names the rank, fails the group and
// lets the followers go.

#include "engine/model/rank_group.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/model/tensor_parallel.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/model/random_tokens.h"

namespace tandem::engine {
namespace {

using ::testing::HasSubstr;
using testing::randomTokens;

constexpr uint64_t kSeed = 20261127;
constexpr int kBlockSize = 4;
constexpr int kNumBlocks = 16;

// A connected pair: [0] for the leader, [1] for the follower.
std::array<int, 2> socketPair() {
  std::array<int, 2> fds{-1, -1};
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds.data()), 0);
  return fds;
}

// Follower rank `rank` of `world` on its own thread: its shard of `full`, a
// CPU backend and a cache of num_blocks x block_size, serving until the
// leader closes its link. `layout_blocks` overrides the block count its
// Hello reports (a follower whose cache differs).
// `external`: the ranks sum through it (standing in for NCCL) instead of
// over the links.
class Follower {
 public:
  Follower(int fd, std::shared_ptr<const ModelWeights> full, int rank, int world, int num_blocks = kNumBlocks,
           InProcessAllReduce* external = nullptr)
      : thread_([this, fd, full = std::move(full), rank, world, num_blocks, external] {
          RankGroupFollower follower(fd, rank, world);
          auto shard = shardWeights(*full, rank, world);
          if (!shard.ok()) {
            result_ = shard.status();
            return;
          }
          auto weights = std::make_shared<const ModelWeights>(std::move(*shard));
          CpuBackend backend(CpuBackendOptions{.num_threads = 1});
          auto model = LlamaModel::create(
              weights, backend,
              external ? AllReducePartials([external, rank](float* p, int64_t n) { external->allReduce(rank, p, n); })
                       : follower.allReduce());
          if (!model.ok()) {
            result_ = model.status();
            return;
          }
          kv_ = std::make_unique<KvStorage>(kvLayoutFor(weights->config, num_blocks, kBlockSize));
          result_ = follower.hello(kv_->layout(), /*socket_all_reduce=*/external == nullptr);
          if (result_.ok()) result_ = follower.serve(**model, *kv_, backend);
        }) {}
  ~Follower() {
    if (thread_.joinable()) thread_.join();
  }
  // Waits for the thread; its serve() result.
  absl::Status join() {
    if (thread_.joinable()) thread_.join();
    return result_;
  }
  const KvStorage& kv() const { return *kv_; }

 private:
  absl::Status result_;
  std::unique_ptr<KvStorage> kv_;
  std::thread thread_;
};

// Rank 0 of `world` on this thread, its followers on theirs.
struct Group {
  std::shared_ptr<const ModelWeights> full;
  std::vector<std::unique_ptr<Follower>> followers;
  std::shared_ptr<RankGroupLeader> leader;
  std::shared_ptr<const ModelWeights> shard0;

  std::unique_ptr<InProcessAllReduce> external;

  // `nccl_like`: the ranks sum through an InProcessAllReduce, not the links.
  Group(std::shared_ptr<const ModelWeights> weights, int world, bool nccl_like = false) : full(std::move(weights)) {
    RankGroupLeader::Options o;
    if (nccl_like) {
      external = std::make_unique<InProcessAllReduce>(world);
      o.socket_all_reduce = false;
      o.all_reduce = [e = external.get()](float* p, int64_t n) { e->allReduce(0, p, n); };
    }
    for (int r = 1; r < world; ++r) {
      const auto fds = socketPair();
      o.links.push_back(fds[0]);
      followers.push_back(std::make_unique<Follower>(fds[1], full, r, world, kNumBlocks, external.get()));
    }
    auto shard = shardWeights(*full, 0, world);
    EXPECT_TRUE(shard.ok()) << shard.status();
    shard0 = std::make_shared<const ModelWeights>(std::move(*shard));
    o.layout = kvLayoutFor(shard0->config, kNumBlocks, kBlockSize);
    auto g = RankGroupLeader::connect(std::move(o));
    EXPECT_TRUE(g.ok()) << g.status();
    if (g.ok()) leader = std::move(*g);
  }
  // Closes the links; every follower's serve() result.
  std::vector<absl::Status> finish() {
    leader.reset();
    std::vector<absl::Status> out;
    for (auto& f : followers) out.push_back(f->join());
    return out;
  }
};

// Prompt in chunks of 5, then 4 decode steps: [steps][vocab] logits.
std::vector<std::vector<float>> runScript(
    const ModelConfig& c, const std::function<absl::Status(std::span<const SequenceChunk>, std::vector<float>*)>& fwd) {
  const std::vector<TokenId> prompt = randomTokens(21, 7, c.vocab_size);
  const std::vector<TokenId> decode = randomTokens(4, 8, c.vocab_size);
  std::vector<BlockId> table;
  for (int b = 0; b < kNumBlocks; ++b) table.push_back(BlockId(b));
  std::vector<std::vector<float>> out;
  std::vector<float> logits;
  auto step = [&](std::span<const TokenId> tokens, size_t start, bool want) {
    const SequenceChunk chunk{
        .tokens = tokens, .start_pos = static_cast<int32_t>(start), .block_table = table, .want_logits = want};
    const absl::Status st = fwd(std::span<const SequenceChunk>(&chunk, 1), &logits);
    EXPECT_TRUE(st.ok()) << st;
    if (want) out.push_back(logits);
  };
  for (size_t pos = 0; pos < prompt.size(); pos += 5) {
    const size_t n = std::min<size_t>(5, prompt.size() - pos);
    step(std::span<const TokenId>(prompt).subspan(pos, n), pos, pos + n == prompt.size());
  }
  for (size_t i = 0; i < decode.size(); ++i) step(std::span<const TokenId>(decode).subspan(i, 1), prompt.size() + i, true);
  return out;
}

bool sameBits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A config that splits `world` ways (3 or 4 ranks: the order of a sum of
// three or more partials shows; two add the same either way).
ModelConfig splittable(int world) {
  ModelConfig c = tinyModelConfig();
  c.num_heads = 2 * world;
  c.num_kv_heads = world;
  c.intermediate_size = 96;
  return c;
}

TEST(RankGroup, AcrossTheLinksTheGroupComputesTheInProcessGroupsBits) {
  struct Case {
    std::string what;
    std::shared_ptr<const ModelWeights> full;
    int world;
    bool nccl_like = false;
  };
  const std::vector<Case> cases = {
      {"tiny", makeRandomWeights(tinyModelConfig(), kSeed), 2},
      {"qwen3", makeRandomWeights(*smallArchConfig("qwen3"), kSeed, {.random_norm_gains = true}), 2},
      {"3 ranks", makeRandomWeights(splittable(3), kSeed), 3},
      {"4 ranks", makeRandomWeights(splittable(4), kSeed), 4},
      // The ranks reduce elsewhere (NCCL on GPUs): rank 0's model must use
      // the group's all-reduce, and only Steps and Dones cross the links.
      {"4 ranks reducing elsewhere", makeRandomWeights(splittable(4), kSeed), 4, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const std::shared_ptr<const ModelWeights>& full = c.full;
    {
      const int world = c.world;
      Group g(full, world, c.nccl_like);
      ASSERT_NE(g.leader, nullptr);
      CpuBackend backend(CpuBackendOptions{.num_threads = 1});
      auto model = LlamaModel::create(g.shard0, backend, g.leader->allReduce());
      ASSERT_TRUE(model.ok()) << model.status();
      KvStorage kv(kvLayoutFor(g.shard0->config, kNumBlocks, kBlockSize));
      const auto got = runScript(full->config, [&](std::span<const SequenceChunk> b, std::vector<float>* l) {
        TANDEM_RETURN_IF_ERROR(g.leader->beginStep({}, b));
        TANDEM_RETURN_IF_ERROR((*model)->forward(b, kv, l));
        return g.leader->endStep();
      });

      auto tp = TensorParallelModel::create(
          *full, TensorParallelOptions{.world = world, .num_blocks = kNumBlocks, .block_size = kBlockSize});
      ASSERT_TRUE(tp.ok()) << tp.status();
      const auto want = runScript(full->config, [&](std::span<const SequenceChunk> b, std::vector<float>* l) {
        return (*tp)->forward(b, l);
      });
      ASSERT_EQ(got.size(), want.size());
      for (size_t t = 0; t < got.size(); ++t) EXPECT_TRUE(sameBits(got[t], want[t])) << "step " << t;
      EXPECT_TRUE(std::ranges::equal(kv.bytes(), (*tp)->kv(0).bytes()));
      for (absl::Status s : g.finish()) EXPECT_TRUE(s.ok()) << s;  // closed between steps: a clean exit
      // Each follower's cache holds its KV heads as the in-process rank's does.
      for (int r = 1; r < world; ++r) {
        const KvStorage& theirs = g.followers[static_cast<size_t>(r - 1)]->kv();
        EXPECT_TRUE(std::ranges::equal(theirs.bytes(), (*tp)->kv(r).bytes())) << "rank " << r << "'s cache";
      }
    }
  }
}

// An engine leading a TP=2 group serves what one process serves: greedy
// tokens of sequences that share a prefix (prefix-cache hits) and of a
// partial block shared and then written (a copy-on-write block copy the
// follower must make too).
TEST(RankGroup, AnEngineLeadingAGroupServesWhatOneProcessServes) {
  const auto full = testing::tinyWeights();
  std::mt19937 rng(7);
  const std::vector<TokenId> prefix = testing::randomPrompt(rng, 24);  // 6 full blocks
  std::vector<std::vector<TokenId>> prompts;
  for (int i = 0; i < 4; ++i) {
    std::vector<TokenId> p = prefix;
    const std::vector<TokenId> tail = testing::randomPrompt(rng, 3 + i);
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(p);
  }
  // The prefix alone: all but its last token hit the cache, so its last
  // cached block is copied (copy-on-write) before that token is written.
  prompts.push_back(prefix);

  auto serve = [&](EngineOptions o, std::shared_ptr<const ModelWeights> weights) {
    testing::Harness h(o, true, nullptr, std::move(weights));
    std::vector<RequestId> ids;
    for (const auto& p : prompts) {
      ids.push_back(h.add(testing::greedy(p, 6)));
      h.step();  // one at a time into the cache, so later ones hit it
    }
    h.runToCompletion();
    std::vector<std::vector<TokenId>> out;
    for (RequestId id : ids) {
      EXPECT_EQ(h.outcome(id).final.finish_reason, FinishReason::kLength) << h.outcome(id).final.message;
      out.push_back(h.outcome(id).tokens);
    }
    return out;
  };
  EngineOptions o{.num_blocks = kNumBlocks * 4, .block_size = kBlockSize, .seed = 1};
  const auto want = serve(o, full);

  RankGroupLeader::Options lo;
  const auto fds = socketPair();
  lo.links.push_back(fds[0]);
  Follower follower(fds[1], full, 1, 2, o.num_blocks);
  auto shard = shardWeights(*full, 0, 2);
  ASSERT_TRUE(shard.ok());
  auto shard0 = std::make_shared<const ModelWeights>(std::move(*shard));
  lo.layout = kvLayoutFor(shard0->config, o.num_blocks, o.block_size);
  auto leader = RankGroupLeader::connect(std::move(lo));
  ASSERT_TRUE(leader.ok()) << leader.status();
  o.tensor_parallel = std::move(*leader);
  EXPECT_EQ(serve(o, shard0), want);
  EXPECT_GT(o.tensor_parallel->copiesSent(), 0) << "no copy-on-write block copy reached the follower";
  o.tensor_parallel.reset();  // the engine is gone: this closes the link
  EXPECT_TRUE(follower.join().ok());
}

TEST(RankGroup, AFollowerGoneMidRunFailsTheEngineAndItsRequests) {
  const auto full = testing::tinyWeights();
  const auto fds = socketPair();
  // A follower that says Hello, takes one step's frame and then dies (its
  // link closes without a Partial or Done).
  std::thread dying([fd = fds[1], full] {
    auto shard = shardWeights(*full, 1, 2);
    RankGroupFollower f(fd, 1, 2);
    ASSERT_TRUE(f.hello(kvLayoutFor(shard->config, kNumBlocks, kBlockSize), true).ok());
    std::vector<std::byte> payload;
    RankLink link(::dup(fd));
    const auto type = link.receive(&payload);
    EXPECT_TRUE(type.ok() && *type == RankLink::Type::kStep);
    link.shutdown();
  });
  auto shard0 = std::make_shared<const ModelWeights>(std::move(*shardWeights(*full, 0, 2)));
  RankGroupLeader::Options lo{.links = {fds[0]}, .layout = kvLayoutFor(shard0->config, kNumBlocks, kBlockSize)};
  auto leader = RankGroupLeader::connect(std::move(lo));
  ASSERT_TRUE(leader.ok()) << leader.status();
  EngineOptions o{.num_blocks = kNumBlocks, .block_size = kBlockSize, .seed = 1};
  o.tensor_parallel = std::move(*leader);
  testing::Harness h(o, true, nullptr, shard0);
  const RequestId id = h.add(testing::greedy({10, 11, 12, 13, 14}, 4));
  h.runToCompletion();
  dying.join();
  EXPECT_EQ(h.outcome(id).final.finish_reason, FinishReason::kError);
  EXPECT_THAT(h.outcome(id).final.message, HasSubstr("tensor-parallel rank 1 of 2 is gone"));
  EXPECT_THAT(std::string(h.engine->backendStatus().message()), HasSubstr("rank 1 of 2 is gone"));
  // Sticky: the next request fails at once, without waiting on anyone.
  const RequestId next = h.add(testing::greedy({20, 21}, 2));
  h.runToCompletion();
  EXPECT_EQ(h.outcome(next).final.finish_reason, FinishReason::kError);
}

// Rank 0 failing a step on its own (its forward pass stopped before an
// all-reduce): the followers are waiting for a Sum, so the group fails as
// rank 0's failure, and they are let go instead of waiting for good.
TEST(RankGroup, RankZeroFailingAStepAloneFailsTheGroupAsItsOwnFailure) {
  Group g(testing::tinyWeights(), 2);
  ASSERT_NE(g.leader, nullptr);
  const std::vector<TokenId> tokens = {10, 11, 12};
  const std::vector<BlockId> table = {BlockId(0)};
  const SequenceChunk chunk{.tokens = tokens, .start_pos = 0, .block_table = table, .want_logits = true};
  ASSERT_TRUE(g.leader->beginStep({}, std::span<const SequenceChunk>(&chunk, 1)).ok());
  // Rank 0 never runs its forward pass: the follower sends a Partial and waits.
  const absl::Status s = g.leader->endStep(absl::ResourceExhaustedError("the device is out of memory"));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("tensor-parallel rank 0 failed a step: the device is out of memory"));
  EXPECT_EQ(g.leader->status().code(), absl::StatusCode::kResourceExhausted) << "sticky";
  EXPECT_THAT(std::string(g.followers[0]->join().message()), HasSubstr("rank 0 closed the link mid-step"));
}

TEST(RankGroup, TheLeaderRefusesAFollowerThatIsNotTheRankItExpects) {
  const auto full = testing::tinyWeights();
  auto shard0 = std::make_shared<const ModelWeights>(std::move(*shardWeights(*full, 0, 2)));
  const KvLayout layout = kvLayoutFor(shard0->config, kNumBlocks, kBlockSize);
  struct Case {
    std::string what;
    std::function<void(int fd)> follower;
    std::string error;
  };
  const std::vector<Case> cases = {
      {"another block count",
       [&](int fd) {
         KvLayout l = layout;
         l.num_blocks = kNumBlocks * 2;
         RankGroupFollower(fd, 1, 2).hello(l, true).IgnoreError();
       },
       "tensor-parallel rank 1 holds a KV cache of 4 layers x 32 blocks"},
      {"another KV dtype",
       [&](int fd) {
         KvLayout l = layout;
         l.dtype = KvDtype::kBfloat16;
         RankGroupFollower(fd, 1, 2).hello(l, true).IgnoreError();
       },
       "of bfloat16, rank 0 one of"},
      {"another rank", [&](int fd) { RankGroupFollower(fd, 3, 4).hello(layout, true).IgnoreError(); },
       "tensor-parallel rank 1 of 2 says it is rank 3 of 4"},
      {"another all-reduce", [&](int fd) { RankGroupFollower(fd, 1, 2).hello(layout, false).IgnoreError(); },
       "sums its partials with NCCL, rank 0 over the link"},
      {"gone before Hello", [&](int fd) { ::close(fd); }, "closed its link before it was ready"},
      {"a Step instead of Hello",
       [&](int fd) { RankLink(fd).send(RankLink::Type::kStep, encodeRankStep({}, {})).IgnoreError(); },
       "tensor-parallel rank 1 sent Step before Hello"},
      {"not a frame",
       [&](int fd) {
         const char junk[32] = "GET / HTTP/1.1\r\n\r\n";
         EXPECT_EQ(::write(fd, junk, sizeof(junk)), static_cast<ssize_t>(sizeof(junk)));
         ::close(fd);
       },
       "not a frame"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const auto fds = socketPair();
    std::thread t(c.follower, fds[1]);
    auto g = RankGroupLeader::connect({.links = {fds[0]}, .layout = layout});
    t.join();
    ASSERT_FALSE(g.ok());
    EXPECT_THAT(std::string(g.status().message()), HasSubstr(c.error));
  }
  // Silence: the Hello timeout.
  const auto fds = socketPair();
  auto g = RankGroupLeader::connect(
      {.links = {fds[0]}, .layout = layout, .hello_timeout = std::chrono::milliseconds(50)});
  ::close(fds[1]);
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("rank 1 of 2 did not say it was ready within"));
}

// Between steps rank 0 writes layer blocks into a follower's cache
// (StageIn: an imported prompt's KV) and reads them back (StageOut: a
// prefill's KV for the transport); a stage naming what the cache does not
// have fails the group, naming it.
TEST(RankGroup, StagedLayerBlocksRoundTripThroughAFollowersCache) {
  Group g(testing::tinyWeights(), 2);
  ASSERT_NE(g.leader, nullptr);
  const KvLayout layout = kvLayoutFor(g.shard0->config, kNumBlocks, kBlockSize);
  const std::vector<int32_t> layers = {0, 3};
  const std::vector<BlockId> blocks = {BlockId(2), BlockId(7), BlockId(8)};
  const size_t bytes = layers.size() * blocks.size() * layout.bytesPerLayerBlock();
  std::vector<std::byte> sent(bytes);
  for (size_t i = 0; i < bytes; ++i) sent[i] = static_cast<std::byte>(i * 7 + 1);
  ASSERT_TRUE(g.leader->stageIn(layers, blocks, [&](int rank, std::vector<std::byte>* out) {
    EXPECT_EQ(rank, 1);
    *out = sent;
  }).ok());
  std::vector<std::byte> back;
  ASSERT_TRUE(g.leader->stageOut(layers, blocks, [&](int rank, std::span<const std::byte> in) {
    EXPECT_EQ(rank, 1);
    back.assign(in.begin(), in.end());
  }).ok());
  EXPECT_EQ(back, sent);
  // Layer 4 of a 4-layer cache.
  const std::vector<int32_t> outside = {4};
  const absl::Status bad = g.leader->stageOut(outside, blocks, [](int, std::span<const std::byte>) {
    ADD_FAILURE() << "no data was due";
  });
  EXPECT_THAT(std::string(bad.message()),
              HasSubstr("tensor-parallel rank 1 failed the step: StageOut names layer 4, outside this rank's 4"));
  EXPECT_FALSE(g.leader->stageIn(layers, blocks, [&](int, std::vector<std::byte>* out) { *out = sent; }).ok());
  EXPECT_THAT(std::string(g.followers[0]->join().message()), HasSubstr("StageOut names layer 4"));
}

TEST(RankGroup, HellosCarryTheKvDtypeAndAnUnknownOneIsNamed) {
  const auto full = testing::tinyWeights();
  RankHello hello{
      .rank = 1, .world = 2, .pid = 7, .layout = kvLayoutFor(full->config, kNumBlocks, kBlockSize, KvDtype::kBfloat16)};
  std::vector<std::byte> bytes = encodeRankHello(hello);
  auto back = decodeRankHello(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->layout.dtype, KvDtype::kBfloat16);
  EXPECT_EQ(back->layout.num_blocks, kNumBlocks);
  // The dtype byte follows the rank, world, pid and the five layout numbers.
  bytes[2 + 2 + 4 + 5 * 4] = std::byte{9};
  auto bad = decodeRankHello(bytes);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("tensor-parallel Hello: unknown KV dtype 9"));
}

TEST(RankGroup, StepsRoundTripAndMalformedOnesAreNamed) {
  const std::vector<TokenId> tokens = {5, 6, 7};
  const std::vector<BlockId> table = {BlockId(3), BlockId(9)};
  const SequenceChunk chunk{.tokens = tokens, .start_pos = 4, .block_table = table, .want_logits = true};
  const std::vector<std::pair<BlockId, BlockId>> copies = {{BlockId(1), BlockId(2)}};
  const std::vector<std::byte> bytes = encodeRankStep(copies, std::span<const SequenceChunk>(&chunk, 1));
  auto step = decodeRankStep(bytes);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->copies, copies);
  ASSERT_EQ(step->chunks.size(), 1u);
  EXPECT_EQ(step->chunks[0].tokens, tokens);
  EXPECT_EQ(step->chunks[0].block_table, table);
  EXPECT_EQ(step->chunks[0].start_pos, 4);
  EXPECT_TRUE(step->chunks[0].want_logits);

  for (size_t cut : {size_t{2}, size_t{12}, bytes.size() - 1}) {
    auto bad = decodeRankStep(std::span<const std::byte>(bytes).first(cut));
    ASSERT_FALSE(bad.ok()) << cut;
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr("tensor-parallel Step: "));
  }
  std::vector<std::byte> longer = bytes;
  longer.push_back(std::byte{0});
  EXPECT_THAT(std::string(decodeRankStep(longer).status().message()), HasSubstr("1 bytes left over"));
  std::vector<std::byte> huge = bytes;
  const uint32_t many = 1u << 30;
  std::memcpy(huge.data(), &many, 4);  // 2^30 copies in a few bytes
  EXPECT_THAT(std::string(decodeRankStep(huge).status().message()), HasSubstr("copies says 1073741824 but only"));

  // Stage requests: the lists round-trip, a StageIn's bytes follow them, and
  // a short or overlong StageOut is refused naming what was wrong.
  const std::vector<int32_t> layers = {1, 3};
  std::vector<std::byte> stage = encodeRankStage(layers, table);
  auto out = decodeRankStage(stage, /*with_data=*/false);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->layers, layers);
  EXPECT_EQ(out->blocks, table);
  EXPECT_TRUE(out->data.empty());
  EXPECT_THAT(std::string(decodeRankStage(std::span<const std::byte>(stage).first(stage.size() - 1), false)
                              .status()
                              .message()),
              HasSubstr("tensor-parallel StageOut: blocks says 2 but only 7 bytes follow"));
  stage.push_back(std::byte{7});
  EXPECT_THAT(std::string(decodeRankStage(stage, false).status().message()), HasSubstr("1 bytes left over"));
  auto in = decodeRankStage(stage, /*with_data=*/true);
  ASSERT_TRUE(in.ok()) << in.status();
  ASSERT_EQ(in->data.size(), 1u);
  EXPECT_EQ(in->data[0], std::byte{7});

  // A follower given a Step that names blocks outside its cache stops with
  // that error, and tells the leader.
  Group g(testing::tinyWeights(), 2);
  ASSERT_NE(g.leader, nullptr);
  const std::vector<std::pair<BlockId, BlockId>> outside = {{BlockId(0), BlockId(kNumBlocks)}};
  ASSERT_TRUE(g.leader->beginStep(outside, {}).ok());
  const absl::Status done = g.leader->endStep();
  EXPECT_THAT(std::string(done.message()), HasSubstr("tensor-parallel rank 1 failed the step: Step copies block 0 to 16"));
  EXPECT_FALSE(g.leader->beginStep({}, {}).ok());  // sticky
  EXPECT_THAT(std::string(g.followers[0]->join().message()), HasSubstr("outside this rank's 16 blocks"));
}

}  // namespace
}  // namespace tandem::engine
