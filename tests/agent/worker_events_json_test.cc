// The worker-state stream's JSON codec: every message survives a round trip
// exactly, and bad input is refused naming the field.

#include "agent/worker_events_json.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tandem::agent {
namespace {

using routing::WorkerDelta;
using routing::WorkerSnapshot;

WorkerSnapshot sampleSnapshot() {
  WorkerSnapshot s{.epoch = 0xfedcba9876543210ULL,
                   .seq = 41,
                   .worker = "agent-\"0\"",
                   .role = routing::WorkerRole::kDecode,
                   .block_size = 16,
                   .hash_root = BlockHash(0x74616e64656d2e31ULL),
                   .max_context_tokens = 16384,
                   .load = {.free_blocks = 500,
                            .total_blocks = 512,
                            .running = 1,
                            .waiting = 2,
                            .waiting_prompt_tokens = 300,
                            .draining = true}};
  s.cached = {BlockHash(1), BlockHash(0xffffffffffffffffULL)};
  s.sessions.push_back({.session = SessionId("s1"), .hashes = {BlockHash(7), BlockHash(8)}, .num_tokens = 40});
  return s;
}

TEST(WorkerEventsJsonTest, SnapshotRoundTripsExactly) {
  const WorkerSnapshot s = sampleSnapshot();
  auto decoded = decodeWorkerEvent(encodeWorkerSnapshot(s));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  const auto* got = std::get_if<WorkerSnapshot>(&*decoded);
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->epoch, s.epoch);
  EXPECT_EQ(got->seq, s.seq);
  EXPECT_EQ(got->worker, s.worker);
  EXPECT_EQ(got->role, s.role);
  EXPECT_EQ(got->block_size, s.block_size);
  EXPECT_EQ(got->hash_root, s.hash_root);
  EXPECT_EQ(got->max_context_tokens, s.max_context_tokens);
  EXPECT_EQ(got->load, s.load);
  EXPECT_EQ(got->cached, s.cached);
  ASSERT_EQ(got->sessions.size(), 1u);
  EXPECT_EQ(got->sessions[0].session, SessionId("s1"));
  EXPECT_EQ(got->sessions[0].hashes, s.sessions[0].hashes);
  EXPECT_EQ(got->sessions[0].num_tokens, 40);
}

TEST(WorkerEventsJsonTest, EveryDeltaRoundTripsExactly) {
  const std::vector<routing::WorkerDeltaBody> bodies = {
      routing::BlocksStored{{BlockHash(1), BlockHash(2)}},
      routing::BlocksRemoved{{BlockHash(0x8000000000000000ULL)}},
      routing::SessionStored{{.session = SessionId("a b"), .hashes = {BlockHash(3)}, .num_tokens = 17}},
      routing::SessionRemoved{SessionId("a b")},
      routing::WorkerLoad{.free_blocks = 1, .total_blocks = 2, .running = 3, .waiting = 4, .waiting_prompt_tokens = 5},
  };
  uint64_t seq = 9;
  for (const auto& body : bodies) {
    const WorkerDelta d{.epoch = 77, .seq = ++seq, .body = body};
    const std::string wire = encodeWorkerDelta(d);
    auto decoded = decodeWorkerEvent(wire);
    ASSERT_TRUE(decoded.ok()) << decoded.status() << " in " << wire;
    const auto* got = std::get_if<WorkerDelta>(&*decoded);
    ASSERT_NE(got, nullptr) << wire;
    EXPECT_EQ(got->epoch, 77u);
    EXPECT_EQ(got->seq, seq);
    ASSERT_EQ(got->body.index(), body.index()) << wire;
    // Re-encoding the decoded delta gives the same bytes: nothing was lost.
    EXPECT_EQ(encodeWorkerDelta(*got), wire);
  }
}

TEST(WorkerEventsJsonTest, HeartbeatRoundTrips) {
  auto decoded = decodeWorkerEvent(encodeWorkerHeartbeat({.epoch = 5, .seq = 12}));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(std::get<WorkerHeartbeat>(*decoded), (WorkerHeartbeat{.epoch = 5, .seq = 12}));
}

TEST(WorkerEventsJsonTest, HashesAndEpochAreSixteenHexDigits) {
  const std::string wire =
      encodeWorkerDelta({.epoch = 0xabc, .seq = 1, .body = routing::BlocksStored{{BlockHash(0x74616e64656d2e31ULL)}}});
  EXPECT_THAT(wire, ::testing::HasSubstr("\"epoch\":\"0000000000000abc\""));
  EXPECT_THAT(wire, ::testing::HasSubstr("\"hashes\":[\"74616e64656d2e31\"]"));
  EXPECT_THAT(wire, ::testing::HasSubstr("\"type\":\"blocks_stored\""));
}

// Each bad message is refused with an error naming the field at fault.
TEST(WorkerEventsJsonTest, BadInputNamesTheField) {
  const std::string epoch = "\"epoch\":\"0000000000000001\"";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", "not valid JSON"},
      {"[1]", "expected an object"},
      {"{" + epoch + ",\"seq\":1}", "'type': missing"},
      {"{\"type\":\"load\",\"epoch\":1,\"seq\":1}", "'epoch': expected 16 hex digits in a string"},
      {"{\"type\":\"load\",\"epoch\":\"xyz\",\"seq\":1}", "'epoch': expected 16 hex digits"},
      {"{\"type\":\"load\"," + epoch + ",\"seq\":-1}", "'seq': must not be negative"},
      {"{\"type\":\"bogus\"," + epoch + ",\"seq\":1}", "'type': unknown message type \"bogus\""},
      {"{\"type\":\"load\"," + epoch + ",\"seq\":1,\"load\":{\"free_blocks\":1,\"total_blocks\":1,\"running\":\"2\"}}",
       "'load.running': expected an integer, got a string"},
      {"{\"type\":\"blocks_stored\"," + epoch + ",\"seq\":1,\"hashes\":[\"0000000000000001\",\"12\"]}",
       "'hashes[1]': expected 16 hex digits"},
      {"{\"type\":\"session_stored\"," + epoch + ",\"seq\":1,\"session\":\"s\",\"num_tokens\":1.5,\"hashes\":[]}",
       "'num_tokens': expected an integer, got a fractional number"},
      {"{\"type\":\"heartbeat\"," + epoch + "}", "'seq': missing"},
  };
  for (const auto& [text, want] : cases) {
    auto decoded = decodeWorkerEvent(text);
    ASSERT_FALSE(decoded.ok()) << text;
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(std::string(decoded.status().message()), ::testing::HasSubstr(want)) << text;
  }
}

TEST(WorkerEventsJsonTest, SnapshotFieldErrorsNameTheSession) {
  std::string wire = encodeWorkerSnapshot(sampleSnapshot());
  const std::string good = "\"num_tokens\":40";
  wire.replace(wire.find(good), good.size(), "\"num_tokens\":\"40\"");
  auto decoded = decodeWorkerEvent(wire);
  ASSERT_FALSE(decoded.ok());
  EXPECT_THAT(std::string(decoded.status().message()), ::testing::HasSubstr("'sessions[0].num_tokens'"));
}

}  // namespace
}  // namespace tandem::agent
