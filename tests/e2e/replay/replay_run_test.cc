// The replay on small synthetic traces (not the benchmark targets, which are
// in docs/benchmarks.md): exact simulated waits, hits, direct-to-D and
// migrations, refusals, determinism, and each policy alone == in a list.

#include "e2e/replay/replay.h"

#include <gtest/gtest.h>

#include "e2e/replay/commands.h"
#include "e2e/replay/generator.h"
#include "e2e/replay/policy_factory.h"
#include "e2e/replay/report.h"
#include "src/common/block_hash.h"
#include "src/common/status.h"

namespace tandem::replay {
namespace {

TraceRequest req(double ms, int64_t input, int64_t output, std::vector<uint64_t> ids,
                 std::optional<std::string> session = std::nullopt) {
  return TraceRequest{.timestamp_ms = ms,
                      .input_length = input,
                      .output_length = output,
                      .hash_ids = std::move(ids),
                      .session = session ? std::optional<SessionId>(SessionId(*session)) : std::nullopt};
}

ReplayResult replay(const Trace& trace, std::string_view policy, int workers, WorkerModel model) {
  absl::StatusOr<std::unique_ptr<routing::Policy>> p = makePolicy(policy);
  EXPECT_TRUE(p.ok()) << p.status();
  absl::StatusOr<ReplayResult> r = runReplay(prepareReplay(trace), workers, model, **p);
  EXPECT_TRUE(r.ok()) << r.status();
  return *r;
}

const WorkerModel kModel{.cache_blocks = 100, .prefill_tokens_per_s = 1000, .decode_tokens_per_s = 100};

TEST(ReplayTest, WaitsAndHitsOnOneWorkerAreExact) {
  // Two prompts of 2 blocks at t=0: the second waits for the first's prefill
  // (1024 tokens at 1000/s) and then finds both blocks.
  Trace t{{req(0, 1024, 10, {1, 2}), req(0, 1024, 10, {1, 2})}};
  for (std::string_view policy : policyNames()) {
    ReplayResult r = replay(t, policy, 1, kModel);
    EXPECT_EQ(r.requests, 2) << policy;
    EXPECT_DOUBLE_EQ(r.p50_wait_s, 0) << policy;
    EXPECT_DOUBLE_EQ(r.p99_wait_s, 1.024) << policy;
    EXPECT_DOUBLE_EQ(r.hit_ratio, 0.5) << policy;
    EXPECT_DOUBLE_EQ(r.hit_bound, 0.5) << policy;
    EXPECT_FALSE(r.direct_share.has_value()) << policy;  // no sessions
  }
}

TEST(ReplayTest, HitBoundCountsPrefixesSeenBefore) {
  Trace t{{req(0, 1024, 1, {1, 2}), req(10, 1024, 1, {1, 2}), req(20, 1024, 1, {1, 3}), req(30, 1024, 1, {4, 2})}};
  EXPECT_DOUBLE_EQ(prepareReplay(t).hit_bound, 3.0 / 8);  // 0 + 2 + 1 + 0
}

// A session of two turns; the second extends the first (prompt and answer).
Trace twoTurns(const std::string& session, double start_ms, uint64_t first_id) {
  return Trace{{req(start_ms, 1000, 24, {0, first_id}, session),
                req(start_ms + 5000, 1100, 24, {0, first_id + 1, first_id + 2}, session)}};
}

TEST(ReplayTest, SecondTurnIsDirectOnlyWhereTheSessionIsResident) {
  const Trace t = twoTurns("s", 0, 10);
  // Round robin sends turn 1 to the other worker: not direct, a migration.
  ReplayResult rr = replay(t, "round_robin", 2, kModel);
  EXPECT_EQ(rr.direct_share, std::optional<double>(0.0));
  EXPECT_EQ(rr.min_session_direct_share, std::optional<double>(0.0));
  EXPECT_EQ(rr.migrations, 1);
  // Tandem keeps it on the worker where it is resident: computed there.
  ReplayResult tandem = replay(t, "tandem", 2, kModel);
  EXPECT_EQ(tandem.direct_share, std::optional<double>(1.0));
  EXPECT_EQ(tandem.migrations, 0);
  // Turn 1 finds the first turn's prompt and answer: 2 of its 3 blocks.
  EXPECT_DOUBLE_EQ(tandem.hit_ratio, 2.0 / 5);
}

TEST(ReplayTest, AnUnfitRequestIsRefusedAndDropped) {
  Trace t{{req(0, 512 * 5, 1, {1, 2, 3, 4, 5}), req(0, 512, 1, {9})}};
  WorkerModel small = kModel;
  small.cache_blocks = 4;
  // Round robin does not look: each worker refuses it (capacity), three times in all.
  ReplayResult rr = replay(t, "round_robin", 2, small);
  EXPECT_EQ(rr.rejections, kMaxAttempts);
  EXPECT_EQ(rr.dropped, 1);
  EXPECT_EQ(rr.requests, 1);
  // Tandem sees that no worker can ever hold it: dropped without a refusal.
  ReplayResult tandem = replay(t, "tandem", 2, small);
  EXPECT_EQ(tandem.rejections, 0);
  EXPECT_EQ(tandem.dropped, 1);
}

TEST(ReplayTest, AFullQueueRefuses) {
  WorkerModel m = kModel;
  m.max_waiting = 1;
  // The first prefills, the second waits, the third finds the queue full.
  Trace t{{req(0, 512, 1, {1}), req(0, 512, 1, {2}), req(0, 512, 1, {3})}};
  ReplayResult r = replay(t, "least_load", 1, m);
  EXPECT_EQ(r.requests, 2);
  EXPECT_EQ(r.rejections, kMaxAttempts);
  EXPECT_EQ(r.dropped, 1);
}

TEST(ReplayTest, ImbalanceAndColdWorkers) {
  Trace t;
  for (int i = 0; i < 8; ++i) t.requests.push_back(req(i * 1000.0, 1024, 1, {1, 2}));
  ReplayResult rr = replay(t, "round_robin", 4, kModel);
  EXPECT_DOUBLE_EQ(rr.imbalance, 1.0);
  EXPECT_EQ(rr.cold_workers, 0);
  // One shared prompt pulls every request to the worker that has it.
  ReplayResult ca = replay(t, "cache_aware", 4, kModel);
  EXPECT_DOUBLE_EQ(ca.imbalance, 4.0);
  EXPECT_EQ(ca.cold_workers, 3);
}

absl::StatusOr<std::vector<std::string>> jsonOf(const ReplayInput& in, int workers, const WorkerModel& m,
                                                const std::vector<std::string>& policies) {
  TANDEM_ASSIGN_OR_RETURN(std::vector<ReplayResult> results, runPolicies(in, workers, m, policies));
  std::vector<std::string> out;
  for (const ReplayResult& r : results) out.push_back(resultJson(r));
  return out;
}

TEST(ReplayTest, EachPolicyAloneGivesWhatItGivesInAListAndRunsAreDeterministic) {
  absl::StatusOr<Trace> sessions =
      generateSessions(GeneratorOptions{.num_sessions = 8, .seed = 11, .active_sessions = 4});
  ASSERT_TRUE(sessions.ok()) << sessions.status();
  const ReplayInput in = prepareReplay(*sessions);
  const WorkerModel m{.cache_blocks = 150};
  const std::vector<std::string> all(policyNames().begin(), policyNames().end());
  absl::StatusOr<std::vector<std::string>> together = jsonOf(in, 3, m, all);
  ASSERT_TRUE(together.ok()) << together.status();
  for (size_t i = 0; i < all.size(); ++i) {
    absl::StatusOr<std::vector<std::string>> alone = jsonOf(in, 3, m, {all[i]});
    ASSERT_TRUE(alone.ok()) << alone.status();
    EXPECT_EQ(alone->at(0), together->at(i)) << all[i];
  }
  // In another order, and again: the same.
  std::vector<std::string> reversed(all.rbegin(), all.rend());
  absl::StatusOr<std::vector<std::string>> again = jsonOf(in, 3, m, reversed);
  ASSERT_TRUE(again.ok()) << again.status();
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(again->at(all.size() - 1 - i), together->at(i));
}

TEST(ReplayTest, SimWorkerPublishesWhatItHoldsIntoClusterState) {
  routing::ClusterState cluster;
  SimWorker w("w0", WorkerModel{.cache_blocks = 10});
  ASSERT_TRUE(cluster.applySnapshot(w.snapshot()).ok());
  const std::vector<BlockHash> prompt = chainTraceHashes({1, 2});
  Job job{
      .kv =
          KvRequest{
              .session = SessionId("s"), .prompt = prompt, .resident = prompt, .total_blocks = 3, .total_tokens = 1100},
      .prompt_tokens = 1024,
      .output_tokens = 76};
  ASSERT_FALSE(w.offer(job).has_value());
  std::optional<Admitted> a = w.startNext();
  ASSERT_TRUE(a.has_value());
  ASSERT_TRUE(w.publish(cluster).ok());
  const routing::WorkerView* view = cluster.worker(*cluster.find("w0"));
  EXPECT_EQ(view->load.running, 1);
  EXPECT_EQ(view->load.free_blocks, 7);
  std::vector<int32_t> overlap(cluster.slotEnd());
  cluster.prefixOverlap(prompt, overlap);
  EXPECT_EQ(overlap[0], 0);  // computing: not announced yet
  w.prefillDone(a->job);
  w.finish(a->job);
  ASSERT_TRUE(w.publish(cluster).ok());
  cluster.prefixOverlap(prompt, overlap);
  EXPECT_EQ(overlap[0], 2);
  EXPECT_EQ(cluster.residentOn(SessionId("s")).size(), 1u);
  EXPECT_EQ(cluster.worker(*cluster.find("w0"))->load.running, 0);
}

}  // namespace
}  // namespace tandem::replay
