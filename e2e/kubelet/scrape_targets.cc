#include "e2e/kubelet/scrape_targets.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "src/common/strings.h"

namespace tandem::kubelet {

using nlohmann::json;

json scrapeTargets(const std::vector<json>& pods) {
  std::vector<std::pair<std::string, json>> groups;
  for (const json& p : pods) {
    const json annotations = p.value("/metadata/annotations"_json_pointer, json::object());
    if (annotations.value("prometheus.io/scrape", "") != "true") continue;
    if (p.value("/status/phase"_json_pointer, "") != "Running") continue;
    if (p.contains("/metadata/deletionTimestamp"_json_pointer)) continue;
    const std::string ip = p.value("/status/podIP"_json_pointer, "");
    if (ip.empty()) continue;
    std::string port = annotations.value("prometheus.io/port", "");
    if (port.empty()) {
      for (const json& c : p.value("/spec/containers"_json_pointer, json::array())) {
        for (const json& cp : c.value("ports", json::array())) {
          if (port.empty() && cp.contains("containerPort")) port = std::to_string(cp["containerPort"].get<int64_t>());
        }
      }
    }
    if (port.empty()) continue;
    const std::string ns = p.value("/metadata/namespace"_json_pointer, "default");
    const std::string name = p.value("/metadata/name"_json_pointer, "");
    json labels = {{"namespace", ns}, {"pod", name}};
    if (std::string path = annotations.value("prometheus.io/path", ""); !path.empty()) labels["__metrics_path__"] = path;
    groups.emplace_back(strCat(ns, "/", name), json{{"targets", {strCat(ip, ":", port)}}, {"labels", labels}});
  }
  std::sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  json out = json::array();
  for (auto& [key, g] : groups) out.push_back(std::move(g));
  return out;
}

absl::Status writeScrapeTargets(const std::string& path, const json& targets) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << targets.dump(1) << '\n';
    if (!f) return absl::DataLossError(strCat(tmp, ": write failed"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return absl::DataLossError(strCat(path, ": rename failed"));
  return absl::OkStatus();
}

}  // namespace tandem::kubelet
