// The engine's side of P/D disaggregation: leased prefill on one engine,
// import on another, with the KV copied between their pools the way the
// transport's gets do (layer block by layer block, into the reader's own blocks).

#include <gtest/gtest.h>

#include <cstring>

#include "tests/engine/engine_test_util.h"

namespace tandem::engine {
namespace {

using testing::greedy;
using testing::Harness;
using testing::randomPrompt;

EngineOptions opts() {
  EngineOptions o;
  o.num_blocks = 128;
  o.block_size = 16;
  o.max_num_batched_tokens = 64;  // several prefill chunks for longer prompts
  o.max_num_seqs = 8;
  o.seed = 5;
  return o;
}

TEST(EnginePdTest, LeasedPrefillPlusImportEqualsMonolithic) {
  std::mt19937 rng(21);
  for (int len : {5, 16, 40, 150, 300}) {
    auto prompt = randomPrompt(rng, len);
    const size_t num_blocks = static_cast<size_t>((len + 15) / 16);
    // Monolithic reference.
    Harness mono(opts());
    RequestId ref = mono.add(greedy(prompt, 12));
    mono.runToCompletion();

    // D: import first, so its blocks exist when P announces.
    Harness d(opts());
    RequestSpec ds = greedy(prompt, 12);
    ds.import_kv = true;
    RequestId did = d.add(ds);
    for (int i = 0; i < 3; ++i) d.step();  // admitted; nothing is computed while importing
    const std::vector<BlockId>& d_blocks = d.outcome(did).kv_blocks;
    ASSERT_EQ(d_blocks.size(), num_blocks);
    EXPECT_TRUE(d.engine->hasWork());

    // P: prefill with a lease. Its blocks are reported before any chunk
    // runs; each announced range is copied into D at once, the way D's gets
    // read it while P goes on computing, so an announcement of a block that
    // is not final yet would change D's output.
    Harness p(opts());
    RequestId pid;
    std::vector<std::vector<int>> announced(4, std::vector<int>(num_blocks, 0));  // [layer][block]
    int early = 0;  // announcements made before the last chunk
    p.engine->setLayerObserver([&](int layer, std::span<const Engine::LayerReady> ready) {
      ASSERT_EQ(ready.size(), 1u);
      const std::vector<BlockId>& p_blocks = p.outcome(pid).kv_blocks;
      ASSERT_EQ(p_blocks.size(), num_blocks) << "announced before the blocks were reported";
      const Engine::LayerReady& r = ready[0];
      ASSERT_LE(r.first_block + r.blocks.size(), num_blocks);
      if (r.first_block + r.blocks.size() < num_blocks) ++early;
      const KvLayout& lay = p.engine->kv().layout();
      for (size_t i = 0; i < r.blocks.size(); ++i) {
        const size_t b = r.first_block + i;
        EXPECT_EQ(r.blocks[i], p_blocks[b]);
        ++announced[static_cast<size_t>(layer)][b];
        std::memcpy(const_cast<float*>(d.engine->kv().layerBlock(layer, d_blocks[b])),
                    p.engine->kv().layerBlock(layer, r.blocks[i]), lay.bytesPerLayerBlock());
      }
    });
    RequestSpec ps = greedy(prompt, 1);
    ps.lease = LeaseSpec{7, p.clock.now() + std::chrono::seconds(30)};
    pid = p.add(ps);
    p.runToCompletion();
    ASSERT_EQ(p.outcome(pid).tokens.size(), 1u);
    for (const auto& layer : announced) EXPECT_EQ(layer, std::vector<int>(num_blocks, 1)) << "each block once per layer";
    if (len > opts().max_num_batched_tokens + 16) {
      EXPECT_GT(early, 0) << "blocks of earlier chunks are announced early";
    }
    EXPECT_EQ(p.engine->numLeases(), 1);

    ASSERT_TRUE(d.engine->completeImport(did, p.outcome(pid).tokens[0]));
    d.runToCompletion();
    EXPECT_EQ(d.outcome(did).tokens, mono.outcome(ref).tokens) << "prompt length " << len;
    EXPECT_EQ(d.outcome(did).final.finish_reason, FinishReason::kLength);

    // Releasing the lease returns P's blocks.
    EXPECT_TRUE(p.engine->releaseLease(7));
    EXPECT_FALSE(p.engine->releaseLease(7));
    EXPECT_EQ(p.engine->numAvailableBlocks(), opts().num_blocks);
    EXPECT_EQ(d.engine->numAvailableBlocks(), opts().num_blocks);
    EXPECT_TRUE(p.engine->checkInvariants().ok());
  }
}

// The importer gives up before anything was written (its prefill peer
// stalled before accepting): the request computes its prompt here and ends
// exactly as on one engine, with or without a cached prefix at admission.
TEST(EnginePdTest, AnImportComputedLocallyAfterAllEqualsMonolithic) {
  std::mt19937 rng(41);
  for (bool cached_prefix : {false, true}) {
    auto prompt = randomPrompt(rng, 150);
    Harness mono(opts());
    RequestId ref = mono.add(greedy(prompt, 12));
    mono.runToCompletion();

    Harness d(opts());
    if (cached_prefix) {
      // The first 100 tokens' full blocks end up in D's prefix cache.
      d.add(greedy(std::vector<TokenId>(prompt.begin(), prompt.begin() + 100), 1));
      d.runToCompletion();
    }
    RequestSpec ds = greedy(prompt, 12);
    ds.import_kv = true;
    RequestId did = d.add(ds);
    for (int i = 0; i < 3; ++i) d.step();
    ASSERT_EQ(d.outcome(did).kv_blocks.size(), 10u) << "admitted and importing";
    EXPECT_TRUE(d.outcome(did).tokens.empty());
    ASSERT_TRUE(d.engine->computeImportLocally(did));
    EXPECT_FALSE(d.engine->computeImportLocally(did)) << "no longer importing";
    EXPECT_FALSE(d.engine->completeImport(did, 5));
    d.runToCompletion();
    EXPECT_EQ(d.outcome(did).tokens, mono.outcome(ref).tokens) << "cached prefix " << cached_prefix;
    EXPECT_EQ(d.outcome(did).final.finish_reason, FinishReason::kLength);
    EXPECT_FALSE(d.outcome(did).final.kv_imported);
    EXPECT_EQ(d.engine->numAvailableBlocks(), opts().num_blocks);
    EXPECT_TRUE(d.engine->checkInvariants().ok());
  }
}

TEST(EnginePdTest, PrefillAfterCacheChurnTakesOneAscendingRunOfBlocks) {
  // A pull merges blocks adjacent on both sides into one get per layer, so
  // a prompt's blocks should be one ascending run wherever the pool allows.
  // Here the pool is full of cached prompts; the new one evicts the oldest
  // prompt's blocks, which one-at-a-time allocation would hand out in
  // reverse (the LRU holds a released sequence tail first).
  EngineOptions o = opts();
  o.num_blocks = 24;
  o.max_num_batched_tokens = 512;  // one chunk: one allocation for the prompt
  Harness p(o);
  std::mt19937 rng(29);
  for (int i = 0; i < 4; ++i) {
    p.add(greedy(randomPrompt(rng, 96), 1));  // 6 full blocks each, cached at the end
    p.runToCompletion();
  }
  ASSERT_EQ(p.engine->numAvailableBlocks(), o.num_blocks);
  RequestSpec ps = greedy(randomPrompt(rng, 96), 1);
  ps.lease = LeaseSpec{11, p.clock.now() + std::chrono::seconds(5)};
  RequestId pid = p.add(ps);
  p.runToCompletion();
  const std::vector<BlockId>& blocks = p.outcome(pid).kv_blocks;
  ASSERT_EQ(blocks.size(), 6u);
  for (size_t i = 1; i < blocks.size(); ++i) {
    EXPECT_EQ(blocks[i].value(), blocks[i - 1].value() + 1) << "block " << i << " of the prompt";
  }
  EXPECT_TRUE(p.engine->releaseLease(11));
  EXPECT_TRUE(p.engine->checkInvariants().ok());
}

TEST(EnginePdTest, ReportedLeasedPrefillIsNeverPreempted) {
  // A decode that outgrows its reservation needs a block while the only
  // other running request is a leased prefill whose blocks a peer may be
  // reading: the decode waits, the prefill keeps its blocks.
  EngineOptions o = opts();
  o.num_blocks = 12;
  o.expected_output_tokens = 1;  // reservations that decodes outgrow
  Harness p(o);
  std::mt19937 rng(24);
  RequestId b = p.add(greedy(randomPrompt(rng, 16), 40));  // 2 blocks reserved, needs 4 by the end
  p.step();
  RequestSpec ls = greedy(randomPrompt(rng, 150), 1);      // 10 blocks, taken at admission
  ls.lease = LeaseSpec{3, p.clock.now() + std::chrono::seconds(30)};
  RequestId a = p.add(ls);
  for (int i = 0; i < 200 && !p.outcome(a).finished; ++i) p.step();
  ASSERT_TRUE(p.outcome(a).finished);
  EXPECT_EQ(p.outcome(a).tokens.size(), 1u);
  EXPECT_EQ(p.outcome(a).final.num_preemptions, 0);
  // The decode waits while the lease pins the prefill's blocks, and
  // finishes once D released them.
  for (int i = 0; i < 50; ++i) p.step();
  EXPECT_FALSE(p.outcome(b).finished);
  EXPECT_TRUE(p.engine->releaseLease(3));
  p.runToCompletion();
  EXPECT_EQ(p.outcome(b).tokens.size(), 40u);
  EXPECT_GT(p.outcome(b).final.num_preemptions, 0) << "the decode, not the leased prefill, had to give way";
  EXPECT_TRUE(p.engine->checkInvariants().ok());
  EXPECT_EQ(p.engine->numAvailableBlocks(), o.num_blocks);
}

TEST(EnginePdTest, LeasedPrefillReservesItsWholeOutputDespiteTheEstimate) {
  // With expected_output_tokens a request may outgrow its reservation and
  // then preempts, itself if nothing else can give way. A reported leased
  // prefill must never be preempted (a peer may be reading its blocks), so it
  // reserves max_tokens and waits for room at admission instead.
  EngineOptions o = opts();
  o.num_blocks = 4;
  o.expected_output_tokens = 1;
  Harness p(o);
  std::mt19937 rng(30);
  RequestSpec first = greedy(randomPrompt(rng, 16), 1);
  first.lease = LeaseSpec{11, p.clock.now() + std::chrono::seconds(5)};
  p.add(first);
  p.runToCompletion();
  ASSERT_EQ(p.engine->numAvailableBlocks(), 3);  // one block pinned for a peer
  RequestSpec ls = greedy(randomPrompt(rng, 16), 40);  // 56 tokens: 4 blocks
  ls.lease = LeaseSpec{12, p.clock.now() + std::chrono::seconds(5)};
  RequestId id = p.add(ls);
  for (int i = 0; i < 50; ++i) p.step();
  EXPECT_FALSE(p.outcome(id).finished);
  EXPECT_TRUE(p.engine->releaseLease(11));
  p.runToCompletion();
  EXPECT_EQ(p.outcome(id).final.finish_reason, FinishReason::kLength) << p.outcome(id).final.message;
  EXPECT_EQ(p.outcome(id).final.num_reserved_tokens, 56);
  EXPECT_EQ(p.outcome(id).final.num_preemptions, 0);
  EXPECT_TRUE(p.engine->releaseLease(12));
  // An unleased request with the same numbers reserves the estimate.
  RequestId plain = p.add(greedy(randomPrompt(rng, 16), 40));
  p.runToCompletion();
  EXPECT_EQ(p.outcome(plain).final.num_reserved_tokens, 17);
  EXPECT_EQ(p.engine->numAvailableBlocks(), o.num_blocks);
  EXPECT_TRUE(p.engine->checkInvariants().ok());
}

TEST(EnginePdTest, ALeaseIdIsUsedByOneRequestAtATime) {
  // Two requests with one lease id would pin one set of blocks under it and
  // leak the other's: the second is rejected while the first is running and
  // while its lease is held, and accepted once the lease is released.
  Harness p(opts());
  std::mt19937 rng(31);
  auto leased = [&](uint64_t lease_id) {
    RequestSpec s = greedy(randomPrompt(rng, 40), 1);
    s.lease = LeaseSpec{lease_id, p.clock.now() + std::chrono::seconds(5)};
    return s;
  };
  RequestId first = p.add(leased(5));
  RequestId while_running = p.add(leased(5));
  EXPECT_EQ(p.outcome(while_running).final.finish_reason, FinishReason::kRejected);
  EXPECT_EQ(p.outcome(while_running).final.reject_reason, RejectReason::kInvalid);
  EXPECT_NE(p.outcome(while_running).final.message.find("lease 5 is already used by request"), std::string::npos)
      << p.outcome(while_running).final.message;
  p.runToCompletion();
  EXPECT_EQ(p.outcome(first).final.finish_reason, FinishReason::kLength);
  RequestId while_held = p.add(leased(5));
  EXPECT_EQ(p.outcome(while_held).final.reject_reason, RejectReason::kInvalid);
  EXPECT_NE(p.outcome(while_held).final.message.find("lease 5 is already held"), std::string::npos);
  EXPECT_TRUE(p.engine->releaseLease(5));
  RequestId again = p.add(leased(5));
  p.runToCompletion();
  EXPECT_EQ(p.outcome(again).final.finish_reason, FinishReason::kLength);
  EXPECT_TRUE(p.engine->releaseLease(5));
  EXPECT_EQ(p.engine->numAvailableBlocks(), opts().num_blocks);
  EXPECT_TRUE(p.engine->checkInvariants().ok());
}

TEST(EnginePdTest, WrongKvChangesTheOutput) {
  // The equivalence above is meaningful only if imported KV matters.
  std::mt19937 rng(22);
  auto prompt = randomPrompt(rng, 40);
  Harness mono(opts());
  RequestId ref = mono.add(greedy(prompt, 12));
  mono.runToCompletion();
  Harness d(opts());
  RequestSpec ds = greedy(prompt, 12);
  ds.import_kv = true;
  RequestId did = d.add(ds);
  d.step();
  ASSERT_TRUE(d.engine->completeImport(did, mono.outcome(ref).tokens[0]));  // KV left as zeros
  d.runToCompletion();
  EXPECT_NE(d.outcome(did).tokens, mono.outcome(ref).tokens);
}

TEST(EnginePdTest, LeaseExpiresAndPinsUntilThen) {
  Harness p(opts());
  std::mt19937 rng(23);
  RequestSpec ps = greedy(randomPrompt(rng, 50), 1);
  ps.lease = LeaseSpec{9, p.clock.now() + std::chrono::seconds(5)};
  p.add(ps);
  p.runToCompletion();
  EXPECT_EQ(p.engine->numAvailableBlocks(), opts().num_blocks - 4);  // 50 tokens = 4 blocks pinned
  EXPECT_EQ(p.engine->expireLeases(), 0);
  p.clock.advance(std::chrono::seconds(6));
  EXPECT_EQ(p.engine->expireLeases(), 1);
  EXPECT_EQ(p.engine->numAvailableBlocks(), opts().num_blocks);
  EXPECT_TRUE(p.engine->checkInvariants().ok());
}

TEST(EnginePdTest, ImportingRequestIsNeverTimedOutOrPreemptedOnlyCancelled) {
  EngineOptions o = opts();
  o.num_blocks = 10;
  o.expected_output_tokens = 1;
  Harness d(o);
  std::mt19937 rng(24);
  RequestSpec ds = greedy(randomPrompt(rng, 60), 4);  // 4 blocks
  ds.import_kv = true;
  ds.deadline = d.clock.now() + std::chrono::seconds(1);
  RequestId imp = d.add(ds);
  d.step();  // admitted: importing from here on
  // A decoding neighbour that will outgrow its reservation.
  RequestId other = d.add(greedy(randomPrompt(rng, 10), 100));  // 7 blocks: it cannot fit beside the import
  d.clock.advance(std::chrono::seconds(2));  // past the importing request's deadline
  int preemptions = 0;
  for (int i = 0; i < 300; ++i) preemptions += d.step().num_preemptions;
  EXPECT_GT(preemptions, 0) << "the neighbour was meant to run out of blocks";
  EXPECT_FALSE(d.outcome(imp).finished) << "importing request ended on its own";
  EXPECT_FALSE(d.outcome(other).finished);  // preempted, waiting for blocks the import holds
  // A plain cancel only asks the importer to stop; abortImport ends it.
  EXPECT_TRUE(d.engine->cancel(imp, FinishReason::kCancelled));
  EXPECT_FALSE(d.outcome(imp).finished);
  EXPECT_TRUE(d.engine->abortImport(imp, FinishReason::kError, "transfer failed"));
  EXPECT_EQ(d.outcome(imp).final.finish_reason, FinishReason::kError);
  EXPECT_EQ(d.outcome(imp).final.message, "transfer failed");
  d.runToCompletion();
  EXPECT_EQ(d.outcome(other).final.finish_reason, FinishReason::kLength);
  EXPECT_EQ(d.engine->numAvailableBlocks(), o.num_blocks);
  EXPECT_FALSE(d.engine->completeImport(imp, 5));
}

TEST(EnginePdTest, CompletedImportPreemptedLaterReusesTheImportedBlocks) {
  // Once its KV is in, an imported request is an ordinary decode: it may be
  // preempted. Its recompute then starts from the prompt blocks the import
  // committed to D's prefix cache rather than from nothing. (The KV here is
  // not a real prefill's: only what is recomputed is checked.)
  EngineOptions o = opts();
  o.num_blocks = 10;
  o.expected_output_tokens = 1;
  Harness d(o);
  std::mt19937 rng(32);
  RequestId older = d.add(greedy(randomPrompt(rng, 10), 100));  // grows to 7 blocks on a 1-block reservation
  d.step();
  RequestSpec is = greedy(randomPrompt(rng, 64), 40);  // 4 full prompt blocks
  is.import_kv = true;
  RequestId imp = d.add(is);
  for (int i = 0; i < 3; ++i) d.step();
  ASSERT_EQ(d.outcome(imp).kv_blocks.size(), 4u);
  ASSERT_TRUE(d.engine->completeImport(imp, 7));
  int preemptions = 0, recomputed = 0;
  for (int i = 0; i < 2000 && d.engine->hasWork(); ++i) {
    StepStats st = d.step();
    preemptions += st.num_preemptions;
    if (preemptions > 0) recomputed += st.num_prefill_tokens;  // the older request's prompt is long done
  }
  ASSERT_FALSE(d.engine->hasWork());
  EXPECT_GT(d.outcome(imp).final.num_preemptions, 0) << "the import was meant to be preempted";
  EXPECT_EQ(d.outcome(imp).final.finish_reason, FinishReason::kLength);
  EXPECT_EQ(d.outcome(older).final.finish_reason, FinishReason::kLength);
  // At most the last prompt block (the LRU evicts a released sequence's tail
  // first) and the output so far are computed again, never the whole prompt.
  EXPECT_LT(recomputed, 64) << "recompute ignored the imported blocks in the prefix cache";
  EXPECT_EQ(d.engine->numAvailableBlocks(), o.num_blocks);
  EXPECT_TRUE(d.engine->checkInvariants().ok());
}

// Runs a 100-token turn that stays resident on `d` under session "conv",
// and returns the next turn: that history plus 10 new tokens, to be imported
// from a prefill agent unless it goes direct-to-D (up to 32 new tokens).
RequestSpec appendToResidentSession(Harness& d, std::mt19937& rng, int max_tokens) {
  auto history = randomPrompt(rng, 100);
  RequestSpec first = greedy(history, 1);
  first.session = SessionId("conv");
  d.add(first);
  d.runToCompletion();  // 7 blocks resident
  for (TokenId t : randomPrompt(rng, 10)) history.push_back(t);
  RequestSpec append = greedy(std::move(history), max_tokens);
  append.session = SessionId("conv");
  append.import_kv = true;
  append.direct_max_suffix_tokens = 32;
  return append;
}

TEST(EnginePdTest, DirectToDComputesAShortAppendToAResidentSessionLocally) {
  EngineOptions o = opts();
  Harness d(o);
  std::mt19937 rng(33);
  RequestSpec append = appendToResidentSession(d, rng, 6);
  const std::vector<TokenId> prompt = append.prompt;
  RequestId id = d.add(append);
  d.runToCompletion();
  EXPECT_EQ(d.outcome(id).final.finish_reason, FinishReason::kLength);
  EXPECT_TRUE(d.outcome(id).kv_blocks.empty()) << "computed here, not imported";
  EXPECT_EQ(d.outcome(id).final.num_cached_tokens, 100);
  Harness mono(o);
  RequestId ref = mono.add(greedy(prompt, 6));
  mono.runToCompletion();
  EXPECT_EQ(d.outcome(id).tokens, mono.outcome(ref).tokens);
}

TEST(EnginePdTest, DirectToDIsDecidedWhenThePlanIsCommitted) {
  // The append fits only once a running request finishes; meanwhile the
  // watermark evicts its session. With the session gone the prompt is not
  // here any more: the request imports it rather than computing it all.
  EngineOptions o = opts();
  o.num_blocks = 10;
  o.session_low_watermark_blocks = 3;
  Harness d(o);
  std::mt19937 rng(34);
  RequestSpec append = appendToResidentSession(d, rng, 4);  // 3 blocks left available
  RequestId running = d.add(greedy(randomPrompt(rng, 40), 8));  // 3 blocks
  RequestId id = d.add(append);
  for (int i = 0; i < 100 && d.outcome(id).kv_blocks.empty() && d.engine->hasWork(); ++i) d.step();
  EXPECT_EQ(d.engine->numSessionsResident(), 0);
  EXPECT_TRUE(d.outcome(running).finished);
  ASSERT_EQ(d.outcome(id).kv_blocks.size(), 7u) << "the append should import its prompt";
  EXPECT_FALSE(d.outcome(id).finished);
  EXPECT_TRUE(d.engine->abortImport(id, FinishReason::kCancelled, "test done"));
  d.runToCompletion();
  EXPECT_EQ(d.engine->numAvailableBlocks(), o.num_blocks);
  EXPECT_TRUE(d.engine->checkInvariants().ok());
}

TEST(EnginePdTest, LeaseAndImportTogetherAreRejected) {
  Harness h(opts());
  RequestSpec s = greedy({5, 6}, 1);
  s.lease = LeaseSpec{1, h.clock.now()};
  s.import_kv = true;
  RequestId id = h.add(s);
  EXPECT_EQ(h.outcome(id).final.reject_reason, RejectReason::kInvalid);
}

TEST(EnginePdTest, AnImportedFirstTokenOnTheEosListFinishes) {
  // P samples with ignore_eos; D decides. A first token that is any id of
  // config.json's eos_token_id list (here the third) ends the request at once.
  ModelConfig config = tinyModelConfig();
  config.eos_token_ids = {2, 7, 9};
  Harness d(opts(), /*with_tokenizer=*/true, nullptr, makeRandomWeights(config, 1234));
  std::mt19937 rng(33);
  RequestSpec ds = greedy(randomPrompt(rng, 20), 8);
  ds.import_kv = true;
  ds.sampling.ignore_eos = false;
  RequestId imp = d.add(ds);
  d.step();
  ASSERT_TRUE(d.engine->completeImport(imp, 9));
  EXPECT_EQ(d.outcome(imp).final.finish_reason, FinishReason::kEos);
  EXPECT_EQ(d.outcome(imp).tokens, std::vector<TokenId>{9});
  d.runToCompletion();
  EXPECT_EQ(d.engine->numAvailableBlocks(), opts().num_blocks);
}

}  // namespace
}  // namespace tandem::engine
