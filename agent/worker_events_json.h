#pragma once
// The JSON form of the worker-state stream's messages (GET
// /internal/v1/events; docs/routing.md, "Worker state stream", is the
// reference). One message is one JSON object with a "type", the worker's
// "epoch" and a "seq":
//
//   {"type":"snapshot","epoch":"<hex16>","seq":41,"worker":"agent-0","role":"decode",
//    "block_size":16,"hash_root":"<hex16>","max_context_tokens":16384,
//    "load":{"free_blocks":500,"total_blocks":512,"running":1,"waiting":0,
//            "waiting_prompt_tokens":0,"draining":false},
//    "cached":["<hex16>",...],
//    "sessions":[{"session":"s1","num_tokens":70,"hashes":["<hex16>",...]}]}
//   {"type":"blocks_stored","epoch":..,"seq":42,"hashes":[...]}
//   {"type":"blocks_removed","epoch":..,"seq":43,"hashes":[...]}
//   {"type":"session_stored","epoch":..,"seq":44,"session":"s1","num_tokens":70,"hashes":[...]}
//   {"type":"session_removed","epoch":..,"seq":45,"session":"s1"}
//   {"type":"load","epoch":..,"seq":46,"load":{...as in the snapshot}}
//   {"type":"heartbeat","epoch":..,"seq":46}
//
// Hashes and the epoch are 64-bit values written as 16 lowercase hex digits
// (exact in every JSON library, unlike numbers above 2^53). A heartbeat is
// not a delta: its seq is the last delta the stream carried.
//
// Encode and decode are the one definition the worker and its subscribers
// (and tests) share. Pure functions; thread-safe.

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "absl/status/statusor.h"
#include "src/routing/worker_state.h"

namespace tandem::agent {

// "The stream is alive and you have everything up to seq" (sent on an idle stream).
struct WorkerHeartbeat {
  uint64_t epoch = 0;
  uint64_t seq = 0;
  friend bool operator==(const WorkerHeartbeat&, const WorkerHeartbeat&) = default;
};

using WorkerEvent = std::variant<routing::WorkerSnapshot, routing::WorkerDelta, WorkerHeartbeat>;

std::string encodeWorkerSnapshot(const routing::WorkerSnapshot& snapshot);
std::string encodeWorkerDelta(const routing::WorkerDelta& delta);
std::string encodeWorkerHeartbeat(const WorkerHeartbeat& heartbeat);

// Parses one message. InvalidArgument naming the field and what is wrong
// with it ("worker event field 'load.running': expected an integer, got a
// string") for anything that is not a message of the format above.
absl::StatusOr<WorkerEvent> decodeWorkerEvent(std::string_view text);

// "prefill", "decode", "both".
std::string_view workerRoleName(routing::WorkerRole role);

}  // namespace tandem::agent
