#include "src/common/config.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace tandem {
namespace {

struct EngineOpts {
  int32_t num_blocks = 100;
  int32_t block_size = 16;
  double temperature = 1.0;
  bool prefix_cache = true;
  std::string role = "both";
  std::chrono::nanoseconds deadline = std::chrono::seconds(30);
  std::vector<std::string> peers;
  uint64_t seed = 0;
};

absl::Status load(std::string_view yaml, EngineOpts* o) {
  auto doc = ConfigDoc::fromString(yaml, "agent.yaml");
  if (!doc.ok()) return doc.status();
  ConfigMap root = doc->root();
  root.field("role", &o->role, {.one_of = {"prefill", "decode", "both", "router"}});
  root.field("peers", &o->peers);
  ConfigMap engine = root.section("engine");
  engine.field("num_blocks", &o->num_blocks, {.min = 1});
  engine.field("block_size", &o->block_size, {.min = 1, .max = 1024});
  engine.field("temperature", &o->temperature, {.min = 0});
  engine.field("prefix_cache", &o->prefix_cache);
  engine.field("deadline", &o->deadline);
  engine.field("seed", &o->seed);
  return doc->finish();
}

std::string errorOf(std::string_view yaml) {
  EngineOpts o;
  absl::Status s = load(yaml, &o);
  EXPECT_FALSE(s.ok()) << "expected an error for:\n" << yaml;
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  return std::string(s.message());
}

TEST(ConfigTest, ReadsAllTypesAndKeepsDefaults) {
  EngineOpts o;
  ASSERT_TRUE(load(R"(
role: decode
peers: [p-0, p-1]
engine:
  num_blocks: 4096
  temperature: 0.7
  prefix_cache: false
  deadline: 250ms
  seed: 18446744073709551615
)",
                   &o)
                  .ok());
  EXPECT_EQ(o.role, "decode");
  EXPECT_EQ(o.peers, (std::vector<std::string>{"p-0", "p-1"}));
  EXPECT_EQ(o.num_blocks, 4096);
  EXPECT_EQ(o.block_size, 16);  // default kept
  EXPECT_DOUBLE_EQ(o.temperature, 0.7);
  EXPECT_FALSE(o.prefix_cache);
  EXPECT_EQ(o.deadline, std::chrono::milliseconds(250));
  EXPECT_EQ(o.seed, 18446744073709551615ULL);
}

TEST(ConfigTest, EmptyDocumentMeansAllDefaults) {
  EngineOpts o;
  EXPECT_TRUE(load("", &o).ok());
  EXPECT_TRUE(load("# only a comment\n", &o).ok());
  EXPECT_EQ(o.num_blocks, 100);
}

TEST(ConfigTest, MalformedYamlNamesLineAndColumn) {
  EngineOpts o;
  absl::Status s = load("engine:\n  num_blocks: [1, 2\n", &o);
  ASSERT_FALSE(s.ok());
  std::string m(s.message());
  EXPECT_NE(m.find("agent.yaml:"), std::string::npos) << m;
  EXPECT_NE(m.find("invalid YAML"), std::string::npos) << m;
}

TEST(ConfigTest, TopLevelMustBeMapping) {
  EXPECT_NE(errorOf("- a\n- b\n").find("top level must be a mapping"), std::string::npos);
  EXPECT_NE(errorOf("just a string\n").find("top level must be a mapping"), std::string::npos);
}

TEST(ConfigTest, UnknownKeyNamesFullPathAndKnownKeys) {
  std::string m = errorOf("engine:\n  num_blocks: 10\n  blok_size: 8\n");
  EXPECT_NE(m.find("agent.yaml:3:3: engine.blok_size: unknown key"), std::string::npos) << m;
  EXPECT_NE(m.find("block_size"), std::string::npos) << m;  // suggests what is known
  m = errorOf("rol: decode\n");
  EXPECT_NE(m.find("rol: unknown key"), std::string::npos) << m;
}

TEST(ConfigTest, WrongTypesNamePathExpectedTypeAndValue) {
  EXPECT_NE(errorOf("engine:\n  num_blocks: many\n").find("engine.num_blocks: expected integer, got \"many\""),
            std::string::npos);
  EXPECT_NE(errorOf("engine:\n  num_blocks: 1.5\n").find("engine.num_blocks: expected integer"), std::string::npos);
  EXPECT_NE(errorOf("engine:\n  prefix_cache: maybe\n").find("engine.prefix_cache: expected boolean"),
            std::string::npos);
  EXPECT_NE(errorOf("engine:\n  temperature: [1]\n").find("engine.temperature: expected number, got a sequence"),
            std::string::npos);
  EXPECT_NE(errorOf("engine: 5\n").find("engine: expected a mapping, got \"5\""), std::string::npos);
  EXPECT_NE(errorOf("peers: p-0\n").find("peers: expected sequence of strings"), std::string::npos);
  EXPECT_NE(errorOf("engine:\n  deadline: 30\n").find("engine.deadline: expected a duration"), std::string::npos);
  EXPECT_NE(errorOf("engine:\n  seed: -1\n").find("engine.seed: expected non-negative integer"), std::string::npos);
  EXPECT_NE(errorOf("engine:\n  num_blocks:\n").find("engine.num_blocks: expected integer, got null"),
            std::string::npos);
}

TEST(ConfigTest, RangesAndEnumsAreChecked) {
  EXPECT_NE(errorOf("engine:\n  num_blocks: 0\n").find("engine.num_blocks: value 0 out of range: must be at least 1"),
            std::string::npos);
  EXPECT_NE(errorOf("engine:\n  block_size: 4096\n").find("must be between 1 and 1024"), std::string::npos);
  EXPECT_NE(errorOf("engine:\n  num_blocks: 99999999999\n").find("out of range for a 32-bit integer"),
            std::string::npos);
  EXPECT_NE(errorOf("role: leader\n").find("role: \"leader\" is not one of: prefill, decode, both, router"),
            std::string::npos);
}

TEST(ConfigTest, ReportsEveryErrorAndLeavesOutputUntouchedOnError) {
  EngineOpts o;
  absl::Status s = load("role: leader\nengine:\n  num_blocks: x\n  bogus: 1\n", &o);
  ASSERT_FALSE(s.ok());
  std::string m(s.message());
  EXPECT_NE(m.find("role:"), std::string::npos);
  EXPECT_NE(m.find("engine.num_blocks:"), std::string::npos);
  EXPECT_NE(m.find("engine.bogus: unknown key"), std::string::npos);
  EXPECT_EQ(o.role, "both");
  EXPECT_EQ(o.num_blocks, 100);
}

TEST(ConfigTest, DuplicateKeysAreErrors) {
  EXPECT_NE(errorOf("engine:\n  num_blocks: 1\n  num_blocks: 2\n").find("engine.num_blocks: duplicate key"),
            std::string::npos);
}

TEST(ConfigTest, RequiredKeysAndSectionLists) {
  auto doc = ConfigDoc::fromString("peers:\n  - host: a\n    port: 1\n  - host: b\n  - 7\n", "x.yaml");
  ASSERT_TRUE(doc.ok());
  std::vector<std::pair<std::string, int32_t>> peers;
  for (ConfigMap m : doc->root().sectionList("peers")) {
    std::string host;
    int32_t port = 0;
    m.field("host", &host, {.required = true});
    m.field("port", &port, {.required = true});
    peers.emplace_back(host, port);
  }
  std::string name;
  doc->root().field("name", &name, {.required = true});
  absl::Status s = doc->finish();
  ASSERT_FALSE(s.ok());
  std::string m(s.message());
  EXPECT_NE(m.find("peers[1].port: required key is missing"), std::string::npos) << m;
  EXPECT_NE(m.find("peers[2]: expected a mapping, got \"7\""), std::string::npos) << m;
  EXPECT_NE(m.find("name: required key is missing"), std::string::npos) << m;
  ASSERT_EQ(peers.size(), 2u);
  EXPECT_EQ(peers[0].first, "a");
}

TEST(ConfigTest, CustomCrossFieldErrors) {
  auto doc = ConfigDoc::fromString("min: 5\nmax: 2\n", "x.yaml");
  ASSERT_TRUE(doc.ok());
  int32_t lo = 0, hi = 0;
  doc->root().field("min", &lo);
  doc->root().field("max", &hi);
  if (hi < lo) doc->root().fail("max", "must be >= min");
  absl::Status s = doc->finish();
  EXPECT_EQ(std::string(s.message()), "x.yaml:2:6: max: must be >= min");
}

TEST(ConfigTest, FromFileMissingNamesThePath) {
  auto doc = ConfigDoc::fromFile("/nonexistent/tandem.yaml");
  ASSERT_FALSE(doc.ok());
  EXPECT_NE(std::string(doc.status().message()).find("/nonexistent/tandem.yaml"), std::string::npos);
}

TEST(ConfigTest, FromFileReads) {
  std::string path = ::testing::TempDir() + "/cfg_test.yaml";
  {
    std::ofstream out(path);
    out << "engine:\n  num_blocks: 7\n";
  }
  EngineOpts o;
  auto doc = ConfigDoc::fromFile(path);
  ASSERT_TRUE(doc.ok()) << doc.status();
  doc->root().section("engine").field("num_blocks", &o.num_blocks);
  EXPECT_TRUE(doc->finish().ok());
  EXPECT_EQ(o.num_blocks, 7);
  std::remove(path.c_str());
}

TEST(ParseDurationTest, UnitsAndErrors) {
  EXPECT_EQ(*parseDuration("1.5s"), std::chrono::milliseconds(1500));
  EXPECT_EQ(*parseDuration("5m"), std::chrono::minutes(5));
  EXPECT_EQ(*parseDuration("100us"), std::chrono::microseconds(100));
  EXPECT_EQ(*parseDuration("0"), std::chrono::nanoseconds(0));
  EXPECT_FALSE(parseDuration("").ok());
  EXPECT_FALSE(parseDuration("10").ok());
  EXPECT_FALSE(parseDuration("s").ok());
  EXPECT_FALSE(parseDuration("10d").ok());
  EXPECT_FALSE(parseDuration("-1s").ok());
}

}  // namespace
}  // namespace tandem
