#include "e2e/replay/report.h"

#include <cstdio>

#include "e2e/replay/trace.h"
#include "nlohmann/json.hpp"
#include "src/common/strings.h"

namespace tandem::replay {
namespace {

nlohmann::ordered_json orNull(const std::optional<double>& v) {
  return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json();
}

std::string fixed(double v, int decimals) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

std::string fixedOrDash(const std::optional<double>& v) { return v ? fixed(*v, 3) : "-"; }

std::string padLeft(const std::string& s, size_t width) {
  return s.size() >= width ? s : std::string(width - s.size(), ' ') + s;
}

}  // namespace

std::string resultJson(const ReplayResult& r) {
  // Fields in the documented order (report.h), the policy first.
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  j["policy"] = r.policy;
  j["requests"] = r.requests;
  j["dropped"] = r.dropped;
  j["hit_ratio"] = r.hit_ratio;
  j["hit_bound"] = r.hit_bound;
  j["imbalance"] = r.imbalance;
  j["p50_wait_s"] = r.p50_wait_s;
  j["p99_wait_s"] = r.p99_wait_s;
  j["direct_share"] = orNull(r.direct_share);
  j["min_session_direct_share"] = orNull(r.min_session_direct_share);
  j["cold_workers"] = r.cold_workers;
  j["rejections"] = r.rejections;
  j["migrations"] = r.migrations;
  return j.dump();
}

std::string resultTable(const RunSummary& run, const std::vector<ReplayResult>& results) {
  std::string out = strCat("trace ", run.trace, ": ", run.num_requests, " requests, ", run.num_unique_blocks,
                           " unique blocks; ", run.num_workers, " workers of ", run.cache_blocks_per_worker,
                           " blocks (", run.cache_blocks_per_worker * kTraceBlockTokens, " tokens) each\n");
  const std::vector<std::string> heads = {"policy",     "hit_ratio",  "hit_bound",  "imbalance",
                                          "p50_wait_s", "p99_wait_s", "direct",     "min_session_direct",
                                          "cold",       "rejections", "migrations", "dropped"};
  std::vector<std::vector<std::string>> rows = {heads};
  for (const ReplayResult& r : results) {
    rows.push_back({r.policy, fixed(r.hit_ratio, 3), fixed(r.hit_bound, 3), fixed(r.imbalance, 2),
                    fixed(r.p50_wait_s, 2), fixed(r.p99_wait_s, 2), fixedOrDash(r.direct_share),
                    fixedOrDash(r.min_session_direct_share), strCat(r.cold_workers), strCat(r.rejections),
                    strCat(r.migrations), strCat(r.dropped)});
  }
  std::vector<size_t> width(heads.size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) {
      // The policy name left-aligned, numbers right-aligned.
      out += c == 0 ? row[c] + std::string(width[c] - row[c].size(), ' ') : "  " + padLeft(row[c], width[c]);
    }
    out += '\n';
  }
  return out;
}

}  // namespace tandem::replay
