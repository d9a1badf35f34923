#include "src/http/sse.h"

#include <gtest/gtest.h>

#include <random>

namespace tandem::http {
namespace {

std::vector<SseEvent> parseAll(std::string_view bytes) {
  SseParser parser;
  return parser.feed(bytes);
}

// Feeds `bytes` split at the given cut points.
std::vector<SseEvent> parseSplit(std::string_view bytes, const std::vector<size_t>& cuts) {
  SseParser parser;
  std::vector<SseEvent> out;
  size_t start = 0;
  for (size_t cut : cuts) {
    for (auto& e : parser.feed(bytes.substr(start, cut - start))) out.push_back(std::move(e));
    start = cut;
  }
  for (auto& e : parser.feed(bytes.substr(start))) out.push_back(std::move(e));
  return out;
}

SseEvent ev(std::string data, std::string event = "message", std::string id = "") {
  return SseEvent{std::move(event), std::move(data), std::move(id)};
}

TEST(SseParserTest, DataEventsEndAtBlankLines) {
  EXPECT_EQ(parseAll("data: one\n\ndata: two\n\n"), (std::vector<SseEvent>{ev("one"), ev("two")}));
}

TEST(SseParserTest, MultiLineDataIsJoinedWithNewlines) {
  EXPECT_EQ(parseAll("data: a\ndata: b\ndata:\ndata:c\n\n"), (std::vector<SseEvent>{ev("a\nb\n\nc")}));
}

TEST(SseParserTest, OnlyOneLeadingSpaceIsStripped) {
  EXPECT_EQ(parseAll("data:  two spaces\n\n"), (std::vector<SseEvent>{ev(" two spaces")}));
}

TEST(SseParserTest, CommentsAreIgnoredAndCounted) {
  SseParser parser;
  auto events = parser.feed(": keepalive\n\ndata: x\n: in the middle\n\n:\n\n");
  EXPECT_EQ(events, (std::vector<SseEvent>{ev("x")}));
  EXPECT_EQ(parser.numComments(), 3);
}

TEST(SseParserTest, CrLfAndLoneCrEndLines) {
  EXPECT_EQ(parseAll("data: a\r\n\r\ndata: b\r\rdata: c\n\r\n"), (std::vector<SseEvent>{ev("a"), ev("b"), ev("c")}));
}

TEST(SseParserTest, EventTypeAndIdPersistRules) {
  auto events = parseAll("event: delta\nid: 7\ndata: x\n\ndata: y\n\nid\ndata: z\n\n");
  // The type resets after each event; the id persists until changed ("id" alone clears it).
  EXPECT_EQ(events, (std::vector<SseEvent>{ev("x", "delta", "7"), ev("y", "message", "7"), ev("z", "message", "")}));
}

TEST(SseParserTest, EventsWithoutDataAreNotDispatched) {
  EXPECT_TRUE(parseAll("event: ping\n\nid: 3\n\n\n\n").empty());
}

TEST(SseParserTest, UnfinishedEventAtEndIsNotDispatched) {
  EXPECT_TRUE(parseAll("data: partial\n").empty());
  EXPECT_TRUE(parseAll("data: partial").empty());
}

TEST(SseParserTest, FieldWithoutColonAndUnknownFields) {
  EXPECT_EQ(parseAll("data\nfoo: bar\n\n"), (std::vector<SseEvent>{ev("")}));
}

TEST(SseParserTest, RetryIsParsedWhenAllDigits) {
  SseParser parser;
  parser.feed("retry: 1500\n\n");
  EXPECT_EQ(parser.retryMs(), 1500);
  parser.feed("retry: 15x\n\nretry: -3\n\n");
  EXPECT_EQ(parser.retryMs(), 1500);
}

TEST(SseParserTest, LeadingByteOrderMarkIsSkipped) {
  EXPECT_EQ(parseAll("\xEF\xBB\xBF"
                     "data: x\n\n"),
            (std::vector<SseEvent>{ev("x")}));
  EXPECT_EQ(parseSplit("\xEF\xBB\xBF"
                       "data: x\n\n",
                       {1, 2}),
            (std::vector<SseEvent>{ev("x")}));
}

TEST(SseParserTest, CrLfSplitAcrossChunksIsOneLineEnd) {
  // Split between \r and \n: must not produce an extra blank line (which would dispatch early).
  std::string stream = "data: a\r\ndata: b\r\n\r\n";
  EXPECT_EQ(parseSplit(stream, {8}), (std::vector<SseEvent>{ev("a\nb")}));
  EXPECT_EQ(parseSplit(stream, {17, 18, 19}), (std::vector<SseEvent>{ev("a\nb")}));
}

TEST(SseParserTest, EverySplitOfARealisticStreamGivesTheSameEvents) {
  std::string stream =
      ": keepalive\r\n\r\n"
      "data: {\"choices\":[{\"text\":\"h\xC3\xA9llo\"}]}\n\n"
      "event: usage\r\nid: 42\r\ndata: line1\r\ndata: line2\r\n\r\n"
      "data: cr\r\r"
      "data: [DONE]\n\n";
  std::vector<SseEvent> want = {ev("{\"choices\":[{\"text\":\"h\xC3\xA9llo\"}]}"), ev("line1\nline2", "usage", "42"),
                                ev("cr", "message", "42"), ev("[DONE]", "message", "42")};
  ASSERT_EQ(parseAll(stream), want);
  // Every single cut, every pair of cuts: all boundaries, including inside
  // "\r\n" and inside the two-byte UTF-8 character.
  for (size_t i = 0; i <= stream.size(); ++i) {
    ASSERT_EQ(parseSplit(stream, {i}), want) << "cut at " << i;
    for (size_t j = i; j <= stream.size(); ++j) ASSERT_EQ(parseSplit(stream, {i, j}), want) << i << "," << j;
  }
  // Byte by byte.
  std::vector<size_t> all;
  for (size_t i = 1; i < stream.size(); ++i) all.push_back(i);
  EXPECT_EQ(parseSplit(stream, all), want);
  // Random chunkings.
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    std::vector<size_t> cuts;
    for (size_t pos = 0;;) {
      pos += 1 + rng() % 9;
      if (pos >= stream.size()) break;
      cuts.push_back(pos);
    }
    ASSERT_EQ(parseSplit(stream, cuts), want) << "round " << round;
  }
}

TEST(SseFormatTest, FormatsDataEventsAndComments) {
  EXPECT_EQ(formatSseEvent("hello"), "data: hello\n\n");
  EXPECT_EQ(formatSseEvent("a\nb\r\nc"), "data: a\ndata: b\ndata: c\n\n");
  EXPECT_EQ(formatSseEvent("x", "usage", "9"), "event: usage\nid: 9\ndata: x\n\n");
  EXPECT_EQ(formatSseEvent(""), "data: \n\n");
  EXPECT_EQ(formatSseComment("keepalive"), ": keepalive\n\n");
}

TEST(SseFormatTest, FormatThenParseRoundTrips) {
  for (std::string data : {"", "plain", "two\nlines", "trailing\n", "\nleading", " spaced ", "[DONE]"}) {
    auto events = parseAll(formatSseEvent(data));
    ASSERT_EQ(events.size(), 1u) << data;
    EXPECT_EQ(events[0].data, data);
  }
}

}  // namespace
}  // namespace tandem::http
