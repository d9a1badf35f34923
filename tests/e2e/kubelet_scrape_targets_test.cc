#include "e2e/kubelet/scrape_targets.h"

#include <fstream>

#include <gtest/gtest.h>

namespace tandem::kubelet {
namespace {

using nlohmann::json;

json pod(const std::string& name, const std::string& phase, const std::string& ip, json annotations) {
  return {{"metadata", {{"name", name}, {"namespace", "default"}, {"annotations", annotations}}},
          {"spec", {{"containers", {{{"name", "agent"}, {"ports", {{{"containerPort", 8100}}}}}}}}},
          {"status", {{"phase", phase}, {"podIP", ip}}}};
}

TEST(ScrapeTargetsTest, RunningAnnotatedPodsAreTargetsLabelledWithTheirNames) {
  const json scrape = {{"prometheus.io/scrape", "true"}};
  std::vector<json> pods = {
      pod("b-decode", "Running", "10.244.0.3", {{"prometheus.io/scrape", "true"}, {"prometheus.io/port", "8000"}}),
      pod("a-prefill", "Running", "10.244.0.2", scrape),
      pod("c-pending", "Pending", "", scrape),
      pod("d-quiet", "Running", "10.244.0.4", json::object()),
      pod("e-going", "Running", "10.244.0.5", {{"prometheus.io/scrape", "true"}, {"prometheus.io/path", "/m"}}),
  };
  pods.back()["metadata"]["deletionTimestamp"] = "2026-11-26T00:00:00Z";
  pods.push_back(pod("f-path", "Running", "10.244.0.6", {{"prometheus.io/scrape", "true"}, {"prometheus.io/path", "/m"}}));
  const json t = scrapeTargets(pods);
  ASSERT_EQ(t.size(), 3u) << t.dump();
  EXPECT_EQ(t[0]["targets"][0], "10.244.0.2:8100") << "the first container port";
  EXPECT_EQ(t[0]["labels"]["pod"], "a-prefill");
  EXPECT_EQ(t[0]["labels"]["namespace"], "default");
  EXPECT_EQ(t[1]["targets"][0], "10.244.0.3:8000") << "prometheus.io/port";
  EXPECT_EQ(t[2]["labels"]["__metrics_path__"], "/m");
  EXPECT_EQ(scrapeTargets(pods), t) << "deterministic";

  const std::string path = ::testing::TempDir() + "/scrape-targets.json";
  ASSERT_TRUE(writeScrapeTargets(path, t).ok());
  std::ifstream in(path);
  EXPECT_EQ(json::parse(in), t);
  EXPECT_FALSE(writeScrapeTargets("/nonexistent-dir/x.json", t).ok());
}

}  // namespace
}  // namespace tandem::kubelet
