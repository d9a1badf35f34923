#include "engine/kv/block_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>


namespace tandem::engine {
namespace {

TEST(BlockManagerTest, AllocateReleaseAndCounts) {
  BlockManager m(4);
  EXPECT_EQ(m.numAvailable(), 4);
  BlockId a = m.allocate(), b = m.allocate();
  EXPECT_NE(a, b);
  EXPECT_EQ(m.numAvailable(), 2);
  EXPECT_TRUE(m.isWritable(a));
  m.addRef(a);
  EXPECT_FALSE(m.isWritable(a));  // shared
  m.release(a);
  EXPECT_TRUE(m.isWritable(a));
  m.release(a);
  m.release(b);
  EXPECT_EQ(m.numFree(), 4);
  EXPECT_TRUE(m.checkInvariants().ok());
}

TEST(BlockManagerTest, CommittedBlocksAreCachedAndReusedByHash) {
  BlockManager m(4);
  BlockId a = m.allocate();
  EXPECT_TRUE(m.commit(a, BlockHash(11)));
  EXPECT_FALSE(m.isWritable(a));  // hashed blocks are immutable
  m.release(a);
  EXPECT_EQ(m.numCachedEvictable(), 1);
  EXPECT_EQ(m.numAvailable(), 4);  // cached blocks are still available
  std::vector<BlockHash> chain{BlockHash(11), BlockHash(12)};
  EXPECT_EQ(m.matchPrefix(chain), 1);
  EXPECT_TRUE(m.isCachedUnreferenced(BlockHash(11)));
  EXPECT_EQ(m.acquireCached(BlockHash(11)), a);
  EXPECT_EQ(m.refCount(a), 1);
  EXPECT_EQ(m.numCachedEvictable(), 0);
  EXPECT_TRUE(m.checkInvariants().ok());
}

TEST(BlockManagerTest, DuplicateContentStaysPrivate) {
  BlockManager m(4);
  BlockId a = m.allocate(), b = m.allocate();
  EXPECT_TRUE(m.commit(a, BlockHash(5)));
  EXPECT_FALSE(m.commit(b, BlockHash(5)));  // same content computed twice: first one is the cached copy
  m.release(b);
  EXPECT_EQ(m.numFree(), 3);  // b went back to the free list, not the cache
  m.release(a);
  EXPECT_EQ(m.numCachedEvictable(), 1);
  EXPECT_TRUE(m.checkInvariants().ok());
}

TEST(BlockManagerTest, EvictsLeastRecentlyUsedOnlyWhenNeededAndEmitsEvents) {
  BlockManager m(3);
  std::vector<BlockId> ids;
  for (int i = 0; i < 3; ++i) {
    ids.push_back(m.allocate());
    m.commit(ids.back(), BlockHash(100 + i));
  }
  // Release in order 1, 0, 2: LRU order is 1, 0, 2.
  m.release(ids[1]);
  m.release(ids[0]);
  m.release(ids[2]);
  auto events = m.drainEvents();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].kind, KvEvent::Kind::kStored);
  EXPECT_EQ(m.matchPrefix(std::vector<BlockHash>{BlockHash(100)}), 1);  // nothing evicted yet
  BlockId x = m.allocate();  // free list empty: evicts hash 101 (least recent)
  EXPECT_EQ(x, ids[1]);
  events = m.drainEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, KvEvent::Kind::kRemoved);
  EXPECT_EQ(events[0].hash, BlockHash(101));
  EXPECT_EQ(m.matchPrefix(std::vector<BlockHash>{BlockHash(101)}), 0);
  EXPECT_EQ(m.matchPrefix(std::vector<BlockHash>{BlockHash(100)}), 1);
  EXPECT_TRUE(m.checkInvariants().ok());
}

TEST(BlockManagerTest, MatchPrefixStopsAtFirstMiss) {
  BlockManager m(4);
  BlockId a = m.allocate(), c = m.allocate();
  m.commit(a, BlockHash(1));
  m.commit(c, BlockHash(3));
  EXPECT_EQ(m.matchPrefix(std::vector<BlockHash>{BlockHash(1), BlockHash(2), BlockHash(3)}), 1);
  EXPECT_EQ(m.matchPrefix(std::vector<BlockHash>{BlockHash(2)}), 0);
}

TEST(BlockManagerTest, ReleaseAllCachesTailFirstSoPrefixIsEvictedLast) {
  BlockManager m(3);
  std::vector<BlockId> seq;
  for (int i = 0; i < 3; ++i) {
    seq.push_back(m.allocate());
    m.commit(seq.back(), BlockHash(10 + i));
  }
  m.releaseAll(seq);
  EXPECT_EQ(m.allocate(), seq[2]);  // the tail goes first
  EXPECT_EQ(m.allocate(), seq[1]);
}

// Fills an 8-block pool with two cached 4-block sequences, the second
// released before the first, so the LRU holds [4..7] tail first, then [0..3].
BlockManager churnedPool() {
  BlockManager m(8);
  std::vector<BlockId> first, second;
  for (int i = 0; i < 4; ++i) {
    first.push_back(m.allocate());
    m.commit(first.back(), BlockHash(100 + i));
  }
  for (int i = 0; i < 4; ++i) {
    second.push_back(m.allocate());
    m.commit(second.back(), BlockHash(200 + i));
  }
  m.releaseAll(second);
  m.releaseAll(first);
  m.drainEvents();
  return m;
}

TEST(BlockManagerTest, AllocateManyTakesWhatAllocateWouldInAscendingOrder) {
  BlockManager one_by_one = churnedPool();
  std::vector<BlockId> expected;
  for (int i = 0; i < 6; ++i) expected.push_back(one_by_one.allocate());
  // One at a time, eviction hands a cached sequence back tail first.
  EXPECT_EQ(expected[0], BlockId(7));
  EXPECT_EQ(expected[3], BlockId(4));

  BlockManager many = churnedPool();
  std::vector<BlockId> got{BlockId(42)};  // appended after what is there
  many.allocateMany(6, got);
  ASSERT_EQ(got.size(), 7u);
  EXPECT_EQ(got[0], BlockId(42));
  got.erase(got.begin());
  EXPECT_TRUE(std::is_sorted(got.begin(), got.end(), [](BlockId a, BlockId b) { return a.value() < b.value(); }));
  std::vector<BlockId> expected_sorted = expected;
  std::sort(expected_sorted.begin(), expected_sorted.end(), [](BlockId a, BlockId b) { return a.value() < b.value(); });
  EXPECT_EQ(got, expected_sorted);  // the same blocks: LRU order decides which, not the sort
  EXPECT_EQ(got, (std::vector<BlockId>{BlockId(2), BlockId(3), BlockId(4), BlockId(5), BlockId(6), BlockId(7)}));
  // The same hashes were evicted, in the same order.
  auto a = one_by_one.drainEvents(), b = many.drainEvents();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].hash, b[i].hash);
  EXPECT_TRUE(many.checkInvariants().ok());
  for (BlockId id : got) EXPECT_TRUE(many.isWritable(id));
}

// Misuse that would corrupt the pool stops the process, in Release too
// (src/common/check.h): a double release, a block id outside the pool.
TEST(BlockManagerDeathTest, DoubleReleaseAndForeignIdsAbortInRelease) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        BlockManager bm(4);
        const BlockId id = bm.allocate();
        bm.release(id);
        bm.release(id);
      },
      "invariant violated: .*release\\(\\) of a block nobody holds");
  EXPECT_DEATH(
      {
        BlockManager bm(4);
        bm.addRef(BlockId(9));
      },
      "a block id outside the pool");
}

}  // namespace
}  // namespace tandem::engine
