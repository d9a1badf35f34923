// The scheduler's policy as pure code: sequences and a block pool built
// directly, no model (the engine tests reach the same policy through it).

#include "engine/sched/scheduler.h"

#include <gtest/gtest.h>

#include "engine/kv/kv_import.h"
#include "tests/engine/sched/sched_test_util.h"

namespace tandem::engine {
namespace {

using testing::SchedulerHarness;

TEST(SchedulerTest, AdmissionReservesPromptPlusExpectedOutput) {
  // 10 blocks of 4 tokens. A reserves 20 tokens (5 blocks) and holds 2 for
  // its prompt; B's prompt needs only 2 blocks, which are free, but its
  // reservation of 6 does not fit beside A's outstanding 3.
  SchedulerHarness h(10);
  Sequence* a = h.add(8, 20);
  Sequence* b = h.add(8, 24);
  ScheduleResult r = h.step();
  ASSERT_EQ(r.admitted, std::vector<Sequence*>{a});
  EXPECT_EQ(b->state, SeqState::kWaiting);
  EXPECT_EQ(h.blocks.numAvailable(), 8);
  EXPECT_EQ(h.scheduler.outstandingReservation(), 3);
  EXPECT_EQ(a->reserved_blocks, 5);

  // Once A is gone its reservation is too, and B fits.
  h.scheduler.remove(a);
  r = h.step();
  EXPECT_EQ(r.admitted, std::vector<Sequence*>{b});
  EXPECT_EQ(b->reserved_blocks, 6);
}

TEST(SchedulerTest, AdmittedSequencesDecodeTheirReservationWithoutPreemption) {
  // Two reservations fill the pool exactly; both decode to the end of what
  // they reserved and neither is ever preempted.
  SchedulerHarness h(10);
  Sequence* a = h.add(8, 20);
  Sequence* b = h.add(8, 20);
  int steps = 0;
  for (; steps < 100 && (a->tokens.size() < 20 || b->tokens.size() < 20); ++steps) {
    ScheduleResult r = h.step();
    ASSERT_TRUE(r.preempted.empty()) << "step " << steps;
  }
  EXPECT_EQ(a->state, SeqState::kRunning);
  EXPECT_EQ(b->state, SeqState::kRunning);
  EXPECT_EQ(h.blocks.numAvailable(), 0);
  EXPECT_EQ(h.scheduler.outstandingReservation(), 0);
}

TEST(SchedulerTest, TokenBudgetServesDecodesFirstThenChunksPrefills) {
  SchedulerHarness h(64, SchedulerOptions{.max_num_batched_tokens = 10});
  Sequence* a = h.add(4, 8);
  Sequence* b = h.add(25, 30);
  Sequence* c = h.add(3, 8);
  ScheduleResult r = h.step();
  EXPECT_EQ(SchedulerHarness::chunkOf(r, a), 4);
  EXPECT_EQ(SchedulerHarness::chunkOf(r, b), 6);  // what is left of the budget
  EXPECT_EQ(c->state, SeqState::kWaiting) << "the budget, not the pool, holds it back";
  r = h.step();
  EXPECT_EQ(SchedulerHarness::chunkOf(r, a), 1);  // A decodes first
  EXPECT_EQ(SchedulerHarness::chunkOf(r, b), 9);
  EXPECT_EQ(c->state, SeqState::kWaiting);
  for (int i = 0; i < 10; ++i) {
    r = h.step();
    int total = 0;
    for (const ScheduledChunk& chunk : r.chunks) total += chunk.num_tokens;
    EXPECT_LE(total, 10) << "step " << i;
  }
  EXPECT_EQ(c->state, SeqState::kRunning);
  EXPECT_EQ(b->num_computed, static_cast<int>(b->tokens.size()) - 1) << "B's prompt done, decoding";
}

TEST(SchedulerTest, AtMostMaxNumSeqsRun) {
  SchedulerHarness h(64, SchedulerOptions{.max_num_seqs = 2});
  Sequence* a = h.add(4, 8);
  Sequence* b = h.add(4, 8);
  Sequence* c = h.add(4, 8);
  ScheduleResult r = h.step();
  EXPECT_EQ(r.admitted, (std::vector<Sequence*>{a, b}));
  EXPECT_EQ(c->state, SeqState::kWaiting);
  r = h.step();
  EXPECT_TRUE(r.admitted.empty());
  EXPECT_EQ(h.scheduler.running().size(), 2u);
  h.scheduler.remove(a);
  r = h.step();
  EXPECT_EQ(r.admitted, std::vector<Sequence*>{c});
}

// Two sequences of 8 tokens reserving 9 (3 blocks each) fill a pool of 6;
// both outgrow their reservation at 13 tokens, the same step.
struct Outgrowing {
  SchedulerHarness h{6};
  Sequence* older = h.add(8, 9);
  Sequence* newer = h.add(8, 9);
  // Steps until a preemption; returns that step's result.
  ScheduleResult stepUntilPreemption() {
    for (int i = 0; i < 20; ++i) {
      ScheduleResult r = h.step();
      if (!r.preempted.empty()) return r;
    }
    ADD_FAILURE() << "nothing was preempted";
    return {};
  }
};

TEST(SchedulerTest, PreemptionTakesTheNewestAndRequeuesItFirst) {
  Outgrowing o;
  o.h.step();  // both admitted, the pool reserved in full
  Sequence* behind = o.h.add(4, 5);
  ScheduleResult r = o.stepUntilPreemption();
  ASSERT_EQ(r.preempted, std::vector<Sequence*>{o.newer});
  EXPECT_EQ(SchedulerHarness::chunkOf(r, o.older), 1) << "the older one got the block";
  EXPECT_EQ(o.older->blocks.size(), 4u);
  EXPECT_EQ(o.newer->state, SeqState::kWaiting);
  EXPECT_TRUE(o.newer->blocks.empty());
  EXPECT_EQ(o.newer->num_computed, 0) << "preemption is by recompute";
  EXPECT_EQ(o.newer->num_preemptions, 1);
  ASSERT_EQ(o.h.scheduler.waiting().size(), 2u);
  EXPECT_EQ(o.h.scheduler.waiting()[0], o.newer) << "back to the front of the queue";
  EXPECT_EQ(o.h.scheduler.waiting()[1], behind);
  // The head (13 tokens: 4 blocks) does not fit in the 2 available; the one
  // behind it would, but does not overtake.
  EXPECT_EQ(o.h.blocks.numAvailable(), 2);
  EXPECT_EQ(behind->state, SeqState::kWaiting);
}

TEST(SchedulerTest, PinnedSequencesAreNeverPreempted) {
  // The newer one is a leased prefill whose blocks were reported (a peer may
  // be reading them): the older one gives way instead, preempting itself.
  Outgrowing o;
  o.newer->spec.lease = LeaseSpec{.id = 1};
  o.h.step();
  o.newer->kv_blocks_reported = true;
  ASSERT_TRUE(o.newer->pinned());
  ScheduleResult r = o.stepUntilPreemption();
  EXPECT_EQ(r.preempted, std::vector<Sequence*>{o.older});
  EXPECT_EQ(o.newer->state, SeqState::kRunning);
  EXPECT_EQ(o.newer->blocks.size(), 4u);
}

// A resident session of 20 tokens and an import request appending
// `num_new` tokens to it, which goes direct-to-D for up to 4 new tokens.
struct ResidentAppend {
  explicit ResidentAppend(int num_new) {
    std::vector<TokenId> history;
    for (int i = 0; i < 20; ++i) history.push_back(500 + i);
    h.putSession("s", history);
    for (int i = 0; i < num_new; ++i) history.push_back(900 + i);
    RequestSpec spec;
    spec.import_kv = true;
    spec.session = SessionId("s");
    spec.direct_max_suffix_tokens = 4;
    const int n = static_cast<int>(history.size());
    seq = h.add(n, n + 5, std::move(spec), std::move(history));
  }
  SchedulerHarness h{32};
  Sequence* seq = nullptr;
};

TEST(SchedulerTest, ShortAppendToAResidentSessionGoesDirectToD) {
  ResidentAppend a(3);
  ScheduleResult r = a.h.schedule();
  EXPECT_EQ(r.direct_to_d, std::vector<Sequence*>{a.seq});
  EXPECT_TRUE(r.imports.empty());
  EXPECT_EQ(a.seq->prompt_kv, PromptKv::kDirect);
  EXPECT_TRUE(a.seq->spec.import_kv) << "the request is left as the caller made it";
  EXPECT_EQ(a.seq->num_computed, 20) << "the session's KV is reused";
  EXPECT_EQ(SchedulerHarness::chunkOf(r, a.seq), 3);
  EXPECT_EQ(a.h.sessions.numResident(), 0);
}

TEST(SchedulerTest, LongerAppendImportsAndWaitsWithAllItsPromptBlocks) {
  ResidentAppend a(5);
  ScheduleResult r = a.h.schedule();
  EXPECT_EQ(r.imports, std::vector<Sequence*>{a.seq});
  EXPECT_TRUE(r.direct_to_d.empty());
  EXPECT_EQ(a.seq->prompt_kv, PromptKv::kImporting);
  EXPECT_TRUE(a.seq->pinned());
  EXPECT_EQ(a.seq->blocks.size(), 7u);  // 25 tokens, none reused: the peer sends the whole prompt
  EXPECT_EQ(a.seq->num_computed, 0);
  EXPECT_EQ(SchedulerHarness::chunkOf(r, a.seq), 0);
  EXPECT_EQ(a.h.sessions.numResident(), 1);
}

TEST(SchedulerTest, AnImportWaitsForItsReservationThenTakesAllItsPromptBlocksAtOnce) {
  // 8 blocks; A reserves 5 and holds 2. The import reserves 4 (12 prompt
  // tokens + 4), which do not fit beside A's outstanding 3.
  SchedulerHarness h(8);
  Sequence* a = h.add(8, 20);
  RequestSpec spec;
  spec.import_kv = true;
  Sequence* imp = h.add(12, 16, spec);
  ScheduleResult r = h.step();
  EXPECT_TRUE(r.imports.empty());
  EXPECT_EQ(imp->state, SeqState::kWaiting);
  EXPECT_EQ(imp->prompt_kv, PromptKv::kImport);
  EXPECT_TRUE(imp->blocks.empty());
  h.scheduler.remove(a);
  r = h.step();
  EXPECT_EQ(r.imports, std::vector<Sequence*>{imp});
  EXPECT_EQ(imp->prompt_kv, PromptKv::kImporting);
  EXPECT_EQ(imp->blocks.size(), 3u) << "every prompt block, for the peer to write";
  EXPECT_EQ(SchedulerHarness::chunkOf(r, imp), 0);
}

TEST(SchedulerTest, AnImportComputesNothingUntilItCompletes) {
  SchedulerHarness h(32);
  RequestSpec spec;
  spec.import_kv = true;
  Sequence* imp = h.add(10, 14, spec);
  Sequence* other = h.add(4, 30);
  ScheduleResult r = h.step();
  ASSERT_EQ(r.imports, std::vector<Sequence*>{imp});
  EXPECT_EQ(SchedulerHarness::chunkOf(r, other), 4);
  for (int i = 0; i < 5; ++i) {
    r = h.step();
    EXPECT_EQ(SchedulerHarness::chunkOf(r, imp), 0) << "step " << i;
    EXPECT_EQ(SchedulerHarness::chunkOf(r, other), 1) << "step " << i;
  }
  EXPECT_EQ(imp->num_computed, 0);
  // The KV arrived: the first token is the prefill side's; it decodes from here.
  ASSERT_TRUE(completeImport(*imp, 42, 100, MonoTime{}).ok());
  h.scheduler.commitComputedBlocks(imp);
  imp->tokens.push_back(42);
  imp->chain.append(std::span<const TokenId>(&imp->tokens.back(), 1));
  r = h.step();
  EXPECT_EQ(SchedulerHarness::chunkOf(r, imp), 1);
  EXPECT_FALSE(imp->pinned());
  EXPECT_EQ(imp->num_committed_blocks, 2) << "the imported prompt's full blocks are in the prefix cache";
}

}  // namespace
}  // namespace tandem::engine
