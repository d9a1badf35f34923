#include "e2e/sim/sim_cli.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace tandem::sim {
namespace {

using ::testing::HasSubstr;

absl::Status parseError(const std::vector<std::string>& args) { return parseSimCommand(args).status(); }

TEST(SimCliTest, BadCommandLinesSayWhatIsWrong) {
  EXPECT_THAT(parseError({"--gpus", "8", "--policy", "tandem"}).message(), HasSubstr("--trace FILE is required"));
  EXPECT_THAT(parseError({"--trace", "t", "--policy", "tandem"}).message(), HasSubstr("--gpus N is required"));
  EXPECT_THAT(parseError({"--trace", "t", "--gpus", "8"}).message(), HasSubstr("--policy NAME[,NAME...] is required"));
  EXPECT_THAT(parseError({"--trace", "t", "--gpus", "8", "--policy", "magic"}).message(),
              HasSubstr("unknown policy 'magic'"));
  EXPECT_THAT(parseError({"--trace", "t", "--gpus", "8", "--policy", "static:0:3"}).message(),
              HasSubstr("unknown policy 'static:0:3'"));
  EXPECT_THAT(parseError({"--trace", "t", "--gpus", "8", "--policy", "static:4:6"}).message(),
              HasSubstr("needs 10 GPUs; --gpus is 8"));
  EXPECT_THAT(parseError({"--trace", "t", "--gpus", "8", "--policy", "tandem,tandem"}).message(),
              HasSubstr("names tandem twice"));
  EXPECT_THAT(parseError({"--trace", "t", "--gpus", "1", "--policy", "tandem"}).message(), HasSubstr("--gpus must be >= 2"));
  EXPECT_THAT(parseError({"--trace", "t", "--gpus", "8", "--policy", "tandem", "--format", "csv"}).message(),
              HasSubstr("--format must be mooncake or azure"));
  EXPECT_THAT(parseError({"--trace", "t", "--gpus", "8", "--policy", "tandem", "--initial", "3"}).message(),
              HasSubstr("--initial must be P:D"));
  EXPECT_THAT(parseError({"--trace", "t", "--gpus", "8", "--policy", "tandem", "--startup-s", "-1"}).message(),
              HasSubstr("--startup-s must be >= 0"));
  EXPECT_TRUE(parseSimCommand({"--help"})->help);
}

TEST(SimCliTest, RunsEveryPolicyOnATraceFileAndPrintsOneJsonObjectEach) {
  const std::string path = ::testing::TempDir() + "/sim_cli_trace.jsonl";
  {
    std::ofstream f(path);
    for (int i = 0; i < 400; ++i) {
      f << R"({"timestamp": )" << i * 250 << R"(, "input_length": 1500, "output_length": 20, "hash_ids": [)"
        << 3 * i << ", " << 3 * i + 1 << ", " << 3 * i + 2 << "]}\n";
    }
  }
  auto c = parseSimCommand({"--trace", path, "--gpus", "6", "--policy", "static:1:1,static-best,interval,tandem",
                            "--json", "--load-scale", "2", "--startup-s", "20"});
  ASSERT_TRUE(c.ok()) << c.status();
  std::ostringstream out;
  ASSERT_TRUE(runSimCommand(*c, out).ok());
  std::istringstream lines(out.str());
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(lines, line);) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 4u) << out.str();
  EXPECT_EQ(rows[0]["policy"], "static:1:1");
  EXPECT_EQ(rows[1]["policy"], "static-best");
  EXPECT_TRUE(rows[1].contains("size"));
  EXPECT_EQ(rows[2]["policy"], "interval");
  EXPECT_EQ(rows[3]["policy"], "tandem");
  for (const auto& r : rows) {
    for (const char* k : {"slo_attainment", "goodput", "gpu_hours", "actions", "reversals", "p95_ttft_s", "p95_tpot_s"}) {
      EXPECT_TRUE(r.contains(k)) << k << " in " << r.dump();
    }
    EXPECT_EQ(r["requests"], 800) << "--load-scale 2";
  }
  // A trace that does not parse is an error naming it.
  auto bad = parseSimCommand({"--trace", "/nonexistent.jsonl", "--gpus", "4", "--policy", "tandem"});
  ASSERT_TRUE(bad.ok());
  std::ostringstream ignored;
  EXPECT_THAT(runSimCommand(*bad, ignored).message(), HasSubstr("/nonexistent.jsonl"));
}

}  // namespace
}  // namespace tandem::sim
