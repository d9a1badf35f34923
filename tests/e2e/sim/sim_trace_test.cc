#include "e2e/sim/sim_trace.h"

#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tandem::sim {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<replay::Trace> parse(const std::string& text) {
  std::istringstream in(text);
  return parseAzureTrace(in, "t.csv");
}

TEST(SimTraceTest, AzureRowsBecomeRequestsOnTheTracesOwnTimeAxis) {
  auto t = parse(
      "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
      "2023-11-16 18:17:03.9799600,4808,10\r\n"
      "2023-11-16 18:17:04.0319600,600,0\r\n"
      "\n"
      "2023-11-16 18:18:03,512,7\n");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->requests.size(), 3u);
  EXPECT_DOUBLE_EQ(t->requests[0].timestamp_ms, 0);
  EXPECT_NEAR(t->requests[1].timestamp_ms, 52, 1e-6);
  EXPECT_NEAR(t->requests[2].timestamp_ms, 59020.04, 1e-3);
  EXPECT_EQ(t->requests[0].input_length, 4808);
  EXPECT_EQ(t->requests[0].hash_ids.size(), 10u) << "ceil(4808 / 512)";
  EXPECT_EQ(t->requests[1].output_length, 1) << "no generated token is still a request that ends";
  EXPECT_EQ(t->requests[2].hash_ids.size(), 1u);
  // Nothing is shared: the CSV says nothing about prefixes.
  EXPECT_NE(t->requests[1].hash_ids[0], t->requests[0].hash_ids[0]);
}

TEST(SimTraceTest, AzureBadInputNamesTheLineAndColumn) {
  EXPECT_THAT(parse("").status().message(), HasSubstr("t.csv:0: header: the file is empty"));
  EXPECT_THAT(parse("time,in,out\n").status().message(), HasSubstr("t.csv:1: header: expected"));
  const std::string h = "TIMESTAMP,ContextTokens,GeneratedTokens\n";
  EXPECT_THAT(parse(h + "2023-11-16 18:17:03,12\n").status().message(),
              HasSubstr("t.csv:2: row: expected 3 comma-separated columns"));
  EXPECT_THAT(parse(h + "yesterday,12,3\n").status().message(), HasSubstr("t.csv:2: TIMESTAMP: not"));
  EXPECT_THAT(parse(h + "2023-13-16 18:17:03,12,3\n").status().message(), HasSubstr("TIMESTAMP"));
  EXPECT_THAT(parse(h + "2023-11-16 18:17:03,0,3\n").status().message(), HasSubstr("t.csv:2: ContextTokens: must be"));
  EXPECT_THAT(parse(h + "2023-11-16 18:17:03,12,-1\n").status().message(),
              HasSubstr("t.csv:2: GeneratedTokens: must be"));
  EXPECT_THAT(readAzureTrace("/nonexistent.csv").status().message(), HasSubstr("/nonexistent.csv: cannot open"));
}

TEST(SimTraceTest, TheRealAzureCodeTraceReads) {
  auto t = readAzureTrace(std::string(TANDEM_SOURCE_DIR) + "/../shared/traces/azure_llm_2023_code.csv");
  if (!t.ok() && absl::IsNotFound(t.status())) GTEST_SKIP() << "no ../shared/traces here";
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->requests.size(), 8819u);
  EXPECT_GT(t->requests.back().timestamp_ms, 3000e3) << "about an hour";
}

TEST(SimTraceTest, LoadScaleCopiesEachRequestWithItsOwnBlocksAndSession) {
  replay::Trace t;
  t.requests.push_back({.timestamp_ms = 0, .input_length = 1024, .output_length = 5, .hash_ids = {0, 1},
                        .session = SessionId("s")});
  t.requests.push_back({.timestamp_ms = 100, .input_length = 1500, .output_length = 5, .hash_ids = {0, 1, 2},
                        .session = SessionId("s")});
  const replay::Trace x = scaleLoad(t, 3);
  ASSERT_EQ(x.requests.size(), 6u);
  EXPECT_DOUBLE_EQ(x.requests[1].timestamp_ms, 3);
  EXPECT_DOUBLE_EQ(x.requests[2].timestamp_ms, 6);
  EXPECT_EQ(x.requests[1].session->value(), "s#1");
  EXPECT_EQ(x.requests[1].hash_ids, (std::vector<uint64_t>{3, 4})) << "ids moved past the originals'";
  EXPECT_EQ(x.requests[4].hash_ids, (std::vector<uint64_t>{3, 4, 5})) << "a copy's turns still share their prefix";
  EXPECT_EQ(x.requests[4].session->value(), "s#1");
  EXPECT_EQ(scaleLoad(t, 1).requests.size(), 2u);
}

}  // namespace
}  // namespace tandem::sim
