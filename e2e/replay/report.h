#pragma once
// tandem-replay's output: one JSON object per policy (--json, one per line)
// or a table for people.
//
// JSON fields: policy, requests, dropped, hit_ratio, hit_bound, imbalance,
// p50_wait_s, p99_wait_s, direct_share, min_session_direct_share (null when
// the trace has no turn >= 1), cold_workers, rejections, migrations
// (meanings: replay.h, ReplayResult).

#include <cstdint>
#include <string>
#include <vector>

#include "e2e/replay/replay.h"

namespace tandem::replay {

// What the table's heading says about the run.
struct RunSummary {
  std::string trace;
  int64_t num_requests = 0;
  int64_t num_unique_blocks = 0;
  int num_workers = 0;
  int64_t cache_blocks_per_worker = 0;
};

std::string resultJson(const ReplayResult& result);  // one line, no newline
std::string resultTable(const RunSummary& run, const std::vector<ReplayResult>& results);

}  // namespace tandem::replay
