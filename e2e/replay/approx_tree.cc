#include "e2e/replay/approx_tree.h"

#include <algorithm>

namespace tandem::replay {

ApproxTree::Match ApproxTree::prefixMatch(std::span<const BlockHash> prompt) const {
  Match m;
  const Node* last = nullptr;
  for (BlockHash h : prompt) {
    auto it = nodes_.find(h);
    if (it == nodes_.end()) break;
    last = &it->second;
    ++m.blocks;
  }
  if (last != nullptr) {
    // SGLang takes the first tenant of its node's map (an arbitrary one);
    // the most recently used one, lowest slot on a tie, is deterministic.
    const Holder* best = nullptr;
    for (const Holder& h : last->holders) {
      if (best == nullptr || h.tick > best->tick || (h.tick == best->tick && h.tenant < best->tenant)) best = &h;
    }
    m.tenant = best->tenant;
  }
  return m;
}

void ApproxTree::insert(std::span<const BlockHash> prompt, Tenant tenant, uint64_t tick, int64_t max_blocks) {
  if (tenant >= tenants_.size()) tenants_.resize(tenant + 1);
  TenantState& t = tenants_[tenant];
  for (size_t i = 0; i < prompt.size(); ++i) {
    Node& node = nodes_[prompt[i]];
    node.depth = static_cast<int64_t>(i);
    auto holder =
        std::find_if(node.holders.begin(), node.holders.end(), [&](const Holder& h) { return h.tenant == tenant; });
    if (holder == node.holders.end()) {
      node.holders.push_back({tenant, tick});
    } else {
      t.by_age.erase({holder->tick, -node.depth, prompt[i]});
      holder->tick = tick;
    }
    t.by_age.insert({tick, -node.depth, prompt[i]});
  }
  evict(tenant, max_blocks);
}

int64_t ApproxTree::size(Tenant tenant) const {
  return tenant < tenants_.size() ? static_cast<int64_t>(tenants_[tenant].by_age.size()) : 0;
}

void ApproxTree::evict(Tenant tenant, int64_t max_blocks) {
  TenantState& t = tenants_[tenant];
  while (static_cast<int64_t>(t.by_age.size()) > max_blocks) {
    const BlockHash hash = std::get<2>(*t.by_age.begin());
    t.by_age.erase(t.by_age.begin());
    auto it = nodes_.find(hash);
    std::erase_if(it->second.holders, [&](const Holder& h) { return h.tenant == tenant; });
    if (it->second.holders.empty()) nodes_.erase(it);
  }
}

}  // namespace tandem::replay
