// The agentic session generator: deterministic for a seed, and the traces it
// writes have the documented shape.

#include "e2e/replay/generator.h"

#include <gtest/gtest.h>

#include <map>
#include <sstream>

namespace tandem::replay {
namespace {

std::string written(const GeneratorOptions& o) {
  absl::StatusOr<Trace> t = generateSessions(o);
  EXPECT_TRUE(t.ok()) << t.status();
  std::ostringstream out;
  writeTrace(*t, out);
  return out.str();
}

TEST(GeneratorTest, SameSeedSameBytesOtherSeedOtherTrace) {
  GeneratorOptions o{.num_sessions = 6, .seed = 7};
  EXPECT_EQ(written(o), written(o));
  GeneratorOptions other = o;
  other.seed = 8;
  EXPECT_NE(written(o), written(other));
}

TEST(GeneratorTest, WritesAValidTraceOfGrowingConversations) {
  GeneratorOptions o{.num_sessions = 12, .seed = 3};
  std::istringstream in(written(o));
  absl::StatusOr<Trace> t = parseTrace(in, "generated");
  ASSERT_TRUE(t.ok()) << t.status();

  std::map<std::string, std::vector<const TraceRequest*>> sessions;
  for (const TraceRequest& r : t->requests) {
    ASSERT_TRUE(r.session.has_value());
    sessions[r.session->value()].push_back(&r);
  }
  ASSERT_EQ(sessions.size(), 12u);
  const size_t system_blocks = o.system_prompt_tokens / kTraceBlockTokens;
  const std::vector<uint64_t>& first = t->requests.front().hash_ids;
  for (const auto& [id, turns] : sessions) {
    ASSERT_GE(turns.size(), 1u);
    EXPECT_LE(turns.size(), 90u);  // 3/2 of the 32K shape's 60 turns
    for (size_t k = 0; k < turns.size(); ++k) {
      const TraceRequest& r = *turns[k];
      // The shared system prompt's blocks lead every prompt.
      EXPECT_TRUE(std::equal(first.begin(), first.begin() + system_blocks, r.hash_ids.begin())) << id;
      EXPECT_LE(r.input_length + r.output_length, o.shape.max_len_tokens);
      if (k == 0) continue;
      const TraceRequest& prev = *turns[k - 1];
      // The next prompt holds the whole conversation: previous prompt and answer.
      EXPECT_GT(r.timestamp_ms, prev.timestamp_ms);
      EXPECT_GT(r.input_length, prev.input_length + prev.output_length);
      const size_t full = prev.input_length / kTraceBlockTokens;
      EXPECT_TRUE(std::equal(prev.hash_ids.begin(), prev.hash_ids.begin() + full, r.hash_ids.begin())) << id;
      // A partial last block gets a fresh id: the next turn never reuses it.
      if (prev.input_length % kTraceBlockTokens != 0 && r.hash_ids.size() >= prev.hash_ids.size()) {
        EXPECT_NE(prev.hash_ids.back(), r.hash_ids[prev.hash_ids.size() - 1]) << id;
      }
    }
  }
}

TEST(GeneratorTest, StaggersStartsForTheRequestedConcurrency) {
  GeneratorOptions o{.num_sessions = 40, .seed = 5, .active_sessions = 10};
  absl::StatusOr<Trace> t = generateSessions(o);
  ASSERT_TRUE(t.ok()) << t.status();
  std::map<std::string, std::pair<double, double>> span;  // session -> (first, last) arrival
  for (const TraceRequest& r : t->requests) {
    auto [it, added] = span.try_emplace(r.session->value(), r.timestamp_ms, r.timestamp_ms);
    it->second.second = r.timestamp_ms;
  }
  // Sessions active at the midpoint of the run: about `active_sessions`.
  const double mid = t->requests.back().timestamp_ms / 2;
  int active = 0;
  for (const auto& [id, s] : span) active += s.first <= mid && mid <= s.second ? 1 : 0;
  EXPECT_GE(active, 6);
  EXPECT_LE(active, 14);
}

TEST(GeneratorTest, ShapesAndBadOptions) {
  ASSERT_TRUE(findSessionShape("64K").has_value());
  EXPECT_EQ(findSessionShape("64K")->max_len_tokens, 65536);
  EXPECT_FALSE(findSessionShape("16K").has_value());
  EXPECT_FALSE(generateSessions(GeneratorOptions{.num_sessions = 0}).ok());
  EXPECT_FALSE(generateSessions(GeneratorOptions{.system_prompt_tokens = 40000}).ok());
  EXPECT_FALSE(generateSessions(GeneratorOptions{.active_sessions = 0}).ok());
  EXPECT_FALSE(generateSessions(GeneratorOptions{.tool_time_s = 1}).ok());  // below the 2 s minimum
}

}  // namespace
}  // namespace tandem::replay
