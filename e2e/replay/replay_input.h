#pragma once
// A trace prepared once for every policy of a run: each request's block-hash
// chain and route request, its place in its session, and what stays
// resident after it, plus the unbounded-cache bound on the hit ratio.

#include <cstdint>
#include <vector>

#include "e2e/replay/trace.h"
#include "src/routing/route_request.h"

namespace tandem::replay {

struct ReplayRequest {
  routing::RouteRequest route;  // session, prompt hashes, prompt and output tokens
  double arrival_s = 0;
  int session = -1;  // index of its session; -1 without one
  int turn = 0;      // 0 for a session's first request (and for requests without a session)
  // The hashes of the full blocks of prompt + answer, resident on D after it
  // finishes: the next turn of the session names the answer's blocks; without
  // one (or when the next turn does not extend this one), the prompt's full
  // blocks.
  std::vector<BlockHash> resident;
};

struct ReplayInput {
  std::vector<ReplayRequest> requests;  // in arrival order
  int num_sessions = 0;
  int64_t num_unique_blocks = 0;  // distinct prompt blocks (for --cache-fraction)
  // Hit ratio with one unbounded cache: the share of prompt blocks some
  // earlier request (or an earlier turn's answer) already produced.
  double hit_bound = 0;
};

ReplayInput prepareReplay(const Trace& trace);

}  // namespace tandem::replay
