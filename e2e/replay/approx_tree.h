#pragma once
// The SGLang router's "approximate tree": per worker, the prompts the router
// itself sent there, as a radix tree shared by all workers (tenants), with
// least-recently-used eviction per tenant once it holds more than a size
// limit. It stands for what each worker probably has cached; it never sees
// the workers' real caches.
//
// SGLang keys the tree by characters of the request text. Here a prompt is a
// block-hash chain (trace.h), where hash i already stands for the prefix of
// blocks 0..i, so the radix tree is a map hash -> tenants and "prefix match"
// walks the chain while some tenant holds the next hash. Sizes are in blocks.
//
// Order of eviction: oldest access first, deepest first among equal ones. An
// access touches the whole path, so a node is never older than its
// descendants of the same tenant and eviction removes leaves first, as
// SGLang's leaf-LRU does. Not thread-safe; one owner.

#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "src/common/ids.h"

namespace tandem::replay {

class ApproxTree {
 public:
  using Tenant = uint32_t;  // a worker slot

  struct Match {
    int64_t blocks = 0;            // leading hashes held by some tenant
    std::optional<Tenant> tenant;  // the most recently used holder of the last of them
  };
  Match prefixMatch(std::span<const BlockHash> prompt) const;

  // Records that `tenant` was sent `prompt` at logical time `tick` (which
  // increases from call to call), then evicts that tenant's oldest blocks
  // while it holds more than `max_blocks`.
  void insert(std::span<const BlockHash> prompt, Tenant tenant, uint64_t tick, int64_t max_blocks);

  // Blocks held by `tenant`.
  int64_t size(Tenant tenant) const;

 private:
  struct Holder {
    Tenant tenant;
    uint64_t tick;
  };
  struct Node {
    int64_t depth = 0;
    std::vector<Holder> holders;  // few: one per worker that was sent this prefix
  };
  // (tick, -depth, hash): begin() is the tenant's next victim.
  using AgeKey = std::tuple<uint64_t, int64_t, BlockHash>;
  struct TenantState {
    std::set<AgeKey> by_age;
  };

  void evict(Tenant tenant, int64_t max_blocks);

  absl::flat_hash_map<BlockHash, Node> nodes_;
  std::vector<TenantState> tenants_;  // by tenant
};

}  // namespace tandem::replay
