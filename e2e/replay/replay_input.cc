#include "e2e/replay/replay_input.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

namespace tandem::replay {
namespace {

// Whether `next` continues the conversation of `prev`: its prompt holds
// prev's prompt and answer, and begins with prev's full prompt blocks.
bool extends(const TraceRequest& prev, const TraceRequest& next) {
  if (next.input_length < prev.input_length + prev.output_length) return false;
  const size_t full = static_cast<size_t>(prev.input_length / kTraceBlockTokens);
  return std::equal(prev.hash_ids.begin(), prev.hash_ids.begin() + full, next.hash_ids.begin());
}

void fillResident(const Trace& trace, const std::vector<size_t>& turns, std::vector<ReplayRequest>& out) {
  for (size_t k = 0; k < turns.size(); ++k) {
    const TraceRequest& r = trace.requests[turns[k]];
    ReplayRequest& rr = out[turns[k]];
    if (k + 1 < turns.size() && extends(r, trace.requests[turns[k + 1]])) {
      const auto& next = out[turns[k + 1]].route.prompt_hashes;
      const size_t n = static_cast<size_t>((r.input_length + r.output_length) / kTraceBlockTokens);
      rr.resident.assign(next.begin(), next.begin() + n);
    } else {
      const size_t full = static_cast<size_t>(r.input_length / kTraceBlockTokens);
      rr.resident.assign(rr.route.prompt_hashes.begin(), rr.route.prompt_hashes.begin() + full);
    }
  }
}

}  // namespace

ReplayInput prepareReplay(const Trace& trace) {
  ReplayInput in;
  in.requests.resize(trace.requests.size());
  absl::flat_hash_map<SessionId, int> session_index;
  std::vector<std::vector<size_t>> session_turns;
  for (size_t i = 0; i < trace.requests.size(); ++i) {
    const TraceRequest& r = trace.requests[i];
    ReplayRequest& rr = in.requests[i];
    rr.route.session = r.session;
    rr.route.prompt_hashes = chainTraceHashes(r.hash_ids);
    rr.route.prompt_tokens = r.input_length;
    rr.route.expected_output_tokens = r.output_length;
    rr.arrival_s = r.timestamp_ms / 1000;
    if (!r.session) continue;
    auto [it, added] = session_index.try_emplace(*r.session, static_cast<int>(session_turns.size()));
    if (added) session_turns.emplace_back();
    rr.session = it->second;
    rr.turn = static_cast<int>(session_turns[it->second].size());
    session_turns[it->second].push_back(i);
  }
  in.num_sessions = static_cast<int>(session_turns.size());
  for (const std::vector<size_t>& turns : session_turns) fillResident(trace, turns, in.requests);

  absl::flat_hash_set<BlockHash> seen;
  absl::flat_hash_set<BlockHash> prompt_blocks;
  int64_t hits = 0;
  int64_t total = 0;
  for (const ReplayRequest& rr : in.requests) {
    const auto& hashes = rr.route.prompt_hashes;
    size_t k = 0;
    while (k < hashes.size() && seen.contains(hashes[k])) ++k;
    hits += static_cast<int64_t>(k);
    total += static_cast<int64_t>(hashes.size());
    seen.insert(hashes.begin(), hashes.end());
    seen.insert(rr.resident.begin(), rr.resident.end());
    prompt_blocks.insert(hashes.begin(), hashes.end());
  }
  in.num_unique_blocks = static_cast<int64_t>(prompt_blocks.size());
  in.hit_bound = total == 0 ? 0.0 : static_cast<double>(hits) / static_cast<double>(total);
  return in;
}

}  // namespace tandem::replay
