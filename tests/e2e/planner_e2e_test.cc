// The planner end to end on the local cluster: the real Prometheus scrapes
// the pool's pods (the kubelet keeps its targets), the operator reads it and
// writes the pool's replicas. On 2 cores an added replica adds no capacity,
// so what is checked is the loop and its reasons: the SLO targets are set so
// that the phase's load misses one role's target by orders of magnitude
// (a user changing targets with kubectl), and the planner must move that
// role, say why in events and status, never fail a request, and give the
// replicas back after the cooldown once the load is gone. What the
// decisions do to capacity is tandem-sim's job (docs/planner.md).

#include <atomic>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/e2e/operator_fixture.h"
#include "tests/testing/prometheus.h"

namespace tandem::e2e {
namespace {

using ::testing::HasSubstr;

class PlannerE2eTest : public OperatorTest {
 protected:
  std::vector<std::string> operatorArgs() override {
    prometheus_ = testutil::PrometheusServer::start(dir_ + "/prometheus", dir_ + "/scrape-targets.json");
    if (!prometheus_) {
      ADD_FAILURE() << "prometheus did not start";
      return {};
    }
    return {"--prometheus-url", prometheus_->url()};
  }
  void TearDown() override {
    OperatorTest::TearDown();
    prometheus_.reset();
  }
  std::unique_ptr<testutil::PrometheusServer> prometheus_;
};

// Clients that keep sending one kind of request until stopped.
class Load {
 public:
  Load(std::function<std::string()> send, int clients) {
    for (int i = 0; i < clients; ++i) {
      threads_.emplace_back([this, send] {
        while (!stop_) {
          const std::string out = send();
          (out.find("\"choices\"") != std::string::npos ? ok_ : failed_)++;
          if (out.find("\"choices\"") == std::string::npos && last_error_.empty()) last_error_ = out;
        }
      });
    }
  }
  ~Load() { stop(); }
  void stop() {
    stop_ = true;
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  int ok() const { return ok_; }
  int failed() const { return failed_; }
  std::string lastError() const { return last_error_; }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> ok_{0}, failed_{0};
  std::string last_error_;
  std::vector<std::thread> threads_;
};

TEST_F(PlannerE2eTest, ThePlannerMovesTheRoleThatMissesItsTargetAndGivesReplicasBackWhenTheLoadGoes) {
  ASSERT_NE(prometheus_, nullptr);
  apply("pool.yaml", pool("tiny", R"(  engine: {numBlocks: 2048}
  prefill: {replicas: 1, args: [--kv-tls, "posix,cma,tcp"]}
  decode: {replicas: 1, args: [--kv-tls, "posix,cma,tcp"]}
  autoscaling:
    enabled: true
    interval: 4s
    warmup: 0s
    ttftP95TargetSeconds: 0.000001
    tpotP95TargetSeconds: 10
    prefill: {min: 1, max: 2}
    decode: {min: 1, max: 2}
    scaleUpCooldown: 4s
    scaleDownCooldown: 16s
)"));
  ASSERT_TRUE(eventually([&] { return condition("tiny", "Ready", "status") == "True"; }, 120))
      << kubectl("get tpool tiny -o yaml").output << kubectl("get pods -o wide").output << operatorLog();
  // Prometheus finds the pods through the kubelet's file and the planner gets every series.
  ASSERT_TRUE(eventually([&] { return condition("tiny", "Autoscaling", "reason") == "Active"; }, 60))
      << kubectl("get tpool tiny -o yaml").output << operatorLog() << prometheus_->log()
      << readFile(dir_ + "/scrape-targets.json");
  const std::string endpoint = get("tpool tiny", "{.status.endpoint}");
  ASSERT_FALSE(endpoint.empty());
  auto send = [&](const std::string& prompt, int max_tokens) {
    const std::string body = R"({"model":"tiny","prompt":")" + prompt + R"(","max_tokens":)" +
                             std::to_string(max_tokens) + R"(,"ignore_eos":true})";
    return shell("curl -s -m 120 http://" + endpoint + "/v1/completions -H 'Content-Type: application/json' -d '" +
                 body + "'")
        .output;
  };
  auto replicas = [&](const char* role) { return get("tpool tiny", std::string("{.spec.") + role + ".replicas}"); };
  auto events = [&] { return kubectl("get events --field-selector involvedObject.kind=InferencePool").output; };

  // 1. Prefill-heavy (long prompts, one token each) from more clients than
  // one prefill agent keeps up with: it is busy all the time, and a TTFT
  // target no prompt meets leaves utilisation alone to size it: a prefill
  // replica is added. Ten clients keep P's queue from running dry when the
  // machine is loaded (each request is a curl process through the router
  // and D, whose overheads then grow as much as P's compute).
  // Each prompt starts with its own number: P computes all of it (one
  // prompt repeated is a prefix-cache hit on P after the first, which left P
  // idle and the scale-up to chance).
  std::string long_prompt;
  for (int i = 0; i < 300; ++i) long_prompt += "word" + std::to_string(i) + " ";
  std::atomic<int> prompt_number{0};
  int total_ok = 0, total_failed = 0;
  {
    Load load([&] { return send(std::to_string(prompt_number++) + " " + long_prompt, 1); }, 10);
    EXPECT_TRUE(eventually([&] { return replicas("prefill") == "2"; }, 120))
        << kubectl("get tpool tiny -o yaml").output << events() << operatorLog();
    EXPECT_THAT(events(), HasSubstr("prefill 1 -> 2 (ScaleUp)"));
    EXPECT_EQ(get("tpool tiny", "{.status.lastScaling.prefill.reason}"), "ScaleUp");
    EXPECT_EQ(replicas("decode"), "1") << "decode met its target";
    load.stop();
    total_ok += load.ok();
    total_failed += load.failed();
    EXPECT_EQ(load.failed(), 0) << load.lastError();
  }
  EXPECT_TRUE(eventually([&] { return kubectl("get tpool tiny").output.find("2/2") != std::string::npos; }, 60))
      << kubectl("get tpool tiny").output;

  // 2. Decode-heavy (short prompts, long answers) and the targets turned
  // around: decode grows, and prefill shrinks once its cooldown has passed.
  ASSERT_EQ(kubectl("patch tpool tiny --type merge -p "
                    "'{\"spec\":{\"autoscaling\":{\"ttftP95TargetSeconds\":100,\"tpotP95TargetSeconds\":0.000001}}}'")
                .rc,
            0);
  {
    Load load([&] { return send("hi", 64); }, 3);
    EXPECT_TRUE(eventually([&] { return replicas("decode") == "2"; }, 120)) << events() << operatorLog();
    EXPECT_THAT(events(), HasSubstr("decode 1 -> 2 (ScaleUp)"));
    EXPECT_TRUE(eventually([&] { return replicas("prefill") == "1"; }, 120)) << events() << operatorLog();
    EXPECT_THAT(events(), HasSubstr("prefill 2 -> 1 (ScaleDown)"));
    load.stop();
    total_ok += load.ok();
    total_failed += load.failed();
    EXPECT_EQ(load.failed(), 0) << load.lastError();
  }

  // 3. The load goes (and TPOT is met again): decode is given back after the cooldown.
  ASSERT_EQ(kubectl("patch tpool tiny --type merge -p '{\"spec\":{\"autoscaling\":{\"tpotP95TargetSeconds\":10}}}'").rc, 0);
  EXPECT_TRUE(eventually([&] { return replicas("decode") == "1"; }, 120)) << events() << operatorLog();
  EXPECT_THAT(events(), HasSubstr("decode 2 -> 1 (ScaleDown)"));
  EXPECT_TRUE(eventually([&] { return get("tpool tiny", "{.status.decode.summary}") == "1/1"; }, 120));
  EXPECT_GT(total_ok, 10);
  EXPECT_EQ(total_failed, 0);

  // 4. A user's edit while the planner is on is kept, and said so.
  ASSERT_EQ(kubectl("patch tpool tiny --type merge -p '{\"spec\":{\"prefill\":{\"replicas\":2}}}'").rc, 0);
  EXPECT_TRUE(eventually([&] { return events().find("ManualOverride") != std::string::npos; }, 30)) << events();
  EXPECT_EQ(replicas("prefill"), "2");

  // 5. Growth is checked between intervals: with an interval of an hour
  // (one more decision, then none for the rest of the test) and a check
  // every second, decode-heavy load with a TPOT target no step meets again
  // grows decode (given back in 3.), and only a check can have done it.
  auto checked_growths = [&] {
    const std::string e = events();
    size_t n = 0;
    for (size_t at = e.find("decode 1 -> 2 (ScaleUp): checked between intervals"); at != std::string::npos;
         at = e.find("decode 1 -> 2 (ScaleUp): checked between intervals", at + 1)) {
      ++n;
    }
    return n;
  };
  const size_t checked_before = checked_growths();
  ASSERT_EQ(replicas("decode"), "1");
  ASSERT_EQ(kubectl("patch tpool tiny --type merge -p '{\"spec\":{\"autoscaling\":{\"interval\":\"1h\","
                    "\"scaleUpCheck\":\"1s\",\"ttftP95TargetSeconds\":100,\"tpotP95TargetSeconds\":0.000001}}}'")
                .rc,
            0);
  {
    Load load([&] { return send("hi", 64); }, 3);
    EXPECT_TRUE(eventually([&] { return checked_growths() > checked_before; }, 120))
        << kubectl("get tpool tiny -o yaml").output << events() << operatorLog();
    EXPECT_EQ(replicas("decode"), "2");
    load.stop();
    EXPECT_EQ(load.failed(), 0) << load.lastError();
  }

  // Paused: the condition says so and the replicas are the user's.
  ASSERT_EQ(kubectl("patch tpool tiny --type merge -p '{\"spec\":{\"autoscaling\":{\"enabled\":false}}}'").rc, 0);
  EXPECT_TRUE(eventually([&] { return condition("tiny", "Autoscaling", "reason") == "Paused"; }, 30));
  // The operator's planner metrics and the pool's SLO targets.
  const std::string m = shell("curl -s -m 5 http://127.0.0.1:" + std::to_string(metrics_port_) + "/metrics").output;
  EXPECT_THAT(m, HasSubstr("tandem_planner_decisions_total{namespace=\"default\",pool=\"tiny\",reason=\"ScaleUp\",role=\"prefill\"}"));
  EXPECT_THAT(m, HasSubstr("tandem_pool_slo_target_seconds{namespace=\"default\",pool=\"tiny\",slo=\"ttft_p95\"}"));
}

}  // namespace
}  // namespace tandem::e2e
