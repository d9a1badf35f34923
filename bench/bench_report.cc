#include "bench/bench_report.h"

#include <algorithm>
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
  for (const auto& r : results) {
    std::printf("%-34s %14.3f %-8s %14.3f %-22s %8.3f\n", r.name.c_str(), r.value, r.unit.c_str(), r.reference,
                r.reference_name.c_str(), r.ratio());
    j["results"].push_back({{"name", r.name},
                            {"value", r.value},
                            {"unit", r.unit},
                            {"reference", r.reference},
                            {"reference_name", r.reference_name},
                            {"ratio", r.ratio()}});
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
  return 0;
}

}  // namespace tandem::bench
