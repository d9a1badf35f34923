#include "engine/engine_loop.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "engine/backend/cuda/kernel_backend.h"
#include "tests/engine/engine_test_util.h"
#include "tests/testing/wait.h"

namespace tandem::engine {
namespace {

using testing::greedy;
using testing::randomPrompt;

std::unique_ptr<Engine> makeEngine(Clock& clock, int num_blocks = 128) {
  EngineOptions o;
  o.num_blocks = num_blocks;
  o.max_num_seqs = 8;
  o.seed = 3;
  o.expected_output_tokens = 16;  // long-running requests below reserve only this much
  return std::move(
      *Engine::create(o, testing::tinyWeights(), makeCpuBackend(), std::make_shared<ByteTokenizer>(), clock));
}

// A one-token leased prefill of `prompt_len` tokens: when it finishes, its
// blocks stay pinned until `expires`.
RequestSpec leasedPrefill(int prompt_len, uint64_t lease_id, MonoTime expires) {
  std::mt19937 rng(static_cast<unsigned>(lease_id));
  RequestSpec s = greedy(randomPrompt(rng, prompt_len), 1);
  s.lease = LeaseSpec{.id = lease_id, .expires = expires};
  return s;
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

// A backend that fails (here the GPU kernels' attention refusing a head
// size it cannot hold; on a GPU, a device error) fails every step from then
// on: the loop publishes the failure for health checks, and the request in
// the step ends with an error. A healthy loop reports none.
TEST(EngineLoopTest, ABackendFailureIsPublishedForHealthChecks) {
  EngineLoop healthy(makeEngine(SystemClock::instance()));
  ModelConfig c = tinyModelConfig();
  c.num_heads = 1;
  c.num_kv_heads = 1;
  c.head_dim = 512;  // over what the attention kernel holds
  EngineOptions o;
  o.num_blocks = 32;
  auto engine = Engine::create(o, makeRandomWeights(c, 7), std::make_unique<KernelBackend>(),
                               std::make_shared<ByteTokenizer>(), SystemClock::instance());
  ASSERT_TRUE(engine.ok()) << engine.status();
  EngineLoop loop(std::move(*engine));
  EXPECT_FALSE(loop.failure().has_value());
  std::atomic<bool> finished{false};
  FinishReason reason = FinishReason::kEos;
  loop.submit(greedy({5, 6, 7}, 4), [&](const RequestUpdate& u) {
    if (!u.finished) return;
    reason = u.finish_reason;
    finished.store(true);
  });
  ASSERT_TRUE(waitFor([&] { return finished.load() && loop.failure().has_value(); }, std::chrono::seconds(30)));
  EXPECT_EQ(reason, FinishReason::kError);
  EXPECT_NE(loop.failure()->find("head_dim 512"), std::string::npos) << *loop.failure();
  EXPECT_FALSE(healthy.failure().has_value());
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

TEST(EngineLoopTest, IdleLoopSleepsUntilALeaseExpiresOnTheEnginesClock) {
  FakeClock clock;
  std::atomic<int> leases{-1};
  EngineLoop loop(makeEngine(clock), [&](const StepStats&, const Engine& e) { leases.store(e.numLeases()); });
  std::atomic<bool> done{false};
  loop.submit(leasedPrefill(40, 1, clock.now() + std::chrono::seconds(5)), [&](const RequestUpdate& u) {
    if (u.finished) done.store(true);
  });
  ASSERT_TRUE(waitFor([&] { return done.load() && leases.load() == 1; }));
  // Idle with a lease: parked on the clock until the expiry, not polling.
  ASSERT_TRUE(waitFor([&] { return clock.numWaiters() > 0; }));
  clock.advance(std::chrono::seconds(4));
  int held = 0;
  loop.runOnLoop([&](Engine& e) { held = e.numLeases(); });
  EXPECT_EQ(held, 1) << "released before its expiry";
  clock.advance(std::chrono::seconds(1));
  EXPECT_TRUE(waitFor([&] { return leases.load() == 0; }));
  int available = 0;
  loop.runOnLoop([&](Engine& e) { available = e.numAvailableBlocks(); });
  EXPECT_EQ(available, 128);
}

TEST(EngineLoopTest, StalledRequestTimesOutWhenTheClockPassesItsDeadline) {
  // A lease pins 3 of 4 blocks for an hour; a request reserving 3 waits for
  // them, and the loop sleeps until its deadline.
  FakeClock clock;
  std::atomic<int> waiting{0};
  EngineLoop loop(makeEngine(clock, 4), [&](const StepStats& st, const Engine&) { waiting.store(st.num_waiting); });
  std::atomic<bool> prefilled{false};
  loop.submit(leasedPrefill(40, 2, clock.now() + std::chrono::hours(1)), [&](const RequestUpdate& u) {
    if (u.finished) prefilled.store(true);
  });
  ASSERT_TRUE(waitFor([&] { return prefilled.load(); }));
  std::mt19937 rng(4);
  RequestSpec s = greedy(randomPrompt(rng, 20), 20);  // 20 + 16 expected: 3 blocks
  s.deadline = clock.now() + std::chrono::seconds(2);
  std::atomic<bool> finished{false};
  std::atomic<FinishReason> reason{FinishReason::kEos};
  loop.submit(std::move(s), [&](const RequestUpdate& u) {
    if (u.finished) {
      reason.store(u.finish_reason);
      finished.store(true);
    }
  });
  // A step left it waiting; then the loop parks on the clock (one thread:
  // a waiter now is the loop after that step), rather than stepping again.
  ASSERT_TRUE(waitFor([&] { return waiting.load() == 1; }));
  ASSERT_TRUE(waitFor([&] { return clock.numWaiters() > 0; }));
  EXPECT_FALSE(finished.load());
  clock.advance(std::chrono::seconds(2));
  ASSERT_TRUE(waitFor([&] { return finished.load(); }));
  EXPECT_EQ(reason.load(), FinishReason::kTimeout);
}

}  // namespace
}  // namespace tandem::engine
