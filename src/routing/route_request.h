#pragma once
// What the router knows about a request when it decides where it goes.

#include <cstdint>
#include <optional>
#include <vector>

#include "src/common/ids.h"

namespace tandem::routing {

struct RouteRequest {
  std::optional<SessionId> session;  // the client's conversation (x-session-id), when it names one
  // Hashes of the prompt's full blocks, in order: the block-hash chain
  // (src/common/block_hash.h) rooted at the workers' hash_root, with their block size.
  std::vector<BlockHash> prompt_hashes;
  int64_t prompt_tokens = 0;
  int64_t expected_output_tokens = 0;  // max_tokens, or the router's estimate of it
};

}  // namespace tandem::routing
