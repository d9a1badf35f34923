#include "engine/kv/lease_table.h"

#include <gtest/gtest.h>

#include <chrono>

namespace tandem::engine {
namespace {

using std::chrono::seconds;

const MonoTime kT0 = MonoTime(seconds(100));

std::vector<BlockId> allocate(BlockManager& m, int n) {
  std::vector<BlockId> out;
  m.allocateMany(n, out);
  return out;
}

TEST(LeaseTableTest, HoldPinsBlocksUntilReleased) {
  BlockManager m(8);
  LeaseTable t(m);
  t.hold(1, allocate(m, 3), kT0 + seconds(5));
  EXPECT_TRUE(t.contains(1));
  EXPECT_EQ(t.numLeases(), 1);
  EXPECT_EQ(m.numAvailable(), 5) << "the lease holds its blocks";
  int held = 0;
  t.forEachBlock([&](BlockId b) {
    ++held;
    EXPECT_EQ(m.refCount(b), 1);
  });
  EXPECT_EQ(held, 3);
  EXPECT_TRUE(t.release(1));
  EXPECT_FALSE(t.release(1)) << "a lease is released once";
  EXPECT_FALSE(t.contains(1));
  EXPECT_EQ(m.numAvailable(), 8);
  EXPECT_TRUE(m.checkInvariants().ok());
}

TEST(LeaseTableTest, ReleaseDropsOnlyTheLeasesReference) {
  // A block the prefix cache shares with another holder stays held.
  BlockManager m(4);
  LeaseTable t(m);
  std::vector<BlockId> blocks = allocate(m, 2);
  m.addRef(blocks[0]);
  t.hold(7, blocks, kT0);
  EXPECT_TRUE(t.release(7));
  EXPECT_EQ(m.refCount(blocks[0]), 1);
  EXPECT_EQ(m.refCount(blocks[1]), 0);
  m.release(blocks[0]);
  EXPECT_EQ(m.numAvailable(), 4);
}

TEST(LeaseTableTest, ExpireReleasesLeasesDueAtOrBeforeNow) {
  BlockManager m(8);
  LeaseTable t(m);
  EXPECT_FALSE(t.nextExpiry().has_value());
  t.hold(1, allocate(m, 2), kT0 + seconds(1));
  t.hold(2, allocate(m, 2), kT0 + seconds(5));
  EXPECT_EQ(t.nextExpiry(), kT0 + seconds(1));
  EXPECT_EQ(t.expire(kT0), 0);
  EXPECT_EQ(t.expire(kT0 + seconds(1)), 1) << "due at now";
  EXPECT_FALSE(t.contains(1));
  EXPECT_TRUE(t.contains(2));
  EXPECT_EQ(m.numAvailable(), 6);
  EXPECT_EQ(t.nextExpiry(), kT0 + seconds(5));
  EXPECT_EQ(t.expire(kT0 + seconds(60)), 1);
  EXPECT_FALSE(t.nextExpiry().has_value());
  EXPECT_EQ(m.numAvailable(), 8);
}

TEST(LeaseTableTest, DestructionReleasesEveryLease) {
  BlockManager m(8);
  {
    LeaseTable t(m);
    t.hold(1, allocate(m, 3), kT0);
    t.hold(2, allocate(m, 1), kT0);
  }
  EXPECT_EQ(m.numAvailable(), 8);
  EXPECT_TRUE(m.checkInvariants().ok());
}

TEST(LeaseTableDeathTest, HoldingAHeldIdIsAnInvariantViolation) {
  BlockManager m(8);
  LeaseTable t(m);
  t.hold(1, allocate(m, 1), kT0);
  EXPECT_DEATH(t.hold(1, allocate(m, 1), kT0), "held twice");
}

}  // namespace
}  // namespace tandem::engine
