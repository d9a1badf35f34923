// A simulated worker's KV pool: admission as a reservation, eviction of
// cached blocks (deepest first) and of whole sessions (least recently used),
// and the worker-state deltas it records. Invariants checked after each step.

#include "e2e/replay/worker_kv.h"

#include <gtest/gtest.h>

#include "e2e/replay/trace.h"

namespace tandem::replay {
namespace {

using routing::BlocksRemoved;
using routing::BlocksStored;
using routing::SessionRemoved;
using routing::SessionStored;

// Owns a request's hashes so that KvRequest's spans stay valid.
struct Req {
  std::vector<BlockHash> prompt;
  std::vector<BlockHash> resident;
  KvRequest kv;
  Req(std::vector<uint64_t> ids, int64_t output_blocks, std::optional<std::string> session = std::nullopt)
      : prompt(chainTraceHashes(ids)) {
    resident = prompt;
    kv = KvRequest{.session = session ? std::optional<SessionId>(SessionId(*session)) : std::nullopt,
                   .prompt = prompt,
                   .resident = resident,
                   .total_blocks = static_cast<int64_t>(prompt.size()) + output_blocks,
                   .total_tokens = (static_cast<int64_t>(prompt.size()) + output_blocks) * kTraceBlockTokens};
  }
};

void checkInvariants(const WorkerKv& kv) {
  EXPECT_GE(kv.freeBlocks(), 0);
  EXPECT_LE(kv.freeBlocks(), kv.capacityBlocks());
}

void serve(WorkerKv& kv, const Req& r) {
  ASSERT_TRUE(kv.tryAdmit(r.kv).has_value());
  kv.publishComputed(r.kv);
  kv.finish(r.kv);
  checkInvariants(kv);
}

TEST(WorkerKvTest, ReservationWaitsUntilRunningRequestsFinish) {
  WorkerKv kv(10);
  Req a({1, 2, 3, 4}, 2);  // 6 blocks
  Req b({5, 6, 7}, 2);     // 5 blocks
  ASSERT_EQ(kv.tryAdmit(a.kv), std::optional<int64_t>(0));
  EXPECT_EQ(kv.freeBlocks(), 4);
  EXPECT_FALSE(kv.tryAdmit(b.kv).has_value());  // 5 > 4: waits
  kv.publishComputed(a.kv);
  kv.finish(a.kv);
  // a's prompt stays cached (evictable): all 10 are available again.
  EXPECT_EQ(kv.freeBlocks(), 10);
  EXPECT_EQ(kv.tryAdmit(b.kv), std::optional<int64_t>(0));
  checkInvariants(kv);
}

TEST(WorkerKvTest, PrefixHitsAndDeepestFirstEviction) {
  WorkerKv kv(6);
  serve(kv, Req({1, 2, 3, 4}, 0));
  EXPECT_EQ(kv.prefixHits(chainTraceHashes({1, 2, 3, 9})), 3);
  // Needs 3 new blocks of 6 with 4 cached: the chain's last block goes first,
  // so what stays is still a usable prefix.
  serve(kv, Req({7, 8, 9}, 0));
  EXPECT_EQ(kv.prefixHits(chainTraceHashes({1, 2, 3, 4})), 3);
  std::vector<routing::WorkerDeltaBody> events = kv.takeEvents();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(std::get<BlocksStored>(events[0]).hashes.size(), 4u);
  ASSERT_EQ(std::get<BlocksRemoved>(events[1]).hashes.size(), 1u);
  EXPECT_EQ(std::get<BlocksRemoved>(events[1]).hashes[0], chainTraceHashes({1, 2, 3, 4})[3]);
  EXPECT_EQ(std::get<BlocksStored>(events[2]).hashes.size(), 3u);
}

TEST(WorkerKvTest, SessionsStayResidentAndAreEvictedWholeLeastRecentFirst) {
  WorkerKv kv(12);
  serve(kv, Req({1, 2, 3}, 1, "s1"));  // 4 blocks resident
  serve(kv, Req({4, 5, 6}, 1, "s2"));
  serve(kv, Req({7, 8, 9}, 1, "s3"));
  EXPECT_EQ(kv.numResidentSessions(), 3);
  EXPECT_EQ(kv.freeBlocks(), 0);  // resident sessions are not free
  kv.takeEvents();
  // A new session needs 4 blocks: s1, the least recently used, goes whole.
  Req s4({10, 11, 12}, 1, "s4");
  ASSERT_TRUE(kv.tryAdmit(s4.kv).has_value());
  EXPECT_FALSE(kv.isResident(SessionId("s1")));
  EXPECT_TRUE(kv.isResident(SessionId("s2")));
  std::vector<routing::WorkerDeltaBody> events = kv.takeEvents();
  ASSERT_GE(events.size(), 1u);
  EXPECT_EQ(std::get<SessionRemoved>(events[0]).session, SessionId("s1"));
  checkInvariants(kv);
}

TEST(WorkerKvTest, ANextTurnTakesItsSessionOverAndNeverEvictsIt) {
  WorkerKv kv(8);
  serve(kv, Req({1, 2, 3}, 1, "s1"));
  serve(kv, Req({4, 5, 6}, 1, "s2"));
  kv.takeEvents();
  // s1's next turn: 5 prompt blocks (3 resident) + 1 output = 6; room needs s2 gone.
  Req turn({1, 2, 3, 20, 21}, 1, "s1");
  ASSERT_EQ(kv.tryAdmit(turn.kv), std::optional<int64_t>(3));
  EXPECT_FALSE(kv.isResident(SessionId("s2")));
  EXPECT_FALSE(kv.isResident(SessionId("s1")));  // taken over by the running turn
  kv.publishComputed(turn.kv);
  kv.finish(turn.kv);
  EXPECT_TRUE(kv.isResident(SessionId("s1")));
  std::vector<routing::WorkerDeltaBody> events = kv.takeEvents();
  ASSERT_FALSE(events.empty());
  const SessionStored& stored = std::get<SessionStored>(events.back());
  EXPECT_EQ(stored.state.session, SessionId("s1"));
  EXPECT_EQ(stored.state.hashes.size(), 5u);
  checkInvariants(kv);
}

TEST(WorkerKvTest, DoesNotEvictSessionsWhileRunningRequestsHoldTheRoom) {
  WorkerKv kv(8);
  serve(kv, Req({1, 2}, 0, "idle"));
  Req running({3, 4, 5}, 1);
  ASSERT_TRUE(kv.tryAdmit(running.kv).has_value());
  // 4 running + 5 new > 8: evicting "idle" cannot make room, so it stays.
  Req big({6, 7, 8, 9}, 1);
  EXPECT_FALSE(kv.tryAdmit(big.kv).has_value());
  EXPECT_TRUE(kv.isResident(SessionId("idle")));
}

}  // namespace
}  // namespace tandem::replay
