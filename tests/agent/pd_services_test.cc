// The P/D services in one process on a FakeClock: a prefill and a decode
// service, each with its own engine, over a real UCX transport on loopback.
// The prefill side's layer announcements are held by the fault-injecting
// transport (on the same fake clock), so the decode side's deadline decides
// the outcome, and it fires when the test advances time: the watchdog waits
// on the clock, not on a timer of its own. Once P accepted, the deadline is
// in proportion to the prompt (prefill_deadline.h); missing it moves the
// request to D's own prefill (the only P was left). (Where deadlines fall
// relative to each other is pure logic: tests/agent/pd_transfer_test.cc.)

#include <gtest/gtest.h>

#include <thread>

#include "agent/decode_service.h"
#include "agent/pd_metrics.h"
#include "agent/prefill_service.h"
#include "src/common/strings.h"
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
  PdPath path ABSL_GUARDED_BY(mu) = PdPath::kDirect;
  std::string moved_from ABSL_GUARDED_BY(mu);
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
      out->path = info.path;
      out->moved_from = info.moved_from_peer;
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

  // Advances the fake clock 50 ms at a time until D gives the transfer up
  // (it stops counting it in flight: moved to its own prefill), giving the
  // watchdog real time to act after each step; returns how far. P's
  // acceptance reaches D at some fake time in the first steps, and the work
  // deadline counts from it: at least the expected time, and at most a few
  // steps more. The local prefill then finishes without the clock.
  Duration advanceUntilMoved() {
    Duration total{0};
    auto moved = [&] { return d_metrics_.inflight.value() == 0; };
    while (!moved() && total < std::chrono::seconds(120)) {
      clock_.advance(std::chrono::milliseconds(50));
      total += std::chrono::milliseconds(50);
      waitFor(moved, std::chrono::milliseconds(10), std::chrono::milliseconds(1));
    }
    return total;
  }

  // The request ended served by D's own prefill, moved off the prefill agent.
  void expectMovedToLocalPrefill(Outcome& o) {
    ASSERT_TRUE(waitFor([&] { return finished(o); }));
    absl::MutexLock lock(&o.mu);
    EXPECT_EQ(o.failure, std::nullopt);
    EXPECT_EQ(o.path, PdPath::kFallback);
    EXPECT_EQ(o.moved_from, strCat("127.0.0.1:", prefill_->port()));
  }

  FakeClock clock_;
  metrics::Registry p_registry_, d_registry_;
  PdMetrics p_metrics_{p_registry_, {{"role", "prefill"}}};
  PdMetrics d_metrics_{d_registry_, {{"role", "decode"}}};
  std::unique_ptr<engine::EngineLoop> p_loop_ = makeLoop(clock_);
  std::unique_ptr<engine::EngineLoop> d_loop_ = makeLoop(clock_);
  std::unique_ptr<PrefillService> prefill_;
  std::unique_ptr<DecodeService> decode_;
};

// A short prompt: the floor (2 s), not the 60 s ceiling.
TEST_F(PdServicesTest, AnAcceptedPrefillThatNeverDeliversMovesAtTheFloor) {
  start({.lease_ttl = std::chrono::hours(2),
         .prefill_timeout = std::chrono::seconds(60),
         .prefill_deadline = {.floor = std::chrono::seconds(2), .slack = 4, .assumed_rate = 1000}});
  auto out = submit();
  ASSERT_TRUE(waitFor([&] { return transferUnderway(); }));
  const Duration took = advanceUntilMoved();
  EXPECT_GE(took, std::chrono::seconds(2));
  EXPECT_LT(took, std::chrono::seconds(3));
  expectMovedToLocalPrefill(*out);
}

// A prompt long for P's rate (20 tokens at an assumed 10 tokens/s, slack
// 4: 8 s) is given its time: past the floor it is still P's, and it moves
// only once the 8 s are over.
TEST_F(PdServicesTest, ALongPrefillIsGivenTimeInProportionToItsTokens) {
  start({.lease_ttl = std::chrono::hours(2),
         .prefill_timeout = std::chrono::seconds(60),
         .prefill_deadline = {.floor = std::chrono::seconds(2), .slack = 4, .assumed_rate = 10}});
  auto out = submit();
  ASSERT_TRUE(waitFor([&] { return transferUnderway(); }));
  const Duration took = advanceUntilMoved();
  EXPECT_GE(took, std::chrono::seconds(8));
  EXPECT_LT(took, std::chrono::seconds(9));
  expectMovedToLocalPrefill(*out);
}

// The ceiling (--prefill-timeout) still holds when it is the earlier one.
TEST_F(PdServicesTest, TheCeilingHoldsWhenItIsEarlierThanTheWorkDeadline) {
  start({.lease_ttl = std::chrono::hours(2),
         .prefill_timeout = std::chrono::seconds(5),
         .prefill_deadline = {.floor = std::chrono::seconds(30), .slack = 4, .assumed_rate = 1000}});
  auto out = submit();
  ASSERT_TRUE(waitFor([&] { return transferUnderway(); }));
  clock_.advance(std::chrono::seconds(5));
  expectMovedToLocalPrefill(*out);
}

}  // namespace
}  // namespace tandem::agent
