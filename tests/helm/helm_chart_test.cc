// The chart as Helm sees it, without a cluster (label deploy): `helm lint
// --strict` and `helm template` with the default values and each example
// values file, what the rendered objects say (the operator's pod hardening,
// leader election, RBAC, dashboards and rules taken from dashboards/), and
// values that break values.schema.json refused naming the field.

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <algorithm>
#include <sys/wait.h>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "e2e/apiserver/json_util.h"
#include "tests/testing/command.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using nlohmann::json;

using Shell = testutil::CommandResult;

// A command line's status and its standard output and error together.
Shell shell(const std::string& command) { return testutil::runCommand(command + " 2>&1"); }

const std::string kSource = TANDEM_SOURCE_DIR;
const std::string kChart = kSource + "/helm/tandem";

class HelmChartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    helm_ = std::getenv("TANDEM_HELM") != nullptr ? std::getenv("TANDEM_HELM") : "";
    ASSERT_TRUE(std::filesystem::exists(helm_))
        << "no helm at TANDEM_HELM=\"" << helm_ << "\": ./tandem setup installs it (tests/tools/bin/helm)";
    char tmpl[] = "/tmp/tandem-helm-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // helm with its caches and config in the test's directory.
  Shell helm(const std::string& args) {
    return shell("HELM_CACHE_HOME=" + dir_ + "/cache HELM_CONFIG_HOME=" + dir_ + "/config HELM_DATA_HOME=" + dir_ +
                 "/data " + helm_ + " " + args);
  }
  // `helm template` of the chart; the objects it renders, by "Kind/name".
  std::map<std::string, json> render(const std::string& args) {
    Shell r = helm("template tandem " + kChart + " --namespace tandem-system " + args);
    EXPECT_EQ(r.status, 0) << r.out;
    std::map<std::string, json> objects;
    size_t at = 0;
    while (at < r.out.size()) {
      size_t next = r.out.find("\n---", at);
      if (next == std::string::npos) next = r.out.size();
      std::string doc = r.out.substr(at, next - at);
      at = next + 4;
      // Helm's note about the chart's symbolic links (crds/, files/) is not YAML.
      if (doc.find("kind:") == std::string::npos) continue;
      json o = apiserver::yamlToJson(doc.substr(doc.find("apiVersion:")));
      objects[o["kind"].get<std::string>() + "/" + o["metadata"]["name"].get<std::string>()] = o;
    }
    return objects;
  }
  std::string writeValues(const std::string& name, const std::string& yaml) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << yaml;
    return path;
  }

  std::string helm_, dir_;
};

std::vector<std::string> exampleValues() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(kSource + "/examples/helm")) {
    if (e.path().extension() == ".yaml") out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> dashboardFiles() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(kSource + "/dashboards")) {
    if (e.path().extension() == ".json") out.push_back(e.path().filename().string());
  }
  return out;
}

TEST_F(HelmChartTest, LintsStrictWithTheDefaultsAndEveryExampleValuesFile) {
  Shell r = helm("lint --strict " + kChart);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("1 chart(s) linted, 0 chart(s) failed"));
  const auto examples = exampleValues();
  ASSERT_GE(examples.size(), 2u) << "examples/helm should hold the local and the GPU values";
  for (const std::string& values : examples) {
    r = helm("lint --strict " + kChart + " -f " + values);
    EXPECT_EQ(r.status, 0) << values << ":\n" << r.out;
    auto objects = render("-f " + values);
    EXPECT_TRUE(objects.count("Deployment/tandem")) << values;
  }
}

TEST_F(HelmChartTest, TheOperatorRunsHardenedWithLeaderElectionUnderItsOwnServiceAccount) {
  auto objects = render("");
  ASSERT_TRUE(objects.count("Deployment/tandem"));
  const json& d = objects["Deployment/tandem"];
  EXPECT_EQ(d["spec"]["replicas"], 2);
  const json& pod = d["spec"]["template"]["spec"];
  EXPECT_EQ(pod["serviceAccountName"], "tandem");
  EXPECT_EQ(pod["securityContext"]["runAsNonRoot"], true);
  EXPECT_EQ(pod["securityContext"]["runAsUser"], 65532);
  EXPECT_EQ(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
  const json& c = pod["containers"][0];
  EXPECT_EQ(c["command"], json::array({"tandem-operator"}));
  EXPECT_EQ(c["image"], "ghcr.io/tandem-serving/tandem:0.1.0");
  EXPECT_EQ(c["securityContext"]["readOnlyRootFilesystem"], true);
  EXPECT_EQ(c["securityContext"]["allowPrivilegeEscalation"], false);
  EXPECT_EQ(c["securityContext"]["capabilities"]["drop"], json::array({"ALL"}));
  EXPECT_FALSE(c["securityContext"]["capabilities"].contains("add"));
  const std::string args = c["args"].dump();
  EXPECT_THAT(args, HasSubstr("--leader-elect=true"));
  EXPECT_THAT(args, HasSubstr("--lease-name=tandem"));
  EXPECT_THAT(args, HasSubstr("--identity=$(POD_NAME)"));
  EXPECT_THAT(args, Not(HasSubstr("--namespace=")));
  EXPECT_EQ(c["readinessProbe"]["httpGet"]["path"], "/readyz");
  EXPECT_EQ(c["ports"][0]["containerPort"], 8080);
  EXPECT_TRUE(objects.count("ServiceAccount/tandem"));
  EXPECT_TRUE(objects.count("Service/tandem-metrics"));
  // Leader election's Lease: the chart makes it; the operator may only get
  // and update that one.
  ASSERT_TRUE(objects.count("Lease/tandem"));
  EXPECT_FALSE(objects["Lease/tandem"]["spec"].contains("holderIdentity"));
  ASSERT_TRUE(objects.count("Role/tandem-leader-election"));
  const json& lease = objects["Role/tandem-leader-election"]["rules"];
  ASSERT_EQ(lease.size(), 1u);
  EXPECT_EQ(lease[0]["resourceNames"], json::array({"tandem"}));
  EXPECT_EQ(lease[0]["verbs"], json::array({"get", "update"}));
}

TEST_F(HelmChartTest, WatchingOneNamespaceUsesARoleThereInsteadOfAClusterRole) {
  auto cluster = render("");
  EXPECT_TRUE(cluster.count("ClusterRole/tandem"));
  EXPECT_TRUE(cluster.count("ClusterRoleBinding/tandem"));
  auto ns = render("--set operator.watchNamespace=team-a");
  EXPECT_FALSE(ns.count("ClusterRole/tandem"));
  ASSERT_TRUE(ns.count("Role/tandem"));
  EXPECT_EQ(ns["Role/tandem"]["metadata"]["namespace"], "team-a");
  EXPECT_EQ(ns["RoleBinding/tandem"]["subjects"][0]["namespace"], "tandem-system");
  EXPECT_THAT(ns["Deployment/tandem"]["spec"]["template"]["spec"]["containers"][0]["args"].dump(),
              HasSubstr("--namespace=team-a"));
  // Secrets: only get and create (the pool key), never list or watch.
  bool secrets = false;
  for (const json& rule : cluster["ClusterRole/tandem"]["rules"]) {
    if (rule["resources"] == json::array({"secrets"})) {
      secrets = true;
      EXPECT_EQ(rule["verbs"], json::array({"get", "create"}));
    }
    for (const json& v : rule["verbs"]) EXPECT_NE(v, "*") << rule.dump();
    for (const json& res : rule["resources"]) EXPECT_NE(res, "*") << rule.dump();
  }
  EXPECT_TRUE(secrets);
}

TEST_F(HelmChartTest, DashboardsAndAlertRulesComeFromTheDashboardsDirectory) {
  const auto files = dashboardFiles();
  auto objects = render("--set metrics.prometheusRule.enabled=true --set metrics.serviceMonitor.enabled=true "
                        "--set metrics.podMonitor.enabled=true --set dashboards.namespace=monitoring");
  size_t maps = 0;
  for (const auto& [key, o] : objects) {
    if (key.rfind("ConfigMap/tandem-dashboard-", 0) != 0) continue;
    ++maps;
    EXPECT_EQ(o["metadata"]["namespace"], "monitoring");
    EXPECT_EQ(o["metadata"]["labels"]["grafana_dashboard"], "1");
    ASSERT_EQ(o["data"].size(), 1u);
    const std::string file = o["data"].begin().key();
    std::ifstream in(kSource + "/dashboards/" + file);
    std::string original((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // The ConfigMap holds the file as it is (Helm's |- drops a final newline).
    while (!original.empty() && original.back() == '\n') original.pop_back();
    EXPECT_EQ(o["data"][file].get<std::string>(), original) << file;
  }
  EXPECT_EQ(maps, files.size());
  ASSERT_TRUE(objects.count("PrometheusRule/tandem"));
  json rules = apiserver::yamlToJson(shell("cat " + kSource + "/dashboards/alerts.yaml").out);
  EXPECT_EQ(objects["PrometheusRule/tandem"]["spec"]["groups"], rules["groups"]);
  ASSERT_TRUE(objects.count("ServiceMonitor/tandem-operator"));
  // The operator's series carry each pool's namespace: Prometheus must keep it.
  EXPECT_EQ(objects["ServiceMonitor/tandem-operator"]["spec"]["endpoints"][0]["honorLabels"], true);
  ASSERT_TRUE(objects.count("PodMonitor/tandem-pools"));
  EXPECT_EQ(objects["PodMonitor/tandem-pools"]["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"], "tandem");
  // runbook_url made absolute with metrics.prometheusRule.runbookBaseUrl.
  auto linked = render("--set metrics.prometheusRule.enabled=true "
                       "--set metrics.prometheusRule.runbookBaseUrl=https://docs.example/tandem/");
  size_t links = 0;
  for (const json& group : linked["PrometheusRule/tandem"]["spec"]["groups"]) {
    for (const json& rule : group["rules"]) {
      const std::string url = rule["annotations"]["runbook_url"];
      EXPECT_EQ(url.rfind("https://docs.example/tandem/docs/user-guide.md#alert-", 0), 0u) << url;
      ++links;
    }
  }
  EXPECT_GE(links, 10u);
  // Off by default: no Prometheus Operator CRDs needed for a plain install.
  auto plain = render("");
  EXPECT_FALSE(plain.count("PrometheusRule/tandem"));
  EXPECT_FALSE(plain.count("ServiceMonitor/tandem-operator"));
}

TEST_F(HelmChartTest, TheCrdIsTheRepositorysOne) {
  Shell r = helm("show crds " + kChart);
  ASSERT_EQ(r.status, 0) << r.out;
  std::ifstream in(kSource + "/crds/inferencepool.yaml");
  std::string crd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(r.out, HasSubstr(crd));
}

// Each value that breaks values.schema.json is refused, naming the field.
TEST_F(HelmChartTest, ValuesThatBreakTheSchemaAreRefusedNamingTheField) {
  struct Case {
    std::string values, field;
  };
  const std::vector<Case> cases = {
      {"operator: {replicas: 0}", "operator.replicas"},
      {"operator: {replicas: two}", "operator.replicas"},
      {"operator: {replica: 2}", "Additional property replica is not allowed"},
      {"operator: {workers: 65}", "operator.workers"},
      {"operator: {logLevel: loud}", "operator.logLevel"},
      {"operator: {prometheusUrl: prometheus:9090}", "operator.prometheusUrl"},
      {"operator: {watchNamespace: Team_A}", "operator.watchNamespace"},
      {"operator: {extraArgs: [verbose]}", "operator.extraArgs.0"},
      {"operator: {resources: {limits: {memory: lots}}}", "operator.resources.limits.memory"},
      {"image: {pullPolicy: Sometimes}", "image.pullPolicy"},
      {"metrics: {serviceMonitor: {interval: soon}}", "metrics.serviceMonitor.interval"},
      {"metrics: {prometheusRule: {runbookBaseUrl: docs}}", "metrics.prometheusRule.runbookBaseUrl"},
      {"service: {port: 70000}", "service.port"},
      {"dashboard: {enabled: true}", "Additional property dashboard is not allowed"},
  };
  int i = 0;
  for (const Case& c : cases) {
    const std::string file = writeValues("bad" + std::to_string(i++) + ".yaml", c.values + "\n");
    Shell r = helm("template tandem " + kChart + " -f " + file);
    EXPECT_NE(r.status, 0) << c.values << " was accepted";
    EXPECT_THAT(r.out, HasSubstr("values don't meet the specifications of the schema")) << c.values;
    EXPECT_THAT(r.out, HasSubstr(c.field)) << c.values;
  }
  // Two operators without leader election would both reconcile: refused.
  Shell le = helm("template tandem " + kChart + " --set operator.leaderElection=false");
  EXPECT_NE(le.status, 0);
  EXPECT_THAT(le.out, HasSubstr("operator.replicas is 2 but operator.leaderElection is false"));
  auto single = render("--set operator.leaderElection=false --set operator.replicas=1");
  EXPECT_THAT(single["Deployment/tandem"]["spec"]["template"]["spec"]["containers"][0]["args"].dump(),
              HasSubstr("--leader-elect=false"));
  EXPECT_FALSE(single.count("Lease/tandem"));
  // serviceAccount.create=false needs a name.
  Shell r = helm("template tandem " + kChart + " --set serviceAccount.create=false");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.out, HasSubstr("serviceAccount.name is required when serviceAccount.create is false"));
}

}  // namespace
}  // namespace tandem
