#include "operator/planner/prometheus_signals.h"

#include <cmath>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tandem::planner {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;

json vector(std::vector<std::pair<json, std::string>> samples) {
  json result = json::array();
  for (auto& [metric, value] : samples) result.push_back({{"metric", metric}, {"value", {1700000000.5, value}}});
  return {{"status", "success"}, {"data", {{"resultType", "vector"}, {"result", result}}}};
}

TEST(PrometheusSignalsTest, QueriesSelectThePoolAndNameTheirSeries) {
  const auto qs = signalQueries("team-a", "tiny", 60);
  ASSERT_FALSE(qs.empty());
  for (const SignalQuery& q : qs) {
    EXPECT_THAT(q.promql, HasSubstr("namespace=\"team-a\",pool=\"tiny\"")) << q.name;
    EXPECT_THAT(q.promql, HasSubstr(q.series)) << q.name;
  }
  auto find = [&](const std::string& name) {
    for (const SignalQuery& q : qs) {
      if (q.name == name) return q;
    }
    ADD_FAILURE() << name;
    return SignalQuery{};
  };
  EXPECT_THAT(find("ttft_p95").promql, HasSubstr("histogram_quantile(0.95, sum by (le) (rate(tandem_router_ttft_seconds_bucket"));
  EXPECT_THAT(find("ttft_p95").promql, HasSubstr("tandem_request_ttft_seconds_bucket{namespace=\"team-a\",pool=\"tiny\",role=~\"decode|both\"}"))
      << "unary requests have no router TTFT: the decode agents' count too";
  EXPECT_THAT(find("ttft_p95").promql, HasSubstr("[60s]"));
  EXPECT_TRUE(find("decode_kv_used").required);
  EXPECT_THAT(find("decode_kv_used").promql, HasSubstr("(sum(tandem_kv_blocks_sessions{namespace=\"team-a\",pool=\"tiny\",role=\"decode\"}) or vector(0))"))
      << "running sequences' KV: what sessions hold is left out, none when agents do not export it";
  EXPECT_FALSE(find("ttft_p95").required) << "no requests in the window is not missing data";
  EXPECT_THAT(find("prefill_capacity").promql, HasSubstr("sum by (pod)"));
}

TEST(PrometheusSignalsTest, AnswersParseAndBadOnesSayWhy) {
  auto v = parseQueryResponse(vector({{json{{"pod", "p-0"}}, "12.5"}, {json::object(), "NaN"}}));
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_EQ(v->size(), 1u) << "NaN (a quantile of nothing) is dropped";
  EXPECT_EQ((*v)[0].labels.at("pod"), "p-0");
  EXPECT_DOUBLE_EQ((*v)[0].value, 12.5);
  auto scalar = parseQueryResponse({{"status", "success"}, {"data", {{"resultType", "scalar"}, {"result", {1.0, "3"}}}}});
  ASSERT_TRUE(scalar.ok());
  EXPECT_DOUBLE_EQ((*scalar)[0].value, 3);
  EXPECT_THAT(parseQueryResponse({{"status", "error"}, {"errorType", "bad_data"}, {"error", "parse error at char 3"}})
                  .status()
                  .message(),
              HasSubstr("Prometheus: bad_data: parse error at char 3"));
  EXPECT_THAT(parseQueryResponse({{"status", "success"}, {"data", {{"resultType", "matrix"}, {"result", json::array()}}}})
                  .status()
                  .message(),
              HasSubstr("result type \"matrix\", expected vector"));
  EXPECT_THAT(parseQueryResponse(vector({{json::object(), "many"}})).status().message(), HasSubstr("not [time, \"number\"]"));
  EXPECT_THAT(parseQueryResponse(json::array()).status().message(), HasSubstr("not a JSON object"));
  // Wrong types are errors, never exceptions.
  EXPECT_THAT(parseQueryResponse({{"status", 1}}).status().message(), HasSubstr("status \"\""));
  EXPECT_THAT(parseQueryResponse({{"status", "error"}, {"error", {{"nested", true}}}}).status().message(),
              HasSubstr("(no message)"));
  EXPECT_THAT(parseQueryResponse({{"status", "success"}, {"data", {{"resultType", 7}}}}).status().message(),
              HasSubstr("result type"));
}

TEST(PrometheusSignalsTest, SignalsAreAssembledFromTheAnswersAndThePods) {
  const auto qs = signalQueries("team-a", "tiny", 60);
  std::map<std::string, std::vector<PromSample>> a;
  for (const SignalQuery& q : qs) a[q.name] = {};
  a["ttft_p95"] = {{{}, 1.5}};
  a["routers"] = {{{}, 1}};
  a["prefill_computed_tokens_per_s"] = {{{}, 9000}};
  a["prefill_queue_growth"] = {{{}, 1000}};
  a["prefill_queue_tokens"] = {{{}, 4000}};
  a["prefill_requests_per_s"] = {{{}, 3}};
  a["prefill_capacity"] = {{{{"pod", "tiny-prefill-a"}}, 20000}};
  a["decode_kv_used"] = {{{}, 0.4}};
  a["decode_kv_held"] = {{{}, 0.65}};
  a["decode_running"] = {{{}, 12}};
  a["age"] = {{{}, 2}};
  const std::vector<PodInfo> pods = {
      {.name = "tiny-prefill-a", .role = PlanRole::kPrefill, .ready = true, .ready_since_s = 900, .created_s = 800},
      {.name = "tiny-prefill-b", .role = PlanRole::kPrefill, .created_s = 990, .unschedulable = true},
      {.name = "tiny-decode-a", .role = PlanRole::kDecode, .ready = true, .ready_since_s = 950, .created_s = 890},
      {.name = "tiny-decode-old", .role = PlanRole::kDecode, .ready = true, .deleting = true},
  };
  const Signals s = assembleSignals(qs, a, pods, 2, 1, 1000);
  EXPECT_TRUE(s.missing.empty());
  EXPECT_DOUBLE_EQ(*s.ttft_p95_s, 1.5);
  EXPECT_FALSE(s.tpot_p95_s.has_value());
  EXPECT_DOUBLE_EQ(s.uncached_prompt_tokens_per_s, 10000) << "computed plus the queue's growth";
  a["prefill_arrivals_peak"] = {{{}, 25000}};
  EXPECT_DOUBLE_EQ(assembleSignals(qs, a, pods, 2, 1, 1000).uncached_prompt_tokens_per_s, 25000) << "a burst's peak";
  a["prefill_arrivals_peak"] = {};
  EXPECT_DOUBLE_EQ(s.prefill_queue_peak_tokens, 4000) << "no peak answered: the queue now";
  a["prefill_queue_peak"] = {{{}, 90000}};
  EXPECT_DOUBLE_EQ(assembleSignals(qs, a, pods, 2, 1, 1000).prefill_queue_peak_tokens, 90000);
  a["prefill_queue_peak"] = {};
  EXPECT_DOUBLE_EQ(s.mean_uncached_prompt_tokens, 3000);
  EXPECT_DOUBLE_EQ(s.decode_kv_used_ratio, 0.4) << "running sequences";
  EXPECT_DOUBLE_EQ(s.decode_kv_active_ratio, 0.65) << "with the resident sessions";
  EXPECT_DOUBLE_EQ(s.age_s, 2);
  ASSERT_EQ(s.prefill.size(), 2u);
  EXPECT_DOUBLE_EQ(*s.prefill[0].capacity, 20000);
  EXPECT_DOUBLE_EQ(s.prefill[0].ready_for_s, 100);
  EXPECT_TRUE(s.prefill[1].unschedulable);
  EXPECT_FALSE(s.prefill[1].capacity.has_value());
  EXPECT_EQ(s.decode.size(), 1u) << "a pod being deleted is not counted";
  EXPECT_EQ(s.spec_prefill, 2);
  EXPECT_EQ(*measuredStartup(pods, PlanRole::kPrefill), 100);
  EXPECT_EQ(*measuredStartup(pods, PlanRole::kDecode), 60);
  // A pod whose container restarted moved its Ready time: not a start-up;
  // an absurd one is clamped.
  std::vector<PodInfo> odd = {{.name = "r", .role = PlanRole::kDecode, .ready = true, .ready_since_s = 99000,
                               .created_s = 0, .restarts = 2},
                              {.name = "slow", .role = PlanRole::kDecode, .ready = true, .ready_since_s = 99000,
                               .created_s = 0}};
  EXPECT_EQ(*measuredStartup(odd, PlanRole::kDecode), kMaxStartupS);
  odd.pop_back();
  EXPECT_FALSE(measuredStartup(odd, PlanRole::kDecode).has_value());

  // A required series with no answer, and a query that failed outright, are named.
  a["decode_kv_used"] = {};
  a.erase("ttft_p95");
  const Signals m = assembleSignals(qs, a, pods, 2, 1, 1000);
  EXPECT_THAT(m.missing, ::testing::UnorderedElementsAre("tandem_kv_blocks_capacity", "tandem_router_ttft_seconds_bucket"));
}

}  // namespace
}  // namespace tandem::planner
