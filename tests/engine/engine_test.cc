#include "engine/engine.h"

#include <gtest/gtest.h>

#include "engine/model/llama.h"
#include "tests/engine/engine_test_util.h"

namespace tandem::engine {
namespace {

using testing::greedy;
using testing::Harness;
using testing::randomPrompt;

EngineOptions baseOptions() {
  EngineOptions o;
  o.num_blocks = 256;
  o.block_size = 16;
  o.max_num_batched_tokens = 512;
  o.max_num_seqs = 16;
  o.seed = 7;
  return o;
}

std::vector<TokenId> runAlone(std::vector<TokenId> prompt, int max_tokens, EngineOptions o = baseOptions()) {
  Harness h(o);
  RequestId id = h.add(greedy(std::move(prompt), max_tokens));
  h.runToCompletion();
  EXPECT_EQ(h.outcome(id).final.finish_reason, FinishReason::kLength);
  return h.outcome(id).tokens;
}

TEST(EngineTest, ChunkedPrefillEqualsUnchunked) {
  std::mt19937 rng(1);
  for (int len : {1, 15, 16, 17, 70, 133}) {
    auto prompt = randomPrompt(rng, len);
    auto whole = runAlone(prompt, 12);
    EngineOptions small = baseOptions();
    small.max_num_batched_tokens = 16;  // chunks of at most 16 - (decodes) tokens
    small.max_num_seqs = 4;
    auto chunked = runAlone(prompt, 12, small);
    ASSERT_EQ(whole.size(), 12u);
    EXPECT_EQ(whole, chunked) << "prompt length " << len;
  }
}

TEST(EngineTest, BatchOfNEqualsEachAlone) {
  std::mt19937 rng(2);
  std::vector<std::vector<TokenId>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(randomPrompt(rng, 5 + 19 * i));
  Harness h(baseOptions());
  std::vector<RequestId> ids;
  for (const auto& p : prompts) ids.push_back(h.add(greedy(p, 10 + static_cast<int>(ids.size()))));
  h.runToCompletion();
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(h.outcome(ids[i]).tokens, runAlone(prompts[i], 10 + static_cast<int>(i))) << "request " << i;
  }
}

TEST(EngineTest, PrefixCacheHitEqualsMiss) {
  std::mt19937 rng(3);
  auto shared = randomPrompt(rng, 64);
  auto a = shared, b = shared;
  auto tail_a = randomPrompt(rng, 9), tail_b = randomPrompt(rng, 21);
  a.insert(a.end(), tail_a.begin(), tail_a.end());
  b.insert(b.end(), tail_b.begin(), tail_b.end());

  Harness h(baseOptions());
  RequestId ra = h.add(greedy(a, 8));
  h.runToCompletion();
  RequestId rb = h.add(greedy(b, 8));
  h.runToCompletion();
  EXPECT_EQ(h.outcome(ra).final.num_cached_tokens, 0);
  EXPECT_EQ(h.outcome(rb).final.num_cached_tokens, 64);  // 4 full blocks of 16

  EngineOptions no_cache = baseOptions();
  no_cache.enable_prefix_cache = false;
  EXPECT_EQ(h.outcome(rb).tokens, runAlone(b, 8, no_cache));
  EXPECT_EQ(h.outcome(ra).tokens, runAlone(a, 8, no_cache));
}

TEST(EngineTest, FullPromptHitStillComputesLastTokenPrivately) {
  std::mt19937 rng(4);
  auto p = randomPrompt(rng, 48);  // exactly 3 blocks
  Harness h(baseOptions());
  RequestId r1 = h.add(greedy(p, 6));
  h.runToCompletion();
  RequestId r2 = h.add(greedy(p, 6));
  h.runToCompletion();
  EXPECT_EQ(h.outcome(r2).final.num_cached_tokens, 47);  // one token recomputed to get logits
  EXPECT_EQ(h.outcome(r1).tokens, h.outcome(r2).tokens);
}

TEST(EngineTest, SessionAppendEqualsFullRecompute) {
  std::mt19937 rng(5);
  auto turn1 = randomPrompt(rng, 37);
  Harness h(baseOptions());
  RequestSpec s1 = greedy(turn1, 9);
  s1.session = SessionId("conv-1");
  RequestId r1 = h.add(s1);
  h.runToCompletion();
  EXPECT_EQ(h.engine->numSessionsResident(), 1);

  // Turn 2: the whole conversation so far plus a short append.
  auto turn2 = turn1;
  const auto& out1 = h.outcome(r1).tokens;
  turn2.insert(turn2.end(), out1.begin(), out1.end());
  auto append = randomPrompt(rng, 11);
  turn2.insert(turn2.end(), append.begin(), append.end());
  RequestSpec s2 = greedy(turn2, 9);
  s2.session = SessionId("conv-1");
  RequestId r2 = h.add(s2);
  h.runToCompletion();
  // The resident KV covers turn 1's prompt and all but the last output token
  // (the last sampled token was never fed back).
  EXPECT_EQ(h.outcome(r2).final.num_cached_tokens, 37 + 9 - 1);

  EngineOptions no_cache = baseOptions();
  no_cache.enable_prefix_cache = false;
  EXPECT_EQ(h.outcome(r2).tokens, runAlone(turn2, 9, no_cache));
}

TEST(EngineTest, SessionWithEditedHistoryReusesOnlyCommonPrefix) {
  std::mt19937 rng(6);
  auto turn1 = randomPrompt(rng, 40);
  EngineOptions o = baseOptions();
  o.enable_prefix_cache = false;  // isolate the session path
  Harness h(o);
  RequestSpec s1 = greedy(turn1, 4);
  s1.session = SessionId("s");
  h.add(s1);
  h.runToCompletion();
  auto edited = turn1;
  edited[20] = edited[20] == 50 ? 51 : 50;  // the agent rewrote history mid-block
  RequestSpec s2 = greedy(edited, 7);
  s2.session = SessionId("s");
  RequestId r2 = h.add(s2);
  h.runToCompletion();
  EXPECT_EQ(h.outcome(r2).final.num_cached_tokens, 20);
  EXPECT_EQ(h.outcome(r2).tokens, runAlone(edited, 7, o));
}

TEST(EngineTest, SeededSamplingIsReproducibleAndBatchIndependent) {
  std::mt19937 rng(8);
  auto p = randomPrompt(rng, 30);
  auto run = [&](uint64_t seed, bool with_neighbours) {
    Harness h(baseOptions());
    RequestSpec s;
    s.prompt = p;
    s.sampling.temperature = 0.9f;
    s.sampling.top_p = 0.95f;
    s.sampling.top_k = 40;
    s.sampling.seed = seed;
    s.sampling.max_tokens = 20;
    s.sampling.ignore_eos = true;
    if (with_neighbours) {
      std::mt19937 r2(99);
      for (int i = 0; i < 3; ++i) {
        RequestSpec n = s;
        n.prompt = randomPrompt(r2, 25);
        n.sampling.seed.reset();
        h.add(n);
      }
    }
    RequestId id = h.add(s);
    h.runToCompletion();
    return h.outcome(id).tokens;
  };
  auto a = run(42, false);
  EXPECT_EQ(a, run(42, false));
  EXPECT_EQ(a, run(42, true));
  EXPECT_NE(a, run(43, false));
}

TEST(EngineTest, TextMatchesTokensAndStopStringsCut) {
  std::mt19937 rng(9);
  auto p = randomPrompt(rng, 20);
  Harness h(baseOptions());
  RequestId r = h.add(greedy(p, 24));
  h.runToCompletion();
  const auto& full = h.outcome(r);
  ByteTokenizer tok;
  EXPECT_EQ(full.text, tok.decode(full.tokens));
  ASSERT_GE(full.text.size(), 12u);

  // Stop on a string that starts at byte 5 of that output.
  std::string stop = full.text.substr(5, 3);
  size_t first = full.text.find(stop);
  RequestSpec s = greedy(p, 24);
  s.sampling.stop = {"never-appears", stop};
  Harness h2(baseOptions());
  RequestId r2 = h2.add(s);
  h2.runToCompletion();
  EXPECT_EQ(h2.outcome(r2).final.finish_reason, FinishReason::kStop);
  EXPECT_EQ(h2.outcome(r2).text, full.text.substr(0, first));
}

TEST(EngineTest, EosFinishesUnlessIgnored) {
  // Find a prompt whose greedy continuation hits </s> (id 2) within 64 tokens.
  std::mt19937 rng(10);
  for (int attempt = 0; attempt < 200; ++attempt) {
    auto p = randomPrompt(rng, 8);
    auto toks = runAlone(p, 64);
    auto it = std::find(toks.begin(), toks.end(), ByteTokenizer::kEosId);
    if (it == toks.end()) continue;
    RequestSpec s = greedy(p, 64);
    s.sampling.ignore_eos = false;
    Harness h(baseOptions());
    RequestId r = h.add(s);
    h.runToCompletion();
    EXPECT_EQ(h.outcome(r).final.finish_reason, FinishReason::kEos);
    EXPECT_EQ(h.outcome(r).tokens, std::vector<TokenId>(toks.begin(), it + 1));
    return;
  }
  GTEST_SKIP() << "no prompt produced </s> greedily in 200 attempts";
}

TEST(EngineTest, StopsOnEveryIdOfTheEosList) {
  // Llama 3.1 Instruct lists <|end_of_text|>, <|eom_id|> and <|eot_id|>; a
  // chat turn ends on the last. Here the list is {2, 7, 9} and scripted
  // replies put one of them mid-reply.
  ModelConfig config = tinyModelConfig();
  config.eos_token_ids = {2, 7, 9};
  std::shared_ptr<const ModelWeights> weights = makeRandomWeights(config, 1234);
  for (TokenId eos : {2, 7, 9}) {
    EngineOptions o = baseOptions();
    o.scripted_replies = {{65, 66, eos, 67, 68}};
    Harness h(o, /*with_tokenizer=*/true, nullptr, weights);
    RequestSpec s = greedy({70, 71, 72}, 16);
    s.sampling.ignore_eos = false;
    RequestId r = h.add(s);
    h.runToCompletion();
    EXPECT_EQ(h.outcome(r).final.finish_reason, FinishReason::kEos) << eos;
    EXPECT_EQ(h.outcome(r).tokens, (std::vector<TokenId>{65, 66, eos})) << eos;

    // ignore_eos runs through every id of the list.
    Harness ignoring(o, /*with_tokenizer=*/true, nullptr, weights);
    RequestId r2 = ignoring.add(greedy({70, 71, 72}, 4));
    ignoring.runToCompletion();
    EXPECT_EQ(ignoring.outcome(r2).final.finish_reason, FinishReason::kLength) << eos;
    EXPECT_EQ(ignoring.outcome(r2).tokens, (std::vector<TokenId>{65, 66, eos, 67})) << eos;
  }
}

TEST(EngineTest, RejectionsAreTypedAndLeakNothing) {
  EngineOptions o = baseOptions();
  o.num_blocks = 8;  // 128 tokens
  o.max_model_len = 100;
  o.max_waiting = 2;
  Harness h(o);
  auto expectReject = [&](RequestSpec s, RejectReason want) {
    RequestId id = h.add(std::move(s));
    const auto& out = h.outcome(id);
    ASSERT_TRUE(out.finished) << "rejection must be immediate";
    EXPECT_EQ(out.final.finish_reason, FinishReason::kRejected);
    EXPECT_EQ(out.final.reject_reason, want) << out.final.message;
    EXPECT_FALSE(out.final.message.empty());
  };
  expectReject(greedy({}, 4), RejectReason::kInvalid);
  expectReject(greedy({5, 6, 100}, 4), RejectReason::kInvalid);
  expectReject(greedy({5, -1}, 4), RejectReason::kInvalid);
  expectReject(greedy({5, 6}, 0), RejectReason::kInvalid);
  RequestSpec bad_t = greedy({5}, 4);
  bad_t.sampling.temperature = -1;
  expectReject(bad_t, RejectReason::kInvalid);
  RequestSpec bad_p = greedy({5}, 4);
  bad_p.sampling.top_p = 0;
  expectReject(bad_p, RejectReason::kInvalid);
  expectReject(greedy(std::vector<TokenId>(100, 7), 4), RejectReason::kPromptTooLong);
  // 60 + 40 = 100 tokens = 7 blocks fits; but 8 blocks cannot be reserved when max_model_len caps at 100.
  o.num_blocks = 4;
  Harness small(o);
  RequestId cap = small.add(greedy(std::vector<TokenId>(60, 7), 40));
  EXPECT_EQ(small.outcome(cap).final.reject_reason, RejectReason::kCapacity);
  // Queue bound: max_waiting requests wait (the rejected ones above do not
  // count), the next is rejected.
  RequestId first = h.add(greedy({5, 6}, 4));
  RequestId second = h.add(greedy({5, 6}, 4));
  EXPECT_FALSE(h.outcome(first).finished);
  EXPECT_FALSE(h.outcome(second).finished) << h.outcome(second).final.message;
  expectReject(greedy({5, 6}, 4), RejectReason::kQueueFull);
  h.runToCompletion();
  EXPECT_EQ(h.engine->numAvailableBlocks(), 8);
  EXPECT_EQ(small.engine->numAvailableBlocks(), 4);
}

TEST(EngineTest, StopStringsWithoutTokenizerAreRefused) {
  Harness h(baseOptions(), /*with_tokenizer=*/false);
  RequestSpec s = greedy({5, 6}, 4);
  s.sampling.stop = {"x"};
  RequestId id = h.add(s);
  EXPECT_EQ(h.outcome(id).final.reject_reason, RejectReason::kInvalid);
}

TEST(EngineTest, CancelInEveryStateLeaksNothing) {
  std::mt19937 rng(11);
  EngineOptions o = baseOptions();
  o.max_num_batched_tokens = 16;
  o.max_num_seqs = 2;
  for (int cancel_after_steps = 0; cancel_after_steps < 14; ++cancel_after_steps) {
    Harness h(o);
    std::vector<RequestId> ids;
    for (int i = 0; i < 4; ++i) {
      RequestSpec s = greedy(randomPrompt(rng, 40), 5);
      if (i == 1) s.session = SessionId("sess");
      ids.push_back(h.add(s));
    }
    for (int i = 0; i < cancel_after_steps; ++i) h.step();
    for (RequestId id : ids) h.engine->cancel(id);
    ASSERT_TRUE(h.engine->checkInvariants().ok());
    EXPECT_FALSE(h.engine->hasWork());
    for (RequestId id : ids) {
      EXPECT_EQ(h.outcome(id).num_finished_updates, 1);
    }
    h.engine->dropSession(SessionId("sess"));
    EXPECT_EQ(h.engine->numAvailableBlocks(), o.num_blocks) << "after " << cancel_after_steps << " steps";
  }
}

TEST(EngineTest, DeadlinePassedFinishesWithTimeout) {
  Harness h(baseOptions());
  RequestSpec s = greedy({5, 6, 7}, 1000);
  s.deadline = h.clock.now() + std::chrono::seconds(2);
  RequestId id = h.add(s);
  for (int i = 0; i < 5; ++i) h.step();
  EXPECT_FALSE(h.outcome(id).finished);
  h.clock.advance(std::chrono::seconds(3));
  h.step();
  EXPECT_EQ(h.outcome(id).final.finish_reason, FinishReason::kTimeout);
  EXPECT_EQ(h.engine->numAvailableBlocks(), baseOptions().num_blocks);
}

TEST(EngineTest, PreemptionByRecomputeKeepsOutputsExact) {
  // Reserve only 4 output tokens per request, then generate 40: decode runs
  // out of blocks and must preempt; greedy outputs must not change.
  std::mt19937 rng(12);
  EngineOptions o = baseOptions();
  o.num_blocks = 14;
  o.block_size = 8;
  o.expected_output_tokens = 4;
  o.max_num_seqs = 4;
  o.max_num_batched_tokens = 64;
  o.max_preemptions = 1000;
  Harness h(o);
  std::vector<std::vector<TokenId>> prompts;
  std::vector<RequestId> ids;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(randomPrompt(rng, 12 + i));
    ids.push_back(h.add(greedy(prompts.back(), 40)));
  }
  int preemptions = 0;
  for (int i = 0; i < 5000 && h.engine->hasWork(); ++i) preemptions += h.step().num_preemptions;
  ASSERT_FALSE(h.engine->hasWork());
  EXPECT_GT(preemptions, 0) << "the scenario is meant to force preemption";
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(h.outcome(ids[i]).final.finish_reason, FinishReason::kLength);
    EXPECT_EQ(h.outcome(ids[i]).tokens, runAlone(prompts[i], 40)) << "request " << i;
  }
  EXPECT_EQ(h.engine->numAvailableBlocks(), o.num_blocks);
}

TEST(EngineTest, PreemptionLimitFinishesTyped) {
  std::mt19937 rng(13);
  EngineOptions o = baseOptions();
  o.num_blocks = 6;
  o.block_size = 8;
  o.expected_output_tokens = 1;
  o.max_num_seqs = 2;
  o.max_num_batched_tokens = 64;
  o.max_preemptions = 0;
  Harness h(o);
  RequestId a = h.add(greedy(randomPrompt(rng, 10), 30));
  RequestId b = h.add(greedy(randomPrompt(rng, 10), 30));
  h.runToCompletion();
  bool some_preempted = h.outcome(a).final.finish_reason == FinishReason::kPreempted ||
                        h.outcome(b).final.finish_reason == FinishReason::kPreempted;
  EXPECT_TRUE(some_preempted);
  EXPECT_EQ(h.engine->numAvailableBlocks(), o.num_blocks);
}

TEST(EngineTest, SessionsEvictedToKeepLowWatermark) {
  std::mt19937 rng(14);
  EngineOptions o = baseOptions();
  o.num_blocks = 40;
  o.session_low_watermark_blocks = 20;
  o.max_session_evictions_per_step = 1;
  o.enable_prefix_cache = false;
  Harness h(o);
  for (int i = 0; i < 4; ++i) {
    RequestSpec s = greedy(randomPrompt(rng, 60), 4);  // 4 blocks each once resident
    s.session = SessionId("s" + std::to_string(i));
    h.add(s);
    h.runToCompletion();
  }
  // Watermark: at most 40 - 20 = 20 blocks resident; one eviction per step.
  EXPECT_LE(40 - h.engine->numAvailableBlocks(), 20 + 4);
  int before = h.engine->numSessionsResident();
  h.step();  // idle steps still enforce the watermark, one session at a time
  EXPECT_LE(h.engine->numSessionsResident(), before);
  EXPECT_GE(h.engine->numAvailableBlocks(), 20);
}

// ---- Admission counts what committing the plan hands back -----------------
// Each scenario fits the pool exactly; a wrong count would leave the request
// waiting for blocks that never come (until its deadline).

TEST(EngineAdmissionTest, WholePromptCachedFitsWhenTheCopySourceGoesBackToTheCache) {
  // 3 full blocks cached; the same prompt again reuses them, copying the last
  // (its final token is recomputed). The copy's source goes back to the LRU,
  // so the request needs 1 new block now plus 1 reserved: 4 of 4.
  EngineOptions o = baseOptions();
  o.num_blocks = 4;
  std::mt19937 rng(40);
  auto prompt = randomPrompt(rng, 48);
  Harness h(o);
  RequestId a = h.add(greedy(prompt, 16));  // 64 tokens: the whole pool
  h.runToCompletion();
  RequestId b = h.add(greedy(prompt, 16));
  h.runToCompletion();
  EXPECT_EQ(h.outcome(b).final.finish_reason, FinishReason::kLength) << h.outcome(b).final.message;
  EXPECT_EQ(h.outcome(b).final.num_cached_tokens, 47);
  EXPECT_EQ(h.outcome(b).tokens, h.outcome(a).tokens);
  EXPECT_EQ(h.engine->numAvailableBlocks(), o.num_blocks);
  EXPECT_TRUE(h.engine->checkInvariants().ok());
}

TEST(EngineAdmissionTest, SessionFillingThePoolDoesNotBlockItsNextTurn) {
  // Turn 1 leaves 127 tokens resident in all 8 blocks. Turn 2 regenerates
  // from the same prompt: it reuses 7 blocks (copying the 7th), and the
  // session's 8th block is released. Turn 3 shares nothing with the
  // session, which then only stands in the way.
  EngineOptions o = baseOptions();
  o.num_blocks = 8;
  std::mt19937 rng(41);
  auto prompt = randomPrompt(rng, 100);
  auto other = randomPrompt(rng, 100);
  Harness h(o);
  for (const auto* p : {&prompt, &prompt, &other}) {
    RequestSpec turn = greedy(*p, 28);  // 128 tokens: the whole pool
    turn.session = SessionId("conv");
    RequestId id = h.add(turn);
    h.runToCompletion();
    EXPECT_EQ(h.outcome(id).final.finish_reason, FinishReason::kLength) << h.outcome(id).final.message;
    EXPECT_EQ(h.outcome(id).tokens, runAlone(*p, 28, o));
    EXPECT_TRUE(h.engine->checkInvariants().ok());
  }
  EXPECT_EQ(h.engine->numSessionsResident(), 1);
}

TEST(EngineAdmissionTest, RequestOutgrowingThePoolFinishesPreemptedInsteadOfWaiting) {
  // Admitted on an estimate of 16 output tokens (64 tokens: the whole pool),
  // it asks for 100. At token 65 it preempts itself and could never be
  // admitted again: it ends, typed, with the output it has.
  EngineOptions o = baseOptions();
  o.num_blocks = 4;
  o.expected_output_tokens = 16;
  o.max_preemptions = 1000;
  std::mt19937 rng(42);
  Harness h(o);
  RequestId id = h.add(greedy(randomPrompt(rng, 48), 100));
  h.runToCompletion();
  const auto& out = h.outcome(id);
  EXPECT_EQ(out.final.finish_reason, FinishReason::kPreempted);
  EXPECT_NE(out.final.message.find("need 5 KV blocks but the pool has only 4"), std::string::npos) << out.final.message;
  EXPECT_EQ(out.final.num_preemptions, 1);
  EXPECT_EQ(out.tokens.size(), 17u);  // tokens 49..65; the 65th has no block for its KV
  EXPECT_EQ(h.engine->numAvailableBlocks(), o.num_blocks);
}

TEST(EngineAdmissionTest, SessionEvictionsForBlocksStayWithinTheStepLimit) {
  // Twelve sessions hold one block each, leaving 4 free. Four decodes in
  // lockstep each need a new block in the same step: at most
  // max_session_evictions_per_step sessions go per step (never one long
  // pause), the decodes left without a block wait a step instead of being
  // preempted, and every output is what it would have been alone.
  EngineOptions o = baseOptions();
  o.num_blocks = 16;
  o.expected_output_tokens = 1;
  o.max_session_evictions_per_step = 2;
  std::mt19937 rng(43);
  Harness h(o);
  for (int i = 0; i < 12; ++i) {
    RequestSpec s = greedy(randomPrompt(rng, 15), 1);
    s.session = SessionId("s" + std::to_string(i));
    h.add(s);
    h.runToCompletion();
  }
  ASSERT_EQ(h.engine->numSessionsResident(), 12);
  ASSERT_EQ(h.engine->numAvailableBlocks(), 4);
  std::vector<std::vector<TokenId>> prompts;
  std::vector<RequestId> ids;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(randomPrompt(rng, 15));
    ids.push_back(h.add(greedy(prompts.back(), 40)));  // 55 tokens: 4 blocks each, 1 reserved
  }
  int resident = h.engine->numSessionsResident();
  int most_in_a_step = 0;
  for (int i = 0; i < 2000 && h.engine->hasWork(); ++i) {
    const StepStats st = h.step();
    const int now = h.engine->numSessionsResident();
    most_in_a_step = std::max(most_in_a_step, resident - now);
    EXPECT_EQ(st.num_session_evictions, resident - now) << "step " << i << ": the step reports its evictions";
    resident = now;
  }
  ASSERT_FALSE(h.engine->hasWork());
  EXPECT_EQ(most_in_a_step, o.max_session_evictions_per_step);
  EXPECT_EQ(h.engine->numSessionsResident(), 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(h.outcome(ids[i]).final.finish_reason, FinishReason::kLength);
    EXPECT_EQ(h.outcome(ids[i]).final.num_preemptions, 0) << "request " << i;
    EXPECT_EQ(h.outcome(ids[i]).tokens, runAlone(prompts[i], 40)) << "request " << i;
  }
  EXPECT_EQ(h.engine->numAvailableBlocks(), o.num_blocks);
}

TEST(EngineTest, RandomizedOperationsKeepInvariantsAndLeakNothing) {
  std::mt19937 rng(15);
  for (int round = 0; round < 6; ++round) {
    EngineOptions o = baseOptions();
    o.num_blocks = 24 + static_cast<int>(rng() % 40);
    o.block_size = 4 << (rng() % 3);
    o.max_num_seqs = 1 + static_cast<int>(rng() % 6);
    o.max_num_batched_tokens = o.max_num_seqs + static_cast<int>(rng() % 64);
    o.expected_output_tokens = static_cast<int>(rng() % 8);
    o.max_preemptions = 3;
    o.session_low_watermark_blocks = static_cast<int>(rng() % 8);
    o.max_model_len = 256;
    Harness h(o);
    std::vector<RequestId> ids;
    std::vector<std::vector<TokenId>> history;
    for (int op = 0; op < 300; ++op) {
      int what = static_cast<int>(rng() % 10);
      if (what < 3) {
        std::vector<TokenId> p;
        if (!history.empty() && rng() % 2) {
          p = history[rng() % history.size()];  // shared prefix
          p.resize(std::min(p.size(), static_cast<size_t>(1 + rng() % 80)));
        }
        auto extra = randomPrompt(rng, 1 + static_cast<int>(rng() % 40));
        p.insert(p.end(), extra.begin(), extra.end());
        history.push_back(p);
        RequestSpec s = greedy(p, 1 + static_cast<int>(rng() % 20));
        s.sampling.ignore_eos = rng() % 2;
        if (rng() % 3 == 0) s.session = SessionId("s" + std::to_string(rng() % 4));
        s.session_priority = static_cast<int>(rng() % 3);
        ids.push_back(h.add(s));
      } else if (what < 4 && !ids.empty()) {
        h.engine->cancel(ids[rng() % ids.size()]);
      } else if (what < 5) {
        h.engine->dropSession(SessionId("s" + std::to_string(rng() % 4)));
      } else {
        h.step();
      }
      ASSERT_TRUE(h.engine->checkInvariants().ok()) << "round " << round << " op " << op;
    }
    h.runToCompletion();
    for (RequestId id : ids) EXPECT_EQ(h.outcome(id).num_finished_updates, 1);
    for (int i = 0; i < 4; ++i) h.engine->dropSession(SessionId("s" + std::to_string(i)));
    EXPECT_EQ(h.engine->numAvailableBlocks(), o.num_blocks) << "round " << round;
    ASSERT_TRUE(h.engine->checkInvariants().ok());
  }
}

TEST(EngineTest, StepStatsAddUp) {
  std::mt19937 rng(16);
  Harness h(baseOptions());
  h.add(greedy(randomPrompt(rng, 40), 3));
  h.add(greedy(randomPrompt(rng, 20), 3));
  StepStats s = h.step();
  EXPECT_EQ(s.num_prefill_tokens, 60);
  EXPECT_EQ(s.num_decode_tokens, 0);
  EXPECT_EQ(s.num_running, 2);
  EXPECT_EQ(s.prefix_query_tokens, 60);
  EXPECT_EQ(s.num_total_blocks, 256);
  EXPECT_EQ(s.num_free_blocks, 256 - 3 - 2);  // reservations are not allocations
  EXPECT_EQ(s.num_finished, 0);
  s = h.step();
  EXPECT_EQ(s.num_decode_tokens, 2);
  EXPECT_EQ(s.num_prefill_tokens, 0);
  EXPECT_EQ(s.num_finished, 0);
  s = h.step();  // the third token of each: both end (length)
  EXPECT_EQ(s.num_finished, 2);
  EXPECT_EQ(s.num_running, 0);
}

TEST(EngineTest, CreateValidatesOptions) {
  FakeClock clock;
  auto make = [&](EngineOptions o) { return Engine::create(o, testing::tinyWeights(), makeCpuBackend(), nullptr, clock); };
  EngineOptions o = baseOptions();
  o.num_blocks = 0;
  EXPECT_NE(std::string(make(o).status().message()).find("num_blocks"), std::string::npos);
  o = baseOptions();
  o.max_num_batched_tokens = 4;
  EXPECT_NE(std::string(make(o).status().message()).find("max_num_batched_tokens"), std::string::npos);
  o = baseOptions();
  o.max_model_len = 1 << 20;
  EXPECT_NE(std::string(make(o).status().message()).find("max_model_len"), std::string::npos);
  EXPECT_TRUE(make(baseOptions()).ok());
}

TEST(EngineTest, KvPoolInProvidedMemory) {
  FakeClock clock;
  EngineOptions o = baseOptions();
  const KvLayout layout = kvLayoutFor(testing::tinyWeights()->config, o.num_blocks, o.block_size);
  const size_t need = layout.totalBytes();
  auto buffer = std::shared_ptr<std::byte[]>(static_cast<std::byte*>(std::aligned_alloc(64, need + 64)), [](std::byte* p) { std::free(p); });
  size_t asked = 0;
  o.kv_memory = [&](size_t bytes) -> absl::StatusOr<KvMemory> {
    asked = bytes;
    return KvMemory{.bytes = {buffer.get(), need}, .keep_alive = buffer};
  };
  auto engine = Engine::create(o, testing::tinyWeights(), makeCpuBackend(), nullptr, clock);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ(asked, need);
  EXPECT_EQ((*engine)->kvRegion().data(), buffer.get());
  EXPECT_EQ((*engine)->kvRegion().size(), need);

  // Too small, misaligned, or an allocation failure: create() says why.
  auto fails = [&](KvMemory m) {
    o.kv_memory = [m](size_t) -> absl::StatusOr<KvMemory> { return m; };
    return Engine::create(o, testing::tinyWeights(), makeCpuBackend(), nullptr, clock).status();
  };
  absl::Status small = fails({.bytes = {buffer.get(), need - 1}, .keep_alive = buffer});
  EXPECT_NE(std::string(small.message()).find("the pool needs " + std::to_string(need)), std::string::npos) << small;
  absl::Status misaligned = fails({.bytes = {buffer.get() + 8, need}, .keep_alive = buffer});
  EXPECT_NE(std::string(misaligned.message()).find("aligned"), std::string::npos) << misaligned;
  o.kv_memory = [](size_t) -> absl::StatusOr<KvMemory> { return absl::ResourceExhaustedError("no shared memory left"); };
  absl::Status failed = Engine::create(o, testing::tinyWeights(), makeCpuBackend(), nullptr, clock).status();
  EXPECT_NE(std::string(failed.message()).find("no shared memory left"), std::string::npos) << failed;
}

}  // namespace
}  // namespace tandem::engine
