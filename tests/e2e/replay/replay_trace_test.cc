// The trace reader: good lines, and a clear error (file:line, field) for
// every kind of bad input.

#include "e2e/replay/trace.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "src/common/strings.h"

namespace tandem::replay {
namespace {

absl::StatusOr<Trace> parse(const std::string& text) {
  std::istringstream in(text);
  return parseTrace(in, "t.jsonl");
}

// The error for a trace whose second line is `bad` (the first is good).
std::string errorOnLine2(const std::string& bad) {
  absl::StatusOr<Trace> t =
      parse("{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [0]}\n" + bad + "\n");
  EXPECT_FALSE(t.ok()) << bad;
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(toStd(t.status().message()));
}

TEST(TraceTest, ReadsMooncakeLinesWithAndWithoutSessions) {
  absl::StatusOr<Trace> t = parse(
      "{\"timestamp\": 1500, \"input_length\": 1100, \"output_length\": 150, \"hash_ids\": [0, 1, 7]}\n"
      "\n"
      "{\"timestamp\": 2000.5, \"input_length\": 512, \"output_length\": 3, \"hash_ids\": [9], \"session_id\": \"a\"}\n"
      "{\"timestamp\": 2500, \"input_length\": 513, \"output_length\": 3, \"hash_ids\": [9, 10], \"session_id\": 42,"
      " \"extra\": true}\n");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->requests.size(), 3u);
  EXPECT_EQ(t->requests[0].timestamp_ms, 1500);
  EXPECT_EQ(t->requests[0].input_length, 1100);
  EXPECT_EQ(t->requests[0].output_length, 150);
  EXPECT_EQ(t->requests[0].hash_ids, (std::vector<uint64_t>{0, 1, 7}));
  EXPECT_FALSE(t->requests[0].session.has_value());
  EXPECT_EQ(t->requests[1].timestamp_ms, 2000.5);
  EXPECT_EQ(t->requests[1].session, SessionId("a"));
  EXPECT_EQ(t->requests[2].session, SessionId("42"));
}

TEST(TraceTest, SortsByTimestampKeepingLineOrderOnTies) {
  absl::StatusOr<Trace> t = parse(
      "{\"timestamp\": 9, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n"
      "{\"timestamp\": 5, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [2]}\n"
      "{\"timestamp\": 5, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [3]}\n");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->requests[0].hash_ids[0], 2u);
  EXPECT_EQ(t->requests[1].hash_ids[0], 3u);
  EXPECT_EQ(t->requests[2].hash_ids[0], 1u);
}

TEST(TraceTest, BadLinesNameFileLineAndField) {
  struct Case {
    std::string line;
    std::string expected;  // a part of the message
  };
  const std::string ok_rest = "\"output_length\": 1, \"hash_ids\": [0]";
  const std::vector<Case> cases = {
      {"{not json", "t.jsonl:2: not valid JSON"},
      {"[1, 2]", "t.jsonl:2: not a JSON object"},
      {"{\"input_length\": 10, " + ok_rest + "}", "t.jsonl:2: field `timestamp`: missing"},
      {"{\"timestamp\": \"now\", \"input_length\": 10, " + ok_rest + "}", "field `timestamp`: must be a number"},
      {"{\"timestamp\": -1, \"input_length\": 10, " + ok_rest + "}", "field `timestamp`: must be >= 0"},
      {"{\"timestamp\": 0, " + ok_rest + "}", "t.jsonl:2: field `input_length`: missing"},
      {"{\"timestamp\": 0, \"input_length\": 1.5, " + ok_rest + "}", "field `input_length`: must be an integer"},
      {"{\"timestamp\": 0, \"input_length\": 0, " + ok_rest + "}", "field `input_length`: must be between 1"},
      {"{\"timestamp\": 0, \"input_length\": -3, " + ok_rest + "}", "field `input_length`: must be between 1"},
      {"{\"timestamp\": 0, \"input_length\": 10, \"hash_ids\": [0]}", "field `output_length`: missing"},
      {"{\"timestamp\": 0, \"input_length\": 10, \"output_length\": \"x\", \"hash_ids\": [0]}",
       "field `output_length`: must be an integer"},
      {"{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1}", "field `hash_ids`: missing"},
      {"{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": 5}",
       "field `hash_ids`: must be an array"},
      {"{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [-1]}",
       "field `hash_ids`: element 0 must be an integer >= 0"},
      {"{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [0, \"a\"]}",
       "field `hash_ids`: element 1 must be an integer >= 0"},
      {"{\"timestamp\": 0, \"input_length\": 1025, \"output_length\": 1, \"hash_ids\": [0, 1]}",
       "field `hash_ids`: has 2 ids, but input_length 1025 needs 3"},
      {"{\"timestamp\": 0, \"input_length\": 10, " + ok_rest + ", \"session_id\": [1]}",
       "field `session_id`: must be a string or an integer"},
      {"{\"timestamp\": 0, \"input_length\": 10, " + ok_rest + ", \"session_id\": \"\"}",
       "field `session_id`: must not be empty"},
  };
  for (const Case& c : cases) {
    const std::string message = errorOnLine2(c.line);
    EXPECT_NE(message.find("t.jsonl:2: "), std::string::npos) << message;
    EXPECT_NE(message.find(c.expected), std::string::npos) << "line: " << c.line << "\nmessage: " << message;
  }
}

TEST(TraceTest, EmptyAndMissingFilesAreErrors) {
  absl::StatusOr<Trace> empty = parse("\n  \n");
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(toStd(empty.status().message()), "t.jsonl: no requests");
  absl::StatusOr<Trace> missing = readTrace("/nonexistent/trace.jsonl");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(toStd(missing.status().message()).find("/nonexistent/trace.jsonl: cannot open"), std::string::npos);
}

TEST(TraceTest, FormatRoundTrips) {
  TraceRequest r{
      .timestamp_ms = 1234, .input_length = 600, .output_length = 7, .hash_ids = {3, 4}, .session = SessionId("s1")};
  EXPECT_EQ(formatTraceLine(r),
            "{\"timestamp\":1234,\"input_length\":600,\"output_length\":7,\"hash_ids\":[3,4],\"session_id\":\"s1\"}");
  absl::StatusOr<Trace> back = parse(formatTraceLine(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->requests[0].hash_ids, r.hash_ids);
  EXPECT_EQ(back->requests[0].session, r.session);
}

TEST(TraceTest, ChainedHashesStandForTheWholeIdPrefix) {
  const std::vector<BlockHash> a = chainTraceHashes({1, 2, 3});
  const std::vector<BlockHash> b = chainTraceHashes({1, 2, 4});
  const std::vector<BlockHash> c = chainTraceHashes({5, 2, 3});
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a[0], b[0]);
  EXPECT_EQ(a[1], b[1]);
  EXPECT_NE(a[2], b[2]);
  // The same id after another prefix is another block.
  EXPECT_NE(a[1], c[1]);
  EXPECT_NE(a[2], c[2]);
  for (BlockHash h : a) EXPECT_NE(h.value(), 0u);
}

// The public Mooncake trace, where the checkout has it next to the repo
// (../shared/traces, README there): every line parses.
TEST(TraceTest, ReadsTheMooncakeSyntheticTrace) {
  const std::string path = std::string(TANDEM_SOURCE_DIR) + "/../shared/traces/mooncake_synthetic_trace.jsonl";
  if (!std::ifstream(path)) GTEST_SKIP() << path << " is not here";
  absl::StatusOr<Trace> t = readTrace(path);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->requests.size(), 3993u);
}

}  // namespace
}  // namespace tandem::replay
