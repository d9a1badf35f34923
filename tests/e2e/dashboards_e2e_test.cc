// Every query of dashboards/ against the real Prometheus scraping a live
// pool: the local cluster with the operator (its planner on, so its metrics
// and the pool's SLO targets exist), a prefill, a decode and a router agent,
// and a few completions, streamed and not, long enough to be disaggregated
// so the KV transport's metrics move. Then
//   - every panel's expression and every variable's query of every
//     dashboard (template variables substituted) must parse and return at
//     least one series;
//   - every alert rule's expression must parse, and each operand of its
//     comparisons and set operators (the expression without its threshold)
//     must return at least one series: alerts are empty while nothing is
//     wrong, what they compare is not;
//   - no expression pads itself with vector(…), and every metric name they
//     use is on some live /metrics (agents, router, operator);
//   - the operator exports its pools' replicas and every planner decision
//     reason from the start.

#include <fstream>
#include <regex>
#include <set>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include "src/k8s/resource.h"
#include "tests/e2e/operator_fixture.h"
#include "tests/testing/prometheus.h"

namespace tandem::e2e {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

std::string trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\n");
  if (b == std::string_view::npos) return "";
  return std::string(s.substr(b, s.find_last_not_of(" \t\n") - b + 1));
}

bool isNumber(const std::string& s) {
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return !s.empty() && end == s.c_str() + s.size();
}

// Index of the parenthesis closing the one at `open`.
size_t closing(std::string_view e, size_t open) {
  int depth = 0;
  for (size_t i = open; i < e.size(); ++i) {
    if (e[i] == '"') {
      for (++i; i < e.size() && e[i] != '"'; ++i) i += e[i] == '\\';
    } else if (e[i] == '(' || e[i] == '[' || e[i] == '{') {
      ++depth;
    } else if ((e[i] == ')' || e[i] == ']' || e[i] == '}') && --depth == 0) {
      return i;
    }
  }
  return std::string_view::npos;
}

// Drops the vector-matching modifiers that start an operator's right-hand
// side: bool, on(…), ignoring(…), group_left(…), group_right(…).
std::string dropModifiers(std::string s) {
  for (bool more = true; more;) {
    more = false;
    for (const char* word : {"bool", "on", "ignoring", "group_left", "group_right"}) {
      const std::string w(word);
      if (s.rfind(w, 0) != 0 || (s.size() > w.size() && std::isalnum(s[w.size()])) ||
          (s.size() > w.size() && s[w.size()] == '_')) {
        continue;
      }
      std::string rest = trim(s.substr(w.size()));
      if (!rest.empty() && rest[0] == '(' && w != "bool") rest = trim(rest.substr(closing(rest, 0) + 1));
      s = rest;
      more = true;
    }
  }
  return s;
}

// The operands of an expression's top-level comparison and set operators
// (==, !=, >, <, >=, <=, and, or, unless), recursively, numbers left out;
// the expression itself when it has none.
std::vector<std::string> operands(const std::string& expr) {
  std::string e = trim(expr);
  while (!e.empty() && e[0] == '(' && closing(e, 0) == e.size() - 1) e = trim(e.substr(1, e.size() - 2));
  std::vector<std::string> pieces;
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i < e.size(); ++i) {
    const char c = e[i];
    if (c == '"') {
      for (++i; i < e.size() && e[i] != '"'; ++i) i += e[i] == '\\';
      continue;
    }
    if (c == '(' || c == '[' || c == '{') ++depth;
    if (c == ')' || c == ']' || c == '}') --depth;
    if (depth != 0) continue;
    size_t len = 0;
    if ((c == '>' || c == '<' || c == '=' || c == '!') && i + 1 < e.size() && e[i + 1] == '=') {
      len = 2;
    } else if (c == '>' || c == '<') {
      len = 1;
    } else {
      for (const char* word : {"and", "or", "unless"}) {
        const size_t n = std::strlen(word);
        if (e.compare(i, n, word) == 0 && i > 0 && std::isspace(e[i - 1]) && i + n < e.size() &&
            (std::isspace(e[i + n]) || e[i + n] == '(')) {
          len = n;
        }
      }
    }
    if (len == 0) continue;
    pieces.push_back(e.substr(start, i - start));
    start = i + len;
    i += len - 1;
  }
  if (pieces.empty()) return {e};
  pieces.push_back(e.substr(start));
  std::vector<std::string> out;
  for (const std::string& p : pieces) {
    const std::string piece = dropModifiers(trim(p));
    if (isNumber(piece)) continue;
    for (std::string& o : operands(piece)) out.push_back(std::move(o));
  }
  return out;
}

TEST(PromqlOperandsTest, SplitsComparisonsAndSetOperatorsAndDropsModifiers) {
  EXPECT_THAT(operands("sum(rate(a[5m])) > 0.2"), ::testing::ElementsAre("sum(rate(a[5m]))"));
  EXPECT_THAT(operands("x{r=~\"a|b\", s!=\"c\"} > on (ns, pool) group_left max by (ns) (y)\nor\n(z < 1)"),
              ::testing::ElementsAre("x{r=~\"a|b\", s!=\"c\"}", "max by (ns) (y)", "z"));
  EXPECT_THAT(operands("(a / b) < 0.5 * (c / d) and c / d > 0.2"),
              ::testing::ElementsAre("a / b", "0.5 * (c / d)", "c / d"));
  EXPECT_THAT(operands("min_over_time(sum by (p) (q)[10m:30s]) >= bool 0"),
              ::testing::ElementsAre("min_over_time(sum by (p) (q)[10m:30s])"));
  EXPECT_THAT(operands("rate(tandem_orders_total[1m])"), ::testing::ElementsAre("rate(tandem_orders_total[1m])"));
}

class DashboardsE2eTest : public OperatorTest {
 protected:
  std::vector<std::string> operatorArgs() override {
    // Prometheus scrapes the kubelet's pods and the operator (a process
    // outside the cluster here): a file that is the kubelet's plus it.
    merged_targets_ = dir_ + "/prometheus-targets.json";
    std::ofstream(merged_targets_) << "[]";
    merging_ = true;
    merger_ = std::thread([this] {
      std::string last;
      while (merging_) {
        json groups = json::parse(readFile(dir_ + "/scrape-targets.json"), nullptr, false);
        if (!groups.is_array()) groups = json::array();
        groups.push_back({{"targets", {"127.0.0.1:" + std::to_string(metrics_port_)}}, {"labels", json::object()}});
        if (groups.dump() != last) {
          // Atomically (a rename); a failed write is tried again next round,
          // never thrown out of this thread.
          std::ofstream(merged_targets_ + ".tmp") << groups.dump();
          std::error_code ec;
          std::filesystem::rename(merged_targets_ + ".tmp", merged_targets_, ec);
          last = ec ? std::string() : groups.dump();
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
      }
    });
    prometheus_ = testutil::PrometheusServer::start(dir_ + "/prometheus", merged_targets_);
    if (!prometheus_) {
      ADD_FAILURE() << "prometheus did not start";
      return {};
    }
    return {"--prometheus-url", prometheus_->url()};
  }
  void TearDown() override {
    // The merger writes into the test's directory, which the fixture removes.
    merging_ = false;
    if (merger_.joinable()) merger_.join();
    prometheus_.reset();
    OperatorTest::TearDown();
  }

  // Prometheus' answer to an instant query (status, and the data on success).
  json query(const std::string& promql) {
    auto r = http::httpGet(prometheus_->url() + "/api/v1/query?query=" + k8s::percentEncode(promql),
                           std::chrono::seconds(10));
    if (!r.ok()) return {{"status", "error"}, {"error", std::string(r.status().message())}};
    auto j = r->json();
    return j.ok() ? *j : json{{"status", "error"}, {"error", r->body}};
  }
  // "" when `promql` parses and returns at least one series, else why not.
  std::string nonEmpty(const std::string& promql) {
    const json r = query(promql);
    if (r.value("status", "") != "success") return "error: " + r.value("error", r.dump());
    const json& result = r["data"]["result"];
    if (r["data"].value("resultType", "") != "vector") return "not an instant vector: " + r["data"].dump();
    if (result.empty()) return "no series";
    return "";
  }
  double value(const std::string& promql) {
    const json r = query(promql);
    if (r.value("status", "") != "success" || r["data"]["result"].empty()) return -1;
    return std::stod(r["data"]["result"][0]["value"][1].get<std::string>());
  }

  std::string merged_targets_;
  std::atomic<bool> merging_{false};
  std::thread merger_;
  std::unique_ptr<testutil::PrometheusServer> prometheus_;
};

// Panel and variable queries of one dashboard, with its template variables
// substituted; `what` names each for the failure message.
struct Query {
  std::string what, promql, label;  // label: a variable's label_values label
};

std::vector<Query> dashboardQueries(const std::string& file) {
  std::vector<Query> out;
  const json d = json::parse(readFile(file));
  auto substitute = [](std::string e) {
    for (const auto& [var, value] : std::vector<std::pair<std::string, std::string>>{
             {"$__rate_interval", "30s"}, {"$namespace", "default"}, {"$pool", "tiny"}}) {
      for (size_t at; (at = e.find(var)) != std::string::npos;) e.replace(at, var.size(), value);
    }
    return e;
  };
  std::vector<json> panels;
  for (const json& p : d.value("panels", json::array())) {
    panels.push_back(p);
    for (const json& inner : p.value("panels", json::array())) panels.push_back(inner);
  }
  for (const json& p : panels) {
    for (const json& t : p.value("targets", json::array())) {
      out.push_back({file + ": panel \"" + p.value("title", "") + "\" " + t.value("refId", ""),
                     substitute(t.value("expr", "")), ""});
    }
  }
  static const std::regex kLabelValues(R"(^label_values\((.*),\s*(\w+)\)$)");
  for (const json& v : d["templating"]["list"]) {
    if (v.value("type", "") != "query") continue;
    const std::string q = v["query"].is_object() ? v["query"].value("query", "") : v["query"].get<std::string>();
    std::smatch m;
    if (std::regex_match(q, m, kLabelValues)) {
      out.push_back({file + ": variable " + v.value("name", ""), substitute(m[1]), m[2]});
    } else {
      out.push_back({file + ": variable " + v.value("name", "") + " (not label_values(…))", "", ""});
    }
  }
  return out;
}

std::set<std::string> metricNames(const std::string& promql) {
  static const std::regex kName(R"((tandem_[a-z0-9_]+|vllm:[a-z_:]+))");
  std::set<std::string> names;
  for (std::sregex_iterator it(promql.begin(), promql.end(), kName), end; it != end; ++it) names.insert((*it)[1]);
  return names;
}

TEST_F(DashboardsE2eTest, EveryPanelAndRuleQueryReturnsSeriesFromALivePool) {
  ASSERT_NE(prometheus_, nullptr);
  apply("pool.yaml", pool("tiny", R"(  engine: {numBlocks: 512}
  prefill: {replicas: 1, args: [--kv-tls, "posix,cma,tcp"]}
  decode: {replicas: 1, args: [--kv-tls, "posix,cma,tcp"]}
  autoscaling:
    enabled: true
    interval: 2s
    warmup: 0s
    ttftP95TargetSeconds: 100
    tpotP95TargetSeconds: 10
    prefill: {min: 1, max: 1}
    decode: {min: 1, max: 1}
)"));
  ASSERT_TRUE(eventually([&] { return condition("tiny", "Ready", "status") == "True"; }, 120))
      << kubectl("get tpool tiny -o yaml").output << kubectl("get pods -o wide").output << operatorLog()
      << shell("find " + dir_ + "/kubelet -name '*.log' -path '*router*' | xargs tail -n 40").output;
  const std::string endpoint = get("tpool tiny", "{.status.endpoint}");
  ASSERT_FALSE(endpoint.empty());

  // The operator: every pool's replicas, and every decision reason at zero
  // from the first interval (Budget never happens here).
  const std::string operator_metrics = "http://127.0.0.1:" + std::to_string(metrics_port_) + "/metrics";
  ASSERT_TRUE(eventually([&] {
    return shell("curl -s -m 5 " + operator_metrics).output.find("tandem_planner_decisions_total") != std::string::npos;
  })) << operatorLog();
  const std::string om = shell("curl -s -m 5 " + operator_metrics).output;
  for (const char* role : {"prefill", "decode", "router"}) {
    EXPECT_THAT(om, HasSubstr(std::string("tandem_pool_ready_replicas{namespace=\"default\",pool=\"tiny\",role=\"") +
                              role + "\"} 1"));
    EXPECT_THAT(om, HasSubstr(std::string("tandem_pool_replicas{namespace=\"default\",pool=\"tiny\",role=\"") + role +
                              "\"} 1"));
  }
  for (const char* role : {"prefill", "decode"}) {
    EXPECT_THAT(om, HasSubstr(std::string("tandem_planner_decisions_total{namespace=\"default\",pool=\"tiny\","
                                          "reason=\"Budget\",role=\"") +
                              role + "\"} 0"));
  }

  // Completions through the router: long prompts (disaggregated: P computes,
  // D pulls the KV) and short ones, streamed (the router's TTFT and TPOT) and not.
  std::string long_prompt;
  for (int i = 0; i < 200; ++i) long_prompt += "word" + std::to_string(i) + " ";
  int ok = 0;
  for (int i = 0; i < 8; ++i) {
    const std::string prompt = i % 2 ? long_prompt + std::to_string(i) : "hello " + std::to_string(i);
    const std::string stream = i % 4 < 2 ? "true" : "false";
    const std::string body =
        R"({"model":"tiny","prompt":")" + prompt + R"(","max_tokens":8,"ignore_eos":true,"stream":)" + stream + "}";
    const std::string out = shell("curl -s -m 60 http://" + endpoint +
                                  "/v1/completions -H 'Content-Type: application/json' -d '" + body + "'")
                                .output;
    ok += out.find("\"choices\"") != std::string::npos;
  }
  EXPECT_EQ(ok, 8);
  // Scraped: the KV moved, and the planner has decided with every signal.
  ASSERT_TRUE(eventually([&] { return value("sum(tandem_kv_transfer_bytes_total{pool=\"tiny\"})") > 0; }, 30))
      << prometheus_->log() << readFile(merged_targets_);
  ASSERT_TRUE(eventually([&] { return value("count(tandem_planner_input{pool=\"tiny\"})") > 0; }, 30)) << operatorLog();
  ASSERT_TRUE(eventually([&] { return value("count(up == 1)") >= 4; }, 30)) << readFile(merged_targets_);
  std::this_thread::sleep_for(std::chrono::seconds(2));  // one more scrape of the last requests' counters

  // Every live /metrics: the agents', the router's and the operator's.
  std::string live;
  const json targets = json::parse(readFile(merged_targets_));
  for (const json& g : targets) {
    for (const json& t : g["targets"]) live += shell("curl -s -m 5 http://" + t.get<std::string>() + "/metrics").output;
  }

  std::vector<std::string> dashboards;
  for (const auto& f : std::filesystem::directory_iterator(std::string(TANDEM_SOURCE_DIR) + "/dashboards")) {
    if (f.path().extension() == ".json") dashboards.push_back(f.path().string());
  }
  std::sort(dashboards.begin(), dashboards.end());
  ASSERT_GE(dashboards.size(), 5u);
  std::set<std::string> names;
  int checked = 0;
  for (const std::string& file : dashboards) {
    for (const Query& q : dashboardQueries(file)) {
      SCOPED_TRACE(q.what + ": " + q.promql);
      ASSERT_FALSE(q.promql.empty());
      EXPECT_EQ(q.promql.find('$'), std::string::npos) << "a template variable left";
      EXPECT_EQ(q.promql.find("vector("), std::string::npos) << "padding";
      EXPECT_EQ(nonEmpty(q.promql), "");
      if (!q.label.empty()) {
        const json r = query(q.promql);
        EXPECT_TRUE(!r["data"]["result"].empty() && r["data"]["result"][0]["metric"].contains(q.label)) << r.dump();
      }
      for (const std::string& n : metricNames(q.promql)) names.insert(n);
      ++checked;
    }
  }

  const YAML::Node rules = YAML::LoadFile(std::string(TANDEM_SOURCE_DIR) + "/dashboards/alerts.yaml");
  int alerts = 0;
  for (const YAML::Node& group : rules["groups"]) {
    for (const YAML::Node& rule : group["rules"]) {
      const std::string name = rule["alert"] ? rule["alert"].as<std::string>() : rule["record"].as<std::string>();
      const std::string expr = rule["expr"].as<std::string>();
      SCOPED_TRACE("rule " + name + ": " + expr);
      EXPECT_EQ(expr.find("vector("), std::string::npos) << "padding";
      EXPECT_EQ(query(expr).value("status", ""), "success") << query(expr).dump();
      const std::vector<std::string> parts = operands(expr);
      EXPECT_FALSE(parts.empty());
      for (const std::string& part : parts) EXPECT_EQ(nonEmpty(part), "") << "operand: " << part;
      for (const std::string& n : metricNames(expr)) names.insert(n);
      alerts += rule["alert"] ? 1 : 0;
      ++checked;
    }
  }
  EXPECT_GE(alerts, 10);
  for (const std::string& n : names) {
    EXPECT_TRUE(live.find("\n" + n + "{") != std::string::npos || live.find("\n" + n + " ") != std::string::npos)
        << n << " is on no live /metrics";
  }
  std::cout << checked << " queries and " << names.size() << " metric names checked\n";
}

}  // namespace
}  // namespace tandem::e2e
