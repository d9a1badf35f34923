#pragma once
// Shared plumbing for ./tandem bench <area>: timing and the JSON report
// (DESIGN.md §5b):
//   {"area":…, "machine":{"cores":…}, "results":[{"name":…, "value":…,
//    "unit":…, "reference":…, "ratio":…}]}
// `reference` is a yardstick measured in the same run (memcpy, a bare GEMM,
// ucx_perftest, a baseline policy) so the ratio means something on a noisy
// machine; absolute values alone do not.

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace tandem::bench {

struct Result {
  std::string name;
  double value = 0;
  std::string unit;
  double reference = 0;      // the yardstick's value, same unit
  std::string reference_name;
  // value / reference; for "higher is better" units this is the fraction of
  // the yardstick achieved. Meaningless when reference <= 0 (writeReport
  // then fails the benchmark).
  double ratio() const { return reference == 0 ? 0 : value / reference; }
};

// Runs `fn` `reps` times after one warm-up and returns the median seconds per run.
double medianSeconds(const std::function<void()>& fn, int reps);

// Prints a table to stdout and writes the JSON report. Returns a process exit
// code: non-zero when a result's yardstick measured nothing (reference not
// > 0), which is then written with "ratio": null and named on stderr.
int writeReport(const std::string& area, const std::vector<Result>& results, int argc, char** argv);

}  // namespace tandem::bench
