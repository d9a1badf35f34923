#pragma once
// Small statistics shared by the simulators and benchmarks.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace tandem {

// The nearest-rank percentile of `sorted` (ascending), q in (0, 1]: the
// smallest value at least a q share of the values are at most; 0 for none.
inline double nearestRankSorted(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

// The same of unsorted values (sorted in place).
inline double nearestRank(std::vector<double>& values, double q) {
  std::sort(values.begin(), values.end());
  return nearestRankSorted(values, q);
}

}  // namespace tandem
