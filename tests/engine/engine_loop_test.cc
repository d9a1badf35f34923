#include "engine/engine_loop.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "tests/engine/engine_test_util.h"
#include "tests/testing/wait.h"

namespace tandem::engine {
namespace {

using testing::greedy;
using testing::randomPrompt;

std::unique_ptr<Engine> makeEngine(Clock& clock) {
  EngineOptions o;
  o.num_blocks = 128;
  o.max_num_seqs = 8;
  o.seed = 3;
  o.expected_output_tokens = 16;  // long-running requests below reserve only this much
  return std::move(*Engine::create(o, testing::tinyWeights(), makeCpuBackend(), std::make_shared<ByteTokenizer>(), clock));
}

using testutil::waitFor;

TEST(EngineLoopTest, RequestsFromManyThreadsAllFinishOnceAndMatchDirectRuns) {
  std::atomic<int> steps{0};
  EngineLoop loop(makeEngine(SystemClock::instance()), [&](const StepStats&, const Engine&) { steps.fetch_add(1); });
  std::mt19937 rng(1);
  std::vector<std::vector<TokenId>> prompts;
  for (int i = 0; i < 12; ++i) prompts.push_back(randomPrompt(rng, 10 + i));
  std::vector<std::vector<TokenId>> got(prompts.size());
  std::vector<std::atomic<int>> finished(prompts.size());
  std::vector<std::thread> threads;
  for (size_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < prompts.size(); i += 4) {
        loop.submit(greedy(prompts[i], 6), [&, i](const RequestUpdate& u) {
          got[i].insert(got[i].end(), u.new_tokens.begin(), u.new_tokens.end());
          if (u.finished) finished[i].fetch_add(1);
        });
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(waitFor([&] { return loop.numLive() == 0; }));
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(finished[i].load(), 1);
  EXPECT_GT(steps.load(), 0);

  // Same outputs as one engine stepping synchronously.
  testing::Harness h(EngineOptions{.num_blocks = 128, .max_num_seqs = 8, .expected_output_tokens = 16, .seed = 3});
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestId id = h.add(greedy(prompts[i], 6));
    h.runToCompletion();
    EXPECT_EQ(h.outcome(id).tokens, got[i]) << i;
  }
  absl::Status inv;
  loop.runOnLoop([&](Engine& e) { inv = e.checkInvariants(); });
  EXPECT_TRUE(inv.ok()) << inv;
}

TEST(EngineLoopTest, CancelFromAnotherThreadFreesBlocks) {
  EngineLoop loop(makeEngine(SystemClock::instance()));
  std::atomic<int> tokens{0};
  std::atomic<bool> done{false};
  FinishReason reason = FinishReason::kEos;
  uint64_t h = loop.submit(greedy({5, 6, 7, 8}, 100000), [&](const RequestUpdate& u) {
    tokens.fetch_add(static_cast<int>(u.new_tokens.size()));
    if (u.finished) {
      reason = u.finish_reason;
      done.store(true);
    }
  });
  ASSERT_TRUE(waitFor([&] { return tokens.load() >= 3; }));
  loop.cancel(h);
  ASSERT_TRUE(waitFor([&] { return done.load(); }));
  EXPECT_EQ(reason, FinishReason::kCancelled);
  int available = 0;
  loop.runOnLoop([&](Engine& e) { available = e.numAvailableBlocks(); });
  EXPECT_EQ(available, 128);
  loop.cancel(h);  // a second cancel of a finished request is ignored
}

TEST(EngineLoopTest, DestructionCancelsLiveRequests) {
  std::atomic<int> finished{0};
  FinishReason reason = FinishReason::kEos;
  {
    EngineLoop loop(makeEngine(SystemClock::instance()));
    loop.submit(greedy({5, 6, 7}, 100000), [&](const RequestUpdate& u) {
      if (u.finished) {
        reason = u.finish_reason;
        finished.fetch_add(1);
      }
    });
  }
  EXPECT_EQ(finished.load(), 1);
  EXPECT_EQ(reason, FinishReason::kCancelled);
}

}  // namespace
}  // namespace tandem::engine
