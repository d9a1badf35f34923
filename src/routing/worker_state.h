#pragma once
// What a worker (a prefill or decode agent) tells routers about itself, as
// plain values: the contract between the worker-state stream
// (`GET /internal/v1/events`, docs/routing.md) and the routing policy.
//
// A stream is one snapshot followed by deltas. Every message carries the
// worker's `epoch` (chosen at random when the worker starts) and a sequence
// number: the snapshot has `seq` = the last delta it already contains, and
// each delta has seq = previous + 1. A subscriber that sees another epoch or
// a gap in `seq` (or reconnects) discards what it knew and takes a fresh
// snapshot: recovery costs one snapshot, never a replay of history.
//
// Block hashes are the engine's own block-hash chain (src/common/block_hash.h)
// rooted at `hash_root`, so a router computes the same values from a prompt's
// tokens by construction.
//
// Plain data, no I/O; the JSON codec lives with the stream
// (agent/worker_events_json.h).

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "src/common/ids.h"

namespace tandem::routing {

enum class WorkerRole : uint8_t { kPrefill, kDecode, kBoth };

// Load as the worker's engine sees it now.
struct WorkerLoad {
  int64_t free_blocks = 0;   // available now: free plus evictable cached
  int64_t total_blocks = 0;  // the KV pool's size
  int64_t running = 0;       // requests in the running batch
  int64_t waiting = 0;       // requests queued for admission
  int64_t waiting_prompt_tokens = 0;  // uncached prompt tokens of the waiting requests
  bool draining = false;     // stopping: takes no new work
  friend bool operator==(const WorkerLoad&, const WorkerLoad&) = default;
};

// A session's resident KV on a decode worker: the hashes of its full blocks,
// in order (a prefix of the conversation's chain).
struct ResidentSessionBlocks {
  SessionId session;
  std::vector<BlockHash> hashes;
  int64_t num_tokens = 0;  // tokens resident (the last block may be partial)
};

struct WorkerSnapshot {
  uint64_t epoch = 0;
  uint64_t seq = 0;
  std::string worker;  // the worker's name (its pod name on a cluster)
  // Its KV listener HOST:PORT as peers reach it (prefill workers: what a
  // router names to D in its decision); "" when it has none (role both).
  std::string kv_address;
  WorkerRole role = WorkerRole::kDecode;
  int block_size = 0;            // tokens per KV block
  BlockHash hash_root{0};        // the chain's root: model fingerprint and tenant salt
  int64_t max_context_tokens = 0;  // the longest prompt + output it accepts
  WorkerLoad load;
  std::vector<BlockHash> cached;                   // prefix-cache blocks (content known, any holder)
  std::vector<ResidentSessionBlocks> sessions;     // decode: sessions resident now
};

// Deltas. Stored/removed refer to the prefix cache (a block whose content
// became known / was forgotten); session events to residency on D.
struct BlocksStored {
  std::vector<BlockHash> hashes;
};
struct BlocksRemoved {
  std::vector<BlockHash> hashes;
};
struct SessionStored {  // made (or replaced) resident
  ResidentSessionBlocks state;
};
struct SessionRemoved {  // evicted, dropped, or taken by a new turn
  SessionId session;
};
using WorkerDeltaBody = std::variant<BlocksStored, BlocksRemoved, SessionStored, SessionRemoved, WorkerLoad>;

struct WorkerDelta {
  uint64_t epoch = 0;
  uint64_t seq = 0;
  WorkerDeltaBody body;
};

}  // namespace tandem::routing
