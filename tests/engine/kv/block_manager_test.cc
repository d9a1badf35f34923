#include "engine/kv/block_manager.h"

#include <gtest/gtest.h>


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

}  // namespace
}  // namespace tandem::engine
