#include "agent/router/routing_knobs.h"

#include <filesystem>
#include <fstream>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tandem::agent {
namespace {

using ::testing::HasSubstr;

TEST(RoutingKnobsTest, KnobsOverrideTheBaseAndBadOnesSayWhich) {
  routing::RouterConfig base;
  base.sticky_weight = 7;
  auto c = applyRoutingKnobs(base, R"({"directMaxSuffixTokens": 8192, "loadFloorWeight": 3})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->direct_max_suffix_tokens, 8192);
  EXPECT_DOUBLE_EQ(c->load_floor_weight, 3);
  EXPECT_DOUBLE_EQ(c->sticky_weight, 7) << "what the knobs do not name stays";
  EXPECT_TRUE(applyRoutingKnobs(base, "{}").ok());
  EXPECT_THAT(applyRoutingKnobs(base, "{").status().message(), HasSubstr("not JSON"));
  EXPECT_THAT(applyRoutingKnobs(base, "[1]").status().message(), HasSubstr("expected a JSON object"));
  EXPECT_THAT(applyRoutingKnobs(base, R"({"stickyWeight": 1})").status().message(), HasSubstr("unknown knob \"stickyWeight\""));
  EXPECT_THAT(applyRoutingKnobs(base, R"({"directMaxSuffixTokens": -1})").status().message(),
              HasSubstr("directMaxSuffixTokens: expected an integer >= 0"));
  EXPECT_THAT(applyRoutingKnobs(base, R"({"loadFloorWeight": "high"})").status().message(),
              HasSubstr("loadFloorWeight: expected a number"));
}

TEST(RoutingKnobsTest, TheAdmissionWatermarkIsAKnobAndBadValuesSayWhy) {
  routing::RouterConfig base;
  auto c = applyRoutingKnobs(base, R"({"prefillOverloadTokens": 32000})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->prefill_overload_tokens, 32000);
  EXPECT_EQ(c->direct_max_suffix_tokens, base.direct_max_suffix_tokens);
  for (const char* bad : {R"({"prefillOverloadTokens": -1})", R"({"prefillOverloadTokens": 1.5})",
                          R"({"prefillOverloadTokens": "lots"})", R"({"prefillOverloadTokens": 2000000000000})"}) {
    EXPECT_THAT(applyRoutingKnobs(base, bad).status().message(),
                HasSubstr("prefillOverloadTokens: expected an integer in [0, 1e12]"))
        << bad;
  }
}

TEST(RoutingKnobsTest, TheWatcherAppliesChangesKeepsTheLastGoodOnesAndRestoresTheBase) {
  const std::string path = ::testing::TempDir() + "/knobs-" + std::to_string(getpid()) + ".json";
  std::filesystem::remove(path);
  routing::RouterConfig base;
  std::vector<routing::RouterConfig> applied;
  RoutingKnobsWatcher w(path, base, [&](const routing::RouterConfig& c) {
    applied.push_back(c);
    return absl::OkStatus();
  });
  EXPECT_TRUE(applied.empty()) << "no file, no change from the base the router starts with";
  auto write = [&](const std::string& text) {
    std::ofstream(path) << text;
    w.poll();
  };
  write(R"({"directMaxSuffixTokens": 4096})");
  ASSERT_EQ(applied.size(), 1u);
  EXPECT_EQ(applied.back().direct_max_suffix_tokens, 4096);
  w.poll();
  EXPECT_EQ(applied.size(), 1u) << "unchanged: nothing applied again";
  write("garbage");
  EXPECT_EQ(applied.size(), 1u) << "a bad file changes nothing";
  write(R"({"directMaxSuffixTokens": 512})");
  ASSERT_EQ(applied.size(), 2u);
  EXPECT_EQ(applied.back().direct_max_suffix_tokens, 512);
  std::filesystem::remove(path);
  w.poll();
  ASSERT_EQ(applied.size(), 3u);
  EXPECT_EQ(applied.back().direct_max_suffix_tokens, base.direct_max_suffix_tokens) << "the file went: the base again";
}

}  // namespace
}  // namespace tandem::agent
