// Engine::drainRoutableChanges: what the worker-state stream publishes comes
// from the engine's own prefix cache and session store, hashed with the
// engine's own chain.

#include "engine/routable_state.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "src/common/block_hash.h"
#include "tests/engine/engine_test_util.h"

namespace tandem::engine {
namespace {

using testing::greedy;
using testing::Harness;
using testing::randomPrompt;

EngineOptions options() {
  EngineOptions o;
  o.num_blocks = 32;
  o.block_size = 16;
  o.seed = 1;
  return o;
}

std::vector<BlockHash> stored(const RoutableChanges& c) {
  std::vector<BlockHash> out;
  for (const KvEvent& e : c.blocks) {
    if (e.kind == KvEvent::Kind::kStored) out.push_back(e.hash);
  }
  return out;
}

TEST(RoutableStateTest, StoredBlocksAreThePromptsChainAtTheEnginesRoot) {
  Harness h(options());
  std::mt19937 rng(1);
  const std::vector<TokenId> prompt = randomPrompt(rng, 40);  // two full blocks and a partial one
  h.add(greedy(prompt, 1));
  h.runToCompletion();
  const RoutableChanges c = h.engine->drainRoutableChanges();
  EXPECT_EQ(stored(c), computeBlockHashes(prompt, 16, h.engine->blockHashRoot()));
  EXPECT_TRUE(c.sessions.empty());
  EXPECT_TRUE(h.engine->drainRoutableChanges().empty());  // drained: nothing twice
}

TEST(RoutableStateTest, SessionResidencyIsReportedWithItsStateNowAndItsRemoval) {
  Harness h(options());
  std::mt19937 rng(2);
  const std::vector<TokenId> prompt = randomPrompt(rng, 35);
  RequestSpec spec = greedy(prompt, 4);
  spec.session = SessionId("s1");
  const RequestId id = h.add(spec);
  h.runToCompletion();
  RoutableChanges c = h.engine->drainRoutableChanges();
  ASSERT_EQ(c.sessions.size(), 1u);
  const SessionResidency& r = c.sessions[0];
  EXPECT_EQ(r.id, SessionId("s1"));
  EXPECT_TRUE(r.resident);
  // Resident: the prompt and the outputs whose KV was computed (all but the last).
  std::vector<TokenId> tokens = prompt;
  const auto& out = h.outcome(id).tokens;
  tokens.insert(tokens.end(), out.begin(), out.end() - 1);
  EXPECT_EQ(r.num_tokens, static_cast<int64_t>(tokens.size()));
  EXPECT_EQ(r.hashes, computeBlockHashes(tokens, 16, h.engine->blockHashRoot()));

  ASSERT_TRUE(h.engine->dropSession(SessionId("s1")));
  c = h.engine->drainRoutableChanges();
  ASSERT_EQ(c.sessions.size(), 1u);
  EXPECT_EQ(c.sessions[0].id, SessionId("s1"));
  EXPECT_FALSE(c.sessions[0].resident);
  EXPECT_TRUE(c.sessions[0].hashes.empty());
}

TEST(RoutableStateTest, EvictedBlocksAreReportedRemoved) {
  EngineOptions o = options();
  o.num_blocks = 8;
  Harness h(o);
  std::mt19937 rng(3);
  const std::vector<TokenId> first = randomPrompt(rng, 64);
  h.add(greedy(first, 1));
  h.runToCompletion();
  const std::vector<BlockHash> first_hashes = stored(h.engine->drainRoutableChanges());
  ASSERT_EQ(first_hashes.size(), 4u);
  h.add(greedy(randomPrompt(rng, 100), 1));  // needs 7 of the 8 blocks: evicts cached ones
  h.runToCompletion();
  const RoutableChanges c = h.engine->drainRoutableChanges();
  std::vector<BlockHash> removed;
  for (const KvEvent& e : c.blocks) {
    if (e.kind == KvEvent::Kind::kRemoved) removed.push_back(e.hash);
  }
  ASSERT_FALSE(removed.empty());
  for (BlockHash hash : removed) {
    EXPECT_NE(std::find(first_hashes.begin(), first_hashes.end(), hash), first_hashes.end());
  }
}

}  // namespace
}  // namespace tandem::engine
