#pragma once
// Agentic coding sessions as a trace (trace.h's format, with session_id),
// shaped after the DualPath paper's trajectory statistics
// (../shared/traces/README.md):
//
//   shape  max len  turns  append/turn  gen/turn
//   32K    32,768     60       608        148
//   48K    49,152    106       474        172
//   64K    65,536    157       429        176
//
// Every session starts with the same system prompt (shared blocks), then
// each turn appends a user/tool message and the model answers; the next turn's
// prompt is the whole conversation so far plus its append. A session ends
// after its number of turns (uniform in [turns/2, 3*turns/2]) or when the
// next turn would pass the shape's max len, whichever comes first. Appends
// and answers are log-normal around the table's means.
//
// Time: a session's next turn arrives when its answer would have streamed
// (gen / decode_tokens_per_s) plus a tool time (min_tool_s plus an
// exponential part, mean tool_time_s in all). Sessions start staggered so
// that about `active_sessions` run at once: the stagger is the mean session
// duration / active_sessions.
//
// Block ids: a full 512-token block keeps its id from the turn it filled on;
// a trailing partial block gets a fresh id every turn (its content changes).
// Deterministic: the same options give the same trace, byte for byte.

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "e2e/replay/trace.h"

namespace tandem::replay {

struct SessionShape {
  std::string_view name;
  int64_t max_len_tokens;
  double mean_turns;
  double mean_append_tokens;
  double mean_gen_tokens;
};

// The DualPath shape by name ("32K", "48K", "64K"), or nullopt.
std::optional<SessionShape> findSessionShape(std::string_view name);

struct GeneratorOptions {
  int num_sessions = 52;
  SessionShape shape = *findSessionShape("32K");
  uint64_t seed = 1;
  int64_t system_prompt_tokens = 4096;  // shared by every session
  double active_sessions = 24;          // about this many sessions at once
  double tool_time_s = 10;              // mean time between an answer and the next turn
  double min_tool_time_s = 2;           // ... of which at least this much
  double decode_tokens_per_s = 50;      // how fast an answer streams, to space turns
};

[[nodiscard]] absl::StatusOr<Trace> generateSessions(const GeneratorOptions& options);

// Writes the trace in its file format, one line per request.
void writeTrace(const Trace& trace, std::ostream& out);

}  // namespace tandem::replay
