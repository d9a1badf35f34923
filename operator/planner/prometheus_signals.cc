#include "operator/planner/prometheus_signals.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "src/common/strings.h"

namespace tandem::planner {
namespace {

using nlohmann::json;

// The answer's single value (a sum, a quantile), if there is one.
std::optional<double> single(const std::map<std::string, std::vector<PromSample>>& answers, const std::string& name) {
  auto it = answers.find(name);
  if (it == answers.end() || it->second.empty()) return std::nullopt;
  return it->second.front().value;
}

double doubleOr(const std::optional<double>& v, double fallback) { return v.value_or(fallback); }

}  // namespace

std::vector<SignalQuery> signalQueries(const std::string& ns, const std::string& pool, double window_s) {
  const std::string w = strCat("[", static_cast<int64_t>(std::ceil(window_s)), "s]");
  const std::string sub = strCat("[", static_cast<int64_t>(std::ceil(window_s)), "s:5s]");  // a subquery's range
  // The peak's own rate window: at least two scrapes at the usual 15 s.
  const std::string peak = strCat("[", static_cast<int64_t>(std::max(15.0, std::ceil(window_s / 2))), "s]");
  // Both names are DNS labels (no quote or backslash to escape). The
  // namespace keeps two pools of one name in two namespaces apart.
  const std::string sel = strCat("namespace=\"", ns, "\",pool=\"", pool, "\"");
  auto in = [&](const char* role) { return strCat("{", sel, ",role=\"", role, "\"}"); };
  auto in2 = [&](const char* role, const std::string& more) { return strCat("{", sel, ",role=\"", role, "\",", more, "}"); };
  auto p95 = [&](const std::string& bucket, const std::string& selector) {
    return strCat("histogram_quantile(0.95, sum by (le) (rate(", bucket, selector, w, ")))");
  };
  auto worst = [&](const std::string& router_bucket, const std::string& agent_bucket) {
    return strCat("max(label_replace(", p95(router_bucket, strCat("{", sel, "}")), ", \"from\", \"router\", \"\", \"\") or ",
                  "label_replace(", p95(agent_bucket, strCat("{", sel, ",role=~\"decode|both\"}")),
                  ", \"from\", \"decode\", \"\", \"\"))");
  };
  return {
      // As the client sees it: the routers' (streamed requests, routing
      // included) and the decode agents' (every request, queueing at D and
      // the prefill included), whichever is worse.
      {"ttft_p95", worst("tandem_router_ttft_seconds_bucket", "tandem_request_ttft_seconds_bucket"),
       "tandem_router_ttft_seconds_bucket", false},
      {"tpot_p95", worst("tandem_router_tpot_seconds_bucket", "tandem_request_tpot_seconds_bucket"),
       "tandem_router_tpot_seconds_bucket", false},
      {"routers", strCat("count(tandem_router_ttft_seconds_count{", sel, "})"), "tandem_router_ttft_seconds_count", true},
      {"requests_per_s", strCat("sum(rate(tandem_router_decisions_total{", sel, "}", w, "))"),
       "tandem_router_decisions_total", false},
      {"prefill_computed_tokens_per_s", strCat("sum(rate(tandem_engine_prefill_tokens_total", in("prefill"), w, "))"),
       "tandem_engine_prefill_tokens_total", true},
      {"prefill_queue_tokens", strCat("sum(tandem_prefill_queue_tokens", in("prefill"), ")"), "tandem_prefill_queue_tokens",
       true},
      // Arrivals at the window's peak (rates over half the window, at least
      // 15 s): a burst shorter than the interval is sized for, not averaged away.
      {"prefill_arrivals_peak",
       strCat("max_over_time((sum(rate(tandem_engine_prefill_tokens_total", in("prefill"), peak,
              ")) + clamp_min(sum(deriv(tandem_prefill_queue_tokens", in("prefill"), peak, ")), 0))", sub, ")"),
       "tandem_engine_prefill_tokens_total", false},
      {"decode_kv_blocks", strCat("sum(tandem_kv_blocks_capacity", in("decode"), ")"), "tandem_kv_blocks_capacity", false},
      {"prefill_queue_peak",
       strCat("max_over_time(sum(tandem_prefill_queue_tokens", in("prefill"), ")", sub, ")"),
       "tandem_prefill_queue_tokens", false},
      {"prefill_queue_growth", strCat("sum(deriv(tandem_prefill_queue_tokens", in("prefill"), w, "))"),
       "tandem_prefill_queue_tokens", false},
      {"prefill_requests_per_s", strCat("sum(rate(tandem_requests_total", in("prefill"), w, "))"), "tandem_requests_total",
       false},
      {"prefill_capacity", strCat("sum by (pod) (rate(tandem_engine_prefill_tokens_total", in("prefill"), w,
                                  ")) / sum by (pod) (rate(tandem_engine_busy_seconds_total", in("prefill"), w, ")) > 0"),
       "tandem_engine_busy_seconds_total", false},
      // Gauges at the peak of the window's scrapes: a burst between two
      // decisions is not missed.
      // All the KV held (running sequences and resident sessions), and the
      // running sequences' alone (agents before tandem_kv_blocks_sessions
      // count none as sessions').
      {"decode_kv_held", strCat("max_over_time((1 - sum(tandem_kv_blocks_free", in("decode"),
                                ") / sum(tandem_kv_blocks_capacity", in("decode"), "))", sub, ")"),
       "tandem_kv_blocks_capacity", true},
      {"decode_kv_used",
       strCat("max_over_time((1 - (sum(tandem_kv_blocks_free", in("decode"), ") + (sum(tandem_kv_blocks_sessions",
              in("decode"), ") or vector(0))) / sum(tandem_kv_blocks_capacity", in("decode"), "))", sub, ")"),
       "tandem_kv_blocks_capacity", true},
      {"decode_running", strCat("max_over_time(sum(tandem_requests_running", in("decode"), ")", sub, ")"),
       "tandem_requests_running", true},
      {"decode_waiting", strCat("max_over_time(sum(tandem_requests_waiting", in("decode"), ")", sub, ")"),
       "tandem_requests_waiting", false},
      {"generation_tokens_per_s", strCat("sum(rate(tandem_generation_tokens_total", in("decode"), w, "))"),
       "tandem_generation_tokens_total", false},
      {"preemptions_per_s", strCat("sum(rate(tandem_preemptions_total{", sel, "}", w, "))"), "tandem_preemptions_total",
       false},
      {"fallback_share", strCat("sum(rate(tandem_request_path_total", in2("decode", "path=\"fallback\""), w,
                                ")) / sum(rate(tandem_request_path_total", in("decode"), w, ")) >= 0"),
       "tandem_request_path_total", false},
      {"age", strCat("time() - max(timestamp(tandem_kv_blocks_capacity{", sel, "}))"), "tandem_kv_blocks_capacity", false},
  };
}

// A string member of `j`, or `fallback` when it is absent or not a string
// (never throws: the answer is someone else's input).
std::string text(const json& j, const char* key, const std::string& fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}

absl::StatusOr<std::vector<PromSample>> parseQueryResponse(const json& body) {
  if (!body.is_object()) return absl::InvalidArgumentError("Prometheus answer: not a JSON object");
  const std::string status = text(body, "status", "");
  if (status == "error") {
    return absl::InvalidArgumentError(
        strCat("Prometheus: ", text(body, "errorType", "error"), ": ", text(body, "error", "(no message)")));
  }
  if (status != "success") return absl::InvalidArgumentError(strCat("Prometheus answer: status \"", status, "\""));
  const json* data = body.contains("data") ? &body["data"] : nullptr;
  if (!data || !data->is_object()) return absl::InvalidArgumentError("Prometheus answer: no data object");
  const std::string type = text(*data, "resultType", "");
  const json& result = data->contains("result") ? (*data)["result"] : json();
  auto value = [](const json& pair) -> std::optional<double> {
    if (!pair.is_array() || pair.size() != 2 || !pair[1].is_string()) return std::nullopt;
    const std::string& text = pair[1].get_ref<const std::string&>();
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (end == text.c_str() || *end != '\0') return std::nullopt;
    return v;
  };
  std::vector<PromSample> out;
  if (type == "scalar") {
    std::optional<double> v = value(result);
    if (!v) return absl::InvalidArgumentError("Prometheus answer: a malformed scalar");
    if (std::isfinite(*v)) out.push_back(PromSample{{}, *v});
    return out;
  }
  if (type != "vector") return absl::InvalidArgumentError(strCat("Prometheus answer: result type \"", type, "\", expected vector"));
  if (!result.is_array()) return absl::InvalidArgumentError("Prometheus answer: result is not a list");
  for (const json& r : result) {
    PromSample s;
    if (!r.is_object() || !r.contains("value")) return absl::InvalidArgumentError("Prometheus answer: a malformed sample");
    std::optional<double> v = value(r["value"]);
    if (!v) return absl::InvalidArgumentError("Prometheus answer: a sample's value is not [time, \"number\"]");
    if (!std::isfinite(*v)) continue;
    s.value = *v;
    if (r.contains("metric") && r["metric"].is_object()) {
      for (const auto& [k, l] : r["metric"].items()) {
        if (l.is_string()) s.labels[k] = l.get<std::string>();
      }
    }
    out.push_back(std::move(s));
  }
  return out;
}

Signals assembleSignals(const std::vector<SignalQuery>& queries,
                        const std::map<std::string, std::vector<PromSample>>& answers, const std::vector<PodInfo>& pods,
                        int32_t spec_prefill, int32_t spec_decode, double now_s) {
  Signals s;
  s.at_s = now_s;
  s.spec_prefill = spec_prefill;
  s.spec_decode = spec_decode;
  for (const SignalQuery& q : queries) {
    auto it = answers.find(q.name);
    const bool failed = it == answers.end();
    if (failed || (q.required && it->second.empty())) {
      if (std::find(s.missing.begin(), s.missing.end(), q.series) == s.missing.end()) s.missing.push_back(q.series);
    }
  }
  s.ttft_p95_s = single(answers, "ttft_p95");
  s.tpot_p95_s = single(answers, "tpot_p95");
  const double computed = doubleOr(single(answers, "prefill_computed_tokens_per_s"), 0);
  const double growth = doubleOr(single(answers, "prefill_queue_growth"), 0);
  // Arrivals are what was computed plus what the queue grew by.
  s.uncached_prompt_tokens_per_s =
      std::max({0.0, computed + std::max(0.0, growth), doubleOr(single(answers, "prefill_arrivals_peak"), 0)});
  s.decode_kv_total_blocks = std::max(0.0, doubleOr(single(answers, "decode_kv_blocks"), 0));
  s.prefill_queue_tokens = std::max(0.0, doubleOr(single(answers, "prefill_queue_tokens"), 0));
  s.prefill_queue_peak_tokens =
      std::max(s.prefill_queue_tokens, doubleOr(single(answers, "prefill_queue_peak"), 0));
  const double prefill_requests = doubleOr(single(answers, "prefill_requests_per_s"), 0);
  s.mean_uncached_prompt_tokens = prefill_requests > 0 ? computed / prefill_requests : 0;
  // Running sequences' KV, and with the resident sessions' (the working
  // set; every resident session counts, however long ago its last turn).
  s.decode_kv_used_ratio = std::clamp(doubleOr(single(answers, "decode_kv_used"), 0), 0.0, 1.0);
  s.decode_kv_active_ratio =
      std::clamp(doubleOr(single(answers, "decode_kv_held"), s.decode_kv_used_ratio), s.decode_kv_used_ratio, 1.0);
  s.decode_running = std::max(0.0, doubleOr(single(answers, "decode_running"), 0));
  s.decode_waiting = std::max(0.0, doubleOr(single(answers, "decode_waiting"), 0));
  s.requests_per_s = doubleOr(single(answers, "requests_per_s"), 0);
  s.generation_tokens_per_s = doubleOr(single(answers, "generation_tokens_per_s"), 0);
  s.preemptions_per_s = doubleOr(single(answers, "preemptions_per_s"), 0);
  s.fallback_share = std::clamp(doubleOr(single(answers, "fallback_share"), 0), 0.0, 1.0);
  s.age_s = std::max(0.0, doubleOr(single(answers, "age"), 0));
  std::map<std::string, double> capacity;
  if (auto it = answers.find("prefill_capacity"); it != answers.end()) {
    for (const PromSample& p : it->second) {
      if (auto pod = p.labels.find("pod"); pod != p.labels.end()) capacity[pod->second] = p.value;
    }
  }
  for (const PodInfo& p : pods) {
    if (p.deleting) continue;
    ReplicaSample r{.name = p.name, .ready = p.ready, .ready_for_s = p.ready ? std::max(0.0, now_s - p.ready_since_s) : 0};
    r.unschedulable = p.unschedulable;
    if (auto c = capacity.find(p.name); c != capacity.end()) r.capacity = c->second;
    (p.role == PlanRole::kPrefill ? s.prefill : s.decode).push_back(std::move(r));
  }
  return s;
}

std::optional<double> measuredStartup(const std::vector<PodInfo>& pods, PlanRole role) {
  std::optional<double> out;
  for (const PodInfo& p : pods) {
    // A restarted container moved the Ready condition since: its time is not a start-up's.
    if (p.role != role || !p.ready || p.restarts > 0 || p.ready_since_s < p.created_s) continue;
    out = std::max(out.value_or(0), std::min(kMaxStartupS, p.ready_since_s - p.created_s));
  }
  return out;
}

}  // namespace tandem::planner
