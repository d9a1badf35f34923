#include "bench/bench_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

namespace tandem::bench {

double medianSeconds(const std::function<void()>& fn, int reps) {
  fn();  // warm-up: page faults, caches
  std::vector<double> t;
  t.reserve(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    auto start = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int writeReport(const std::string& area, const std::vector<Result>& results, int argc, char** argv) {
  std::string out_path;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--out") == 0 && i + 1 < argc) out_path = argv[++i];
  }
  nlohmann::json j;
  j["area"] = area;
  j["machine"]["cores"] = std::thread::hardware_concurrency();
  j["results"] = nlohmann::json::array();
  std::printf("%-34s %14s %-8s %14s %-22s %8s\n", "name", "value", "unit", "reference", "(yardstick)", "ratio");
  int failed = 0;
  for (const auto& r : results) {
    // A yardstick that did not run (0, negative, NaN) makes no ratio: the
    // result is written with "ratio": null and the benchmark fails.
    const bool yardstick_ok = std::isfinite(r.reference) && r.reference > 0;
    std::printf("%-34s %14.3f %-8s %14.3f %-22s %8.3f%s\n", r.name.c_str(), r.value, r.unit.c_str(), r.reference,
                r.reference_name.c_str(), yardstick_ok ? r.ratio() : 0.0, yardstick_ok ? "" : "  YARDSTICK FAILED");
    nlohmann::json row = {{"name", r.name},
                          {"value", r.value},
                          {"unit", r.unit},
                          {"reference", r.reference},
                          {"reference_name", r.reference_name},
                          {"ratio", nullptr}};
    if (yardstick_ok) row["ratio"] = r.ratio();
    j["results"].push_back(std::move(row));
    if (!yardstick_ok) {
      std::fprintf(stderr, "bench %s: result %s has no ratio: its yardstick (%s) measured %g\n", area.c_str(),
                   r.name.c_str(), r.reference_name.c_str(), r.reference);
      ++failed;
    }
  }
  if (!out_path.empty()) {
    std::ofstream f(out_path);
    f << j.dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", out_path.c_str());
      return 1;
    }
    std::printf("wrote %s\n", out_path.c_str());
  }
  if (failed > 0) {
    std::fprintf(stderr, "bench %s FAILED: %d result(s) without a working yardstick\n", area.c_str(), failed);
    return 1;
  }
  return 0;
}

}  // namespace tandem::bench
