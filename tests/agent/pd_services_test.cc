// The P/D services in one process on a FakeClock: a prefill and a decode
// service, each with its own engine, over a real UCX transport on loopback.
// The prefill side's layer announcements are held by the fault-injecting
// transport (on the same fake clock), so the decode side's deadline decides
// the outcome, and it fires when the test advances time: the watchdog waits
// on the clock, not on a timer of its own. (Where deadlines fall relative to
// each other is pure logic: tests/agent/pd_transfer_test.cc.)

#include <gtest/gtest.h>

#include "agent/decode_service.h"
#include "agent/pd_metrics.h"
#include "agent/prefill_service.h"
#include "tests/agent/faults/fault_transport.h"
#include "tests/engine/engine_test_util.h"
#include "tests/testing/quiet_logs.h"
#include "tests/testing/wait.h"

namespace tandem::agent {
namespace {

using kvproto::FailureReason;
using testutil::waitFor;

std::unique_ptr<engine::EngineLoop> makeLoop(Clock& clock) {
  engine::EngineOptions o;
  o.num_blocks = 64;
  auto e = engine::Engine::create(o, engine::testing::tinyWeights(), engine::makeCpuBackend(),
                                  std::make_shared<engine::ByteTokenizer>(), clock);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::make_unique<engine::EngineLoop>(std::move(*e));
}

struct Outcome {
  absl::Mutex mu;
  bool finished ABSL_GUARDED_BY(mu) = false;
  std::optional<FailureReason> failure ABSL_GUARDED_BY(mu);
};

class PdServicesTest : public ::testing::Test {
 protected:
  void start(PdOptions d_options) {
    PdOptions options;
    options.transport = {.host = "127.0.0.1", .port = 0, .tls = "tcp"};
    // P holds every layer announcement for an hour of fake time.
    const auto held =
        testing::faultInjectingTransport({.layer_delay = std::chrono::hours(1)}, clock_, ucxTransportFactory());
    auto p =
        PrefillService::start({.loop = *p_loop_, .metrics = p_metrics_, .clock = clock_, .transport = held}, options);
    ASSERT_TRUE(p.ok()) << p.status();
    prefill_ = std::move(*p);
    d_options.transport = options.transport;
    d_options.prefill_peers = std::make_shared<StaticPeerDirectory>(
        std::vector<PeerAddress>{{.host = "127.0.0.1", .port = prefill_->port()}});
    auto d = DecodeService::start({.loop = *d_loop_, .metrics = d_metrics_, .clock = clock_}, d_options);
    ASSERT_TRUE(d.ok()) << d.status();
    decode_ = std::move(*d);
  }

  void TearDown() override {
    decode_.reset();
    prefill_.reset();
  }

  std::shared_ptr<Outcome> submit() {
    auto out = std::make_shared<Outcome>();
    engine::RequestSpec spec;
    spec.prompt = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29};
    spec.sampling.max_tokens = 4;
    decode_->submit(std::move(spec), [out](const engine::RequestUpdate& u, const PdInfo& info) {
      if (!u.finished) return;
      absl::MutexLock lock(&out->mu);
      out->finished = true;
      out->failure = info.failure;
    });
    return out;
  }

  static bool finished(Outcome& o) {
    absl::MutexLock lock(&o.mu);
    return o.finished;
  }

  // The prefill agent accepted (its lease is pinned once the prefill is
  // computed) and the decode side counts the transfer in flight.
  bool transferUnderway() { return d_metrics_.inflight.value() == 1 && p_loop_->numLive() == 0; }

  FakeClock clock_;
  metrics::Registry p_registry_, d_registry_;
  PdMetrics p_metrics_{p_registry_, {{"role", "prefill"}}};
  PdMetrics d_metrics_{d_registry_, {{"role", "decode"}}};
  std::unique_ptr<engine::EngineLoop> p_loop_ = makeLoop(clock_);
  std::unique_ptr<engine::EngineLoop> d_loop_ = makeLoop(clock_);
  std::unique_ptr<PrefillService> prefill_;
  std::unique_ptr<DecodeService> decode_;
};

TEST_F(PdServicesTest, PrefillTimeoutFiresWhenTheClockPassesIt) {
  start({.lease_ttl = std::chrono::hours(2), .prefill_timeout = std::chrono::seconds(60)});
  auto out = submit();
  ASSERT_TRUE(waitFor([&] { return transferUnderway(); }));
  clock_.advance(std::chrono::seconds(60));
  ASSERT_TRUE(waitFor([&] { return finished(*out); }));
  absl::MutexLock lock(&out->mu);
  EXPECT_EQ(out->failure, FailureReason::kPrefillTimeout);
}

}  // namespace
}  // namespace tandem::agent
