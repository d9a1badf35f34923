#include "engine/kv/session_store.h"

#include <gtest/gtest.h>

namespace tandem::engine {
namespace {

TEST(SessionStoreTest, EvictsLowestPriorityThenLeastRecentlyUsed) {
  BlockManager m(8);
  SessionStore s(m);
  auto put = [&](const char* id, int prio) {
    ResidentSession r;
    r.tokens = {1, 2};
    r.blocks = {m.allocate()};
    r.priority = prio;
    s.put(SessionId(id), std::move(r));
  };
  put("a", 1);
  put("b", 0);
  put("c", 0);
  put("d", 1);
  EXPECT_EQ(s.numBlocksHeld(), 4);
  EXPECT_EQ(m.numAvailable(), 4);
  ASSERT_TRUE(s.evictOne());
  EXPECT_FALSE(s.contains(SessionId("b")));  // priority 0, oldest
  ASSERT_TRUE(s.evictOne());
  EXPECT_FALSE(s.contains(SessionId("c")));
  ASSERT_TRUE(s.evictOne());
  EXPECT_FALSE(s.contains(SessionId("a")));
  EXPECT_EQ(m.numAvailable(), 7);
  auto taken = s.take(SessionId("d"));
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(s.numBlocksHeld(), 0);
  EXPECT_EQ(m.numAvailable(), 7);  // taking hands the reference over, it does not release
  m.releaseAll(taken->blocks);
  EXPECT_EQ(m.numAvailable(), 8);
  EXPECT_FALSE(s.evictOne());
  EXPECT_TRUE(m.checkInvariants().ok());
}

TEST(SessionStoreTest, PutReplacesAndReleasesPreviousState) {
  BlockManager m(4);
  SessionStore s(m);
  ResidentSession r1;
  r1.blocks = {m.allocate(), m.allocate()};
  s.put(SessionId("x"), std::move(r1));
  ResidentSession r2;
  r2.blocks = {m.allocate()};
  s.put(SessionId("x"), std::move(r2));
  EXPECT_EQ(s.numResident(), 1);
  EXPECT_EQ(s.numBlocksHeld(), 1);
  EXPECT_EQ(s.numDistinctBlocks(), 1);
  EXPECT_EQ(m.numAvailable(), 3);
  EXPECT_TRUE(s.drop(SessionId("x")));
  EXPECT_FALSE(s.drop(SessionId("x")));
  EXPECT_EQ(m.numAvailable(), 4);
}

TEST(SessionStoreTest, DistinctBlocksCountASharedPrefixOnce) {
  BlockManager m(8);
  SessionStore s(m);
  const BlockId system = m.allocate();  // a system prompt both sessions start with
  ResidentSession a, b;
  m.addRef(system);
  a.blocks = {system, m.allocate()};
  b.blocks = {system, m.allocate(), m.allocate()};
  s.put(SessionId("a"), std::move(a));
  s.put(SessionId("b"), std::move(b));
  EXPECT_EQ(s.numBlocksHeld(), 5);
  EXPECT_EQ(s.numDistinctBlocks(), 4);
  EXPECT_EQ(s.numBlocksOnlySessionsHold(), 4);
  m.addRef(system);  // a running sequence starts with the system prompt too
  EXPECT_EQ(s.numBlocksOnlySessionsHold(), 3) << "evicting every session would not free the shared one";
  m.release(system);
  auto taken = s.take(SessionId("b"));
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(s.numDistinctBlocks(), 2) << "the shared block is still a's";
  EXPECT_EQ(s.numBlocksOnlySessionsHold(), 1) << "b's sequence holds the shared block now";
  m.releaseAll(taken->blocks);
  ASSERT_TRUE(s.evictOne());
  EXPECT_EQ(s.numDistinctBlocks(), 0);
  EXPECT_EQ(m.numAvailable(), 8);
  EXPECT_TRUE(m.checkInvariants().ok());
}

}  // namespace
}  // namespace tandem::engine
