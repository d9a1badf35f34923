#pragma once
// Request traces for the replay tool, in the Mooncake format
// (kvcache-ai/Mooncake FAST25-release traces), one JSON object per line:
//
//   {"timestamp": 1500, "input_length": 1100, "output_length": 150,
//    "hash_ids": [0, 1, 7], "session_id": "s42"}
//
//   timestamp      number >= 0   arrival, milliseconds from the trace's start
//   input_length   integer >= 1  prompt tokens
//   output_length  integer >= 1  generated tokens
//   hash_ids       [integer >= 0] one id per 512-token block of the prompt,
//                  ceil(input_length / 512) of them (the last block may be
//                  partial); two requests whose first k ids are equal share
//                  their first k * 512 prompt tokens
//   session_id     string or integer, optional: the conversation the request
//                  is a turn of (absent or null: none). Turns of a session
//                  appear in the file in conversation order.
//
// Other fields are ignored. Blank lines are skipped. Lines need not be sorted
// by timestamp: the reader sorts them stably (so a session's turns keep their
// order among equal timestamps).

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "src/common/ids.h"

namespace tandem::replay {

inline constexpr int kTraceBlockTokens = 512;

struct TraceRequest {
  double timestamp_ms = 0;
  int64_t input_length = 0;
  int64_t output_length = 0;
  std::vector<uint64_t> hash_ids;
  std::optional<SessionId> session;
};

struct Trace {
  std::vector<TraceRequest> requests;  // sorted by timestamp (stable)
};

// Reads a trace file. Errors name the file, the line (1-based) and the field.
[[nodiscard]] absl::StatusOr<Trace> readTrace(const std::string& path);
// The same from a stream; `source` names it in errors.
[[nodiscard]] absl::StatusOr<Trace> parseTrace(std::istream& in, std::string_view source);

// One request as a line of the format (no trailing newline).
std::string formatTraceLine(const TraceRequest& request);

// The request's prompt as a block-hash chain: hash i stands for ids 0..i, so
// two requests get equal hashes exactly where their id prefixes are equal
// (whatever the file's ids mean elsewhere). Never 0.
std::vector<BlockHash> chainTraceHashes(const std::vector<uint64_t>& hash_ids);

}  // namespace tandem::replay
