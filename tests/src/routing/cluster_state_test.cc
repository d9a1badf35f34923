#include "src/routing/cluster_state.h"

#include <gtest/gtest.h>

#include <vector>

#include "tests/src/routing/routing_test_util.h"

namespace tandem::routing {
namespace {

using test_util::chain;
using test_util::concat;

WorkerSnapshot snapshot(const std::string& name, std::vector<BlockHash> cached, uint64_t epoch = 7, uint64_t seq = 0) {
  WorkerSnapshot s;
  s.worker = name;
  s.epoch = epoch;
  s.seq = seq;
  s.block_size = 16;
  s.load = {.free_blocks = 100, .total_blocks = 100};
  s.cached = std::move(cached);
  return s;
}

std::vector<int32_t> overlaps(const ClusterState& c, const std::vector<BlockHash>& prompt) {
  std::vector<int32_t> out(c.slotEnd());
  c.prefixOverlap(prompt, out);
  return out;
}

int32_t overlapOf(const ClusterState& c, const std::string& name, const std::vector<BlockHash>& prompt) {
  return overlaps(c, prompt)[c.find(name)->value()];
}

TEST(ClusterStateTest, PrefixOverlapCountsLeadingBlocksPerWorker) {
  ClusterState c;
  ASSERT_TRUE(c.applySnapshot(snapshot("a", chain(100, 10))).ok());
  ASSERT_TRUE(c.applySnapshot(snapshot("b", chain(100, 3))).ok());
  ASSERT_TRUE(c.applySnapshot(snapshot("c", {})).ok());
  auto prompt = chain(100, 20);
  EXPECT_EQ(overlapOf(c, "a", prompt), 10);
  EXPECT_EQ(overlapOf(c, "b", prompt), 3);
  EXPECT_EQ(overlapOf(c, "c", prompt), 0);
  // A prompt that diverges after 2 blocks.
  std::vector<BlockHash> other = {BlockHash(100), BlockHash(101), BlockHash(999)};
  EXPECT_EQ(overlapOf(c, "a", other), 2);
  EXPECT_EQ(overlapOf(c, "b", other), 2);
  EXPECT_EQ(c.numIndexedBlocks(), 10u);
}

TEST(ClusterStateTest, OverlapMatchesALinearScanOnManyWorkers) {
  ClusterState c;
  constexpr int kWorkers = 70;  // more than one 64-bit word of slots
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_TRUE(c.applySnapshot(snapshot("w" + std::to_string(w), chain(1000, (w * 7) % 41))).ok());
  }
  for (int n : {0, 1, 5, 40, 41, 64}) {
    auto prompt = chain(1000, n);
    auto got = overlaps(c, prompt);
    for (int w = 0; w < kWorkers; ++w) {
      EXPECT_EQ(got[c.find("w" + std::to_string(w))->value()], std::min(n, (w * 7) % 41)) << "n=" << n << " w=" << w;
    }
  }
}

TEST(ClusterStateTest, DeltasApplyInOrder) {
  ClusterState c;
  ASSERT_TRUE(c.applySnapshot(snapshot("a", chain(100, 2), 7, 5)).ok());
  ASSERT_TRUE(c.applyDelta("a", {.epoch = 7, .seq = 6, .body = BlocksStored{chain(102, 3)}}).ok());
  EXPECT_EQ(overlapOf(c, "a", chain(100, 10)), 5);
  // The engine evicts a chain's tail first (its LRU releases a sequence tail first).
  ASSERT_TRUE(c.applyDelta("a", {.epoch = 7, .seq = 7, .body = BlocksRemoved{chain(103, 2)}}).ok());
  EXPECT_EQ(overlapOf(c, "a", chain(100, 10)), 3);
  WorkerLoad load{.free_blocks = 3, .total_blocks = 100, .running = 2, .draining = true};
  ASSERT_TRUE(c.applyDelta("a", {.epoch = 7, .seq = 8, .body = load}).ok());
  EXPECT_EQ(c.worker(*c.find("a"))->load, load);
  EXPECT_EQ(c.worker(*c.find("a"))->seq, 8u);
}

// The documented limit of the O(log N) search: a block held past a hole is
// counted as if the hole were filled (optimistic; D's admission corrects it).
TEST(ClusterStateTest, AHoleInAChainIsCountedOptimistically) {
  ClusterState c;
  std::vector<BlockHash> held = chain(100, 8);
  held.erase(held.begin() + 2);  // the worker lacks block 2 of 8
  ASSERT_TRUE(c.applySnapshot(snapshot("a", held)).ok());
  int32_t got = overlapOf(c, "a", chain(100, 8));
  EXPECT_GE(got, 2);
  EXPECT_LE(got, 8);
}

TEST(ClusterStateTest, AGapOrAnotherEpochAsksForASnapshotAndMarksStale) {
  ClusterState c;
  ASSERT_TRUE(c.applySnapshot(snapshot("a", chain(100, 4), 7, 5)).ok());
  absl::Status gap = c.applyDelta("a", {.epoch = 7, .seq = 7, .body = BlocksStored{chain(104, 1)}});
  EXPECT_TRUE(needsResnapshot(gap)) << gap;
  EXPECT_TRUE(c.worker(*c.find("a"))->stale);
  EXPECT_EQ(overlapOf(c, "a", chain(100, 4)), 0);  // no credit while stale
  // Even the delta that would have been next is refused until a snapshot.
  EXPECT_TRUE(needsResnapshot(c.applyDelta("a", {.epoch = 7, .seq = 6, .body = BlocksStored{}})));

  ASSERT_TRUE(c.applySnapshot(snapshot("a", chain(100, 6), 8, 0)).ok());
  EXPECT_FALSE(c.worker(*c.find("a"))->stale);
  EXPECT_EQ(overlapOf(c, "a", chain(100, 10)), 6);
  EXPECT_TRUE(needsResnapshot(c.applyDelta("a", {.epoch = 7, .seq = 1, .body = BlocksStored{}})));
  EXPECT_TRUE(needsResnapshot(c.applyDelta("nobody", {.epoch = 1, .seq = 1, .body = BlocksStored{}})));
}

TEST(ClusterStateTest, OneSnapshotReplacesEverythingAfterARestart) {
  ClusterState c;
  WorkerSnapshot before = snapshot("a", chain(100, 50), 1, 900000);
  before.sessions.push_back({.session = SessionId("s1"), .hashes = chain(5000, 8), .num_tokens = 130});
  ASSERT_TRUE(c.applySnapshot(before).ok());
  // The worker restarts with an empty cache: one snapshot, nothing replayed.
  ASSERT_TRUE(c.applySnapshot(snapshot("a", chain(700, 2), 2, 0)).ok());
  EXPECT_EQ(overlapOf(c, "a", chain(100, 50)), 0);
  EXPECT_EQ(overlapOf(c, "a", chain(700, 2)), 2);
  EXPECT_TRUE(c.residentOn(SessionId("s1")).empty());
  EXPECT_EQ(c.numIndexedBlocks(), 2u);
  EXPECT_EQ(c.worker(*c.find("a"))->num_resident_sessions, 0);
}

TEST(ClusterStateTest, SessionsCountAsHeldAndTrackResidency) {
  ClusterState c;
  ASSERT_TRUE(c.applySnapshot(snapshot("d", chain(100, 2), 1, 0)).ok());
  ResidentSessionBlocks s{.session = SessionId("s1"), .hashes = chain(100, 6), .num_tokens = 100};
  ASSERT_TRUE(c.applyDelta("d", {.epoch = 1, .seq = 1, .body = SessionStored{s}}).ok());
  EXPECT_EQ(overlapOf(c, "d", chain(100, 8)), 6);
  EXPECT_EQ(c.residentOn(SessionId("s1")), std::vector<WorkerSlot>{*c.find("d")});
  EXPECT_EQ(c.residentTokens(*c.find("d"), SessionId("s1")), 100);
  EXPECT_EQ(c.residentBlocks(*c.find("d"), SessionId("s1")), 6);
  EXPECT_EQ(c.worker(*c.find("d"))->num_session_blocks, 6);
  // A second session sharing the first 4 blocks adds only its own 2.
  ResidentSessionBlocks s2{
      .session = SessionId("s2"), .hashes = concat(chain(100, 4), chain(700, 2)), .num_tokens = 96};
  ASSERT_TRUE(c.applyDelta("d", {.epoch = 1, .seq = 2, .body = SessionStored{s2}}).ok());
  EXPECT_EQ(c.worker(*c.find("d"))->num_session_blocks, 8);
  ASSERT_TRUE(c.applyDelta("d", {.epoch = 1, .seq = 3, .body = SessionRemoved{SessionId("s2")}}).ok());
  EXPECT_EQ(c.worker(*c.find("d"))->num_session_blocks, 6);
  // The cache forgets two shared blocks: the session still holds them.
  ASSERT_TRUE(c.applyDelta("d", {.epoch = 1, .seq = 4, .body = BlocksRemoved{chain(100, 2)}}).ok());
  EXPECT_EQ(overlapOf(c, "d", chain(100, 8)), 6);
  ASSERT_TRUE(c.applyDelta("d", {.epoch = 1, .seq = 5, .body = SessionRemoved{SessionId("s1")}}).ok());
  EXPECT_EQ(c.worker(*c.find("d"))->num_session_blocks, 0);
  EXPECT_EQ(overlapOf(c, "d", chain(100, 8)), 0);
  EXPECT_TRUE(c.residentOn(SessionId("s1")).empty());
  EXPECT_EQ(c.numIndexedBlocks(), 0u);
}

TEST(ClusterStateTest, StaleWorkersStayRoutableWithoutCacheCredit) {
  ClusterState c;
  WorkerSnapshot snap = snapshot("d", chain(100, 4));
  snap.sessions.push_back({.session = SessionId("s1"), .hashes = chain(100, 4), .num_tokens = 64});
  ASSERT_TRUE(c.applySnapshot(snap).ok());
  EXPECT_EQ(c.numStale(), 0u);
  EXPECT_TRUE(c.markStale("d"));
  EXPECT_FALSE(c.markStale("d")) << "already stale: the caller logs the transition once";
  EXPECT_FALSE(c.markStale("nobody"));
  EXPECT_EQ(c.numStale(), 1u);
  const WorkerView* v = c.worker(*c.find("d"));
  ASSERT_NE(v, nullptr);
  EXPECT_TRUE(v->stale);
  EXPECT_TRUE(v->healthy);
  EXPECT_EQ(overlapOf(c, "d", chain(100, 4)), 0);
  EXPECT_TRUE(c.residentOn(SessionId("s1")).empty());
  EXPECT_EQ(c.residentTokens(*c.find("d"), SessionId("s1")), 0);
}

TEST(ClusterStateTest, RemovedWorkerFreesItsSlotForANewGeneration) {
  ClusterState c;
  ASSERT_TRUE(c.applySnapshot(snapshot("a", chain(100, 4))).ok());
  WorkerRef old_ref = c.worker(*c.find("a"))->ref;
  c.removeWorker("a");
  EXPECT_FALSE(c.find("a").has_value());
  EXPECT_EQ(c.numWorkers(), 0u);
  EXPECT_EQ(c.numIndexedBlocks(), 0u);
  ASSERT_TRUE(c.applySnapshot(snapshot("b", chain(100, 1))).ok());
  WorkerRef new_ref = c.worker(*c.find("b"))->ref;
  EXPECT_EQ(new_ref.slot, old_ref.slot);
  EXPECT_NE(new_ref.generation, old_ref.generation);
}

}  // namespace
}  // namespace tandem::routing
