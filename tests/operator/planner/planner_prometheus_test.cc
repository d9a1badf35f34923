// The planner's signals read from the real Prometheus server scraping real
// agents: a prefill, a decode and a router process on loopback, listed in a
// file_sd file with their pod names as a Kubernetes PodMonitor would label
// them. The same code path the operator runs (fetchAnswers, then
// assembleSignals, then decide).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "operator/autoscaler.h"
#include "operator/planner/prometheus_signals.h"
#include "tests/agent/agent_process.h"
#include "tests/testing/prometheus.h"
#include "tests/testing/wait.h"
#include "src/k8s/resource.h"

namespace tandem::op {
namespace {

using agent::testing::AgentProcess;
using ::testing::HasSubstr;
using nlohmann::json;

std::string hostPort(const AgentProcess& a) { return a.url("").substr(std::string("http://").size()); }

class PlannerPrometheusTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    prefill_ = AgentProcess::start({"--role", "prefill", "--worker", "it-prefill-0", "--kv-listen", "127.0.0.1:0",
                                    "--kv-tls", "tcp", "--pool", "it"})
                   .release();
    ASSERT_NE(prefill_, nullptr);
    decode_ = AgentProcess::start({"--role", "decode", "--worker", "it-decode-0", "--kv-listen", "127.0.0.1:0", "--kv-tls", "tcp", "--pool", "it",
                                   "--prefill-peer", strCat("127.0.0.1:", prefill_->kvPort())})
                  .release();
    ASSERT_NE(decode_, nullptr);
    knobs_ = new std::string(agent::testing::testScratchDir() / "knobs.json");
    router_ = AgentProcess::start({"--role", "router", "--pool", "it", "--decode-workers", hostPort(*decode_),
                                   "--prefill-workers", hostPort(*prefill_), "--routing-knobs", *knobs_, "--log-level", "info"})
                  .release();
    ASSERT_NE(router_, nullptr);
    prometheus_ = testutil::PrometheusServer::start(agent::testing::testScratchDir() / "prometheus").release();
    ASSERT_NE(prometheus_, nullptr) << "prometheus did not start";
    // The labels a pod's scrape carries (the kubelet's file, or
    // kubernetes_sd relabelling on a cluster).
    prometheus_->setTargets({{hostPort(*prefill_), {{"namespace", "default"}, {"pod", "it-prefill-0"}}},
                             {hostPort(*decode_), {{"namespace", "default"}, {"pod", "it-decode-0"}}},
                             {hostPort(*router_), {{"namespace", "default"}, {"pod", "it-router-0"}}},
                             // The same pool name in another namespace: not the pool's.
                             {hostPort(*decode_), {{"namespace", "elsewhere"}, {"pod", "it-decode-0"}}}});
    ASSERT_TRUE(testutil::waitFor([] { return prometheus_->allUp(4); }, std::chrono::seconds(60),
                                  std::chrono::milliseconds(250)))
        << prometheus_->log();
  }
  static void TearDownTestSuite() {
    delete prometheus_;
    for (AgentProcess* a : {router_, decode_, prefill_}) {
      if (a) {
        EXPECT_EQ(a->stop(SIGTERM), 0) << a->log();
      }
      delete a;
    }
    delete knobs_;
  }

  static std::vector<planner::PodInfo> pods(double now) {
    return {{.name = "it-prefill-0", .role = planner::PlanRole::kPrefill, .ready = true, .ready_since_s = now - 600,
             .created_s = now - 660},
            {.name = "it-decode-0", .role = planner::PlanRole::kDecode, .ready = true, .ready_since_s = now - 600,
             .created_s = now - 630}};
  }

  static inline AgentProcess *prefill_ = nullptr, *decode_ = nullptr, *router_ = nullptr;
  static inline testutil::PrometheusServer* prometheus_ = nullptr;
  static inline std::string* knobs_ = nullptr;
};

double epochNow() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

TEST_F(PlannerPrometheusTest, TheSignalsOfAServingPoolComeFromItsOwnSeries) {
  // Distinct prompts, so each is computed on the prefill agent.
  for (int i = 0; i < 12; ++i) {
    const json body = {{"model", "tiny"},
                       {"prompt", strCat("request ", i, " asks the pool something long enough to be prefilled by P ",
                                         std::string(static_cast<size_t>(40 + i), 'x'))},
                       {"max_tokens", 8},
                       {"temperature", 0}};
    auto r = http::httpPost(router_->url("/v1/completions"), body, std::chrono::seconds(60));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->status, 200) << r->body;
  }
  // Streamed ones: the router's own TTFT and TPOT.
  for (int i = 0; i < 4; ++i) {
    json body = {{"model", "tiny"}, {"prompt", strCat("a streamed request ", i, " with a prompt of its own")},
                 {"max_tokens", 8}, {"stream", true}};
    auto r = http::httpPost(router_->url("/v1/completions"), body, std::chrono::seconds(60));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_THAT(r->body, HasSubstr("[DONE]"));
  }
  const auto queries = planner::signalQueries("default", "it", 30);
  planner::Signals s;
  std::map<std::string, std::string> errors;
  // Rates need two scrapes after the requests: poll until they show.
  const bool complete = testutil::waitFor(
      [&] {
        errors.clear();
        const auto answers = fetchAnswers(prometheus_->url(), queries, std::chrono::seconds(5), &errors);
        const double now = epochNow();
        s = planner::assembleSignals(queries, answers, pods(now), 1, 1, now);
        return errors.empty() && s.missing.empty() && s.ttft_p95_s && s.uncached_prompt_tokens_per_s > 0 &&
               !s.prefill.empty() && s.prefill[0].capacity.has_value() && s.requests_per_s > 0;
      },
      std::chrono::seconds(60), std::chrono::seconds(1));
  std::string why;
  for (const auto& [q, e] : errors) why += strCat(q, ": ", e, "\n");
  for (const std::string& m : s.missing) why += strCat("missing ", m, "\n");
  why += strCat("ttft_p95 ", s.ttft_p95_s.value_or(-1), " uncached ", s.uncached_prompt_tokens_per_s, " capacity ",
                s.prefill.empty() ? -2 : s.prefill[0].capacity.value_or(-1), " requests/s ", s.requests_per_s, "\n");
  if (!complete) {
    auto raw = http::httpGet(prometheus_->url() + "/api/v1/query?query=" +
                                 k8s::percentEncode("tandem_engine_prefill_tokens_total[60s]"),
                             std::chrono::seconds(5));
    why += raw.ok() ? raw->body : std::string(raw.status().message());
  }
  ASSERT_TRUE(complete) << why << prometheus_->log();
  EXPECT_GT(*s.ttft_p95_s, 0);
  EXPECT_LT(*s.ttft_p95_s, 60);
  EXPECT_GT(*s.prefill[0].capacity, 0) << "tokens per busy second, measured on it-prefill-0";
  EXPECT_GE(s.decode_kv_used_ratio, 0);
  EXPECT_LE(s.decode_kv_used_ratio, 1);
  EXPECT_GE(s.decode_kv_active_ratio, s.decode_kv_used_ratio) << "the working set holds the running sequences' KV";
  EXPECT_LT(s.age_s, 10);
  EXPECT_GT(s.mean_uncached_prompt_tokens, 0);
  // The decode agent's KV pool counted once: its scrape under another
  // namespace is another pool's.
  auto metrics = http::httpGet(decode_->url("/metrics"), std::chrono::seconds(5));
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  const size_t at = metrics->body.find("\ntandem_kv_blocks_capacity{");
  ASSERT_NE(at, std::string::npos) << metrics->body;
  const size_t value = metrics->body.find("} ", at);
  EXPECT_DOUBLE_EQ(s.decode_kv_total_blocks, std::stod(metrics->body.substr(value + 2)));

  // The planner decides on them (no missing data; a tiny load holds).
  planner::PlannerConfig config;
  config.prefill = {1, 4};
  config.decode = {1, 4};
  planner::PlannerState state;
  const planner::Decision d = planner::decide(config, s, state);
  EXPECT_NE(d.prefill.reason, planner::Reason::kMissingData) << d.prefill.message;
  EXPECT_NE(d.decode.reason, planner::Reason::kMissingData) << d.decode.message;
  EXPECT_GT(d.prefill.capacity, 0);
}

TEST_F(PlannerPrometheusTest, APoolNobodyScrapesIsMissingDataAndNamesTheSeries) {
  const auto queries = planner::signalQueries("default", "no-such-pool", 30);
  std::map<std::string, std::string> errors;
  const auto answers = fetchAnswers(prometheus_->url(), queries, std::chrono::seconds(5), &errors);
  EXPECT_TRUE(errors.empty()) << "every query is valid PromQL: " << (errors.empty() ? "" : errors.begin()->second);
  const planner::Signals s = planner::assembleSignals(queries, answers, {}, 1, 1, epochNow());
  EXPECT_THAT(s.missing, ::testing::IsSupersetOf({"tandem_kv_blocks_capacity", "tandem_prefill_queue_tokens",
                                                   "tandem_router_ttft_seconds_count"}));
  planner::PlannerState state;
  const planner::Decision d = planner::decide(planner::PlannerConfig{}, s, state);
  EXPECT_EQ(d.decode.reason, planner::Reason::kMissingData);
  EXPECT_THAT(d.decode.message, HasSubstr("tandem_kv_blocks_capacity"));
  EXPECT_FALSE(d.acted());
}

TEST_F(PlannerPrometheusTest, AnUnreachablePrometheusIsAnErrorPerQueryAndMissingData) {
  const auto queries = planner::signalQueries("default", "it", 30);
  std::map<std::string, std::string> errors;
  const auto answers = fetchAnswers("http://127.0.0.1:1", queries, std::chrono::seconds(2), &errors);
  EXPECT_TRUE(answers.empty());
  EXPECT_EQ(errors.size(), queries.size());
  const planner::Signals s = planner::assembleSignals(queries, answers, {}, 1, 1, epochNow());
  EXPECT_FALSE(s.missing.empty());
}

TEST_F(PlannerPrometheusTest, TheRouterTakesTheKnobsThePlannerPublishes) {
  std::ofstream(*knobs_) << R"({"directMaxSuffixTokens": 4096, "loadFloorWeight": 3})";
  EXPECT_TRUE(testutil::waitFor([] { return router_->log().find("routing knobs applied") != std::string::npos; },
                                std::chrono::seconds(10), std::chrono::milliseconds(100)))
      << router_->log();
  EXPECT_THAT(router_->log(), HasSubstr("direct_max_suffix_tokens=4096"));
}

}  // namespace
}  // namespace tandem::op
