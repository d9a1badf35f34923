// The fault-injecting transport on a FakeClock in front of a fake inner
// transport (pure logic: what reaches the inner one, and when each get's
// completion is handed on). Every get's `done` runs exactly once.

#include "tests/agent/faults/fault_transport.h"

#include <gtest/gtest.h>

#include <map>

#include "agent/transport/ucx_transport.h"
#include "src/kvproto/kvproto.h"
#include "tests/testing/wait.h"

namespace tandem::agent::testing {
namespace {

using transport::ConnId;
using transport::GetId;
using transport::KvTransport;

// Records commands; the test completes gets by hand.
class FakeInner final : public KvTransport {
 public:
  void shutdown() override {
    std::map<GetId, std::function<void(absl::Status)>> gets;
    {
      absl::MutexLock lock(&mu_);
      gets.swap(gets_);
    }
    for (auto& [id, done] : gets) done(absl::CancelledError("shut down"));
  }
  int port() const override { return 1; }
  uint64_t regionBase() const override { return 0; }
  const std::string& packedRkey() const override { return rkey_; }
  ConnId connect(const std::string&, int) override { return 1; }
  void send(ConnId, std::vector<uint8_t> bytes) override {
    absl::MutexLock lock(&mu_);
    sent_.push_back(std::move(bytes));
  }
  void setRemoteRegion(ConnId, uint64_t, uint64_t, std::string) override {}
  void close(ConnId) override {}
  GetId getv(ConnId, std::vector<Segment>, std::function<void(absl::Status)> done) override {
    absl::MutexLock lock(&mu_);
    gets_[next_] = std::move(done);
    return next_++;
  }
  void cancelGet(GetId) override {}
  uint64_t ucxGetsIssued() const override { return 0; }

  int numGets() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(gets_.size());
  }
  int numSent() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(sent_.size());
  }
  void completeAll() {
    std::map<GetId, std::function<void(absl::Status)>> gets;
    {
      absl::MutexLock lock(&mu_);
      gets.swap(gets_);
    }
    for (auto& [id, done] : gets) done(absl::OkStatus());
  }

 private:
  std::string rkey_;
  absl::Mutex mu_;
  std::map<GetId, std::function<void(absl::Status)>> gets_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<uint8_t>> sent_ ABSL_GUARDED_BY(mu_);
  GetId next_ ABSL_GUARDED_BY(mu_) = 1;
};

struct Done {
  absl::Mutex mu;
  std::vector<absl::Status> calls ABSL_GUARDED_BY(mu);
  std::function<void(absl::Status)> callback() {
    return [this](absl::Status s) {
      absl::MutexLock lock(&mu);
      calls.push_back(std::move(s));
    };
  }
  size_t count() {
    absl::MutexLock lock(&mu);
    return calls.size();
  }
};

class FaultTransportTest : public ::testing::Test {
 protected:
  std::unique_ptr<KvTransport> start(FaultOptions options) {
    auto factory = faultInjectingTransport(options, clock_,
                                           [this](const transport::TransportOptions&, transport::TransportCallbacks) {
                                             auto inner = std::make_unique<FakeInner>();
                                             inner_ = inner.get();
                                             return absl::StatusOr<std::unique_ptr<KvTransport>>(std::move(inner));
                                           });
    auto t = factory(transport::TransportOptions{}, {});
    EXPECT_TRUE(t.ok()) << t.status();
    return std::move(*t);
  }

  FakeClock clock_;
  FakeInner* inner_ = nullptr;
  transport::TransportCallbacks callbacks_;  // the wrapped ones the inner transport got
};

TEST_F(FaultTransportTest, DelayedGetIsIssuedWhenTheClockReachesIt) {
  auto t = start({.get_delay = std::chrono::seconds(1)});
  Done done;
  t->getv(1, {}, done.callback());
  EXPECT_EQ(inner_->numGets(), 0);
  clock_.advance(std::chrono::seconds(1));
  ASSERT_TRUE(testutil::waitFor([&] { return inner_->numGets() == 1; }));
  inner_->completeAll();
  ASSERT_TRUE(testutil::waitFor([&] { return done.count() == 1; }));
  t->shutdown();
  EXPECT_EQ(done.count(), 1u);
}

TEST_F(FaultTransportTest, ADelayedGetCancelledBeforeItIsIssuedCompletesCancelledAndNeverReachesTheWire) {
  auto t = start({.get_delay = std::chrono::hours(1)});
  Done done;
  const GetId id = t->getv(1, {}, done.callback());
  t->cancelGet(id);
  ASSERT_TRUE(testutil::waitFor([&] { return done.count() == 1; }));
  clock_.advance(std::chrono::hours(1));
  t->shutdown();
  EXPECT_EQ(inner_->numGets(), 0);
  absl::MutexLock lock(&done.mu);
  ASSERT_EQ(done.calls.size(), 1u);
  EXPECT_TRUE(absl::IsCancelled(done.calls[0]));
}

TEST_F(FaultTransportTest, HeldCompletionsAreHandedOnLateOrAtShutdown) {
  auto t = start({.get_complete_delay = std::chrono::seconds(5)});
  Done first, second;
  t->getv(1, {}, first.callback());
  inner_->completeAll();
  clock_.advance(std::chrono::seconds(5));
  ASSERT_TRUE(testutil::waitFor([&] { return first.count() == 1; }));
  t->getv(1, {}, second.callback());
  inner_->completeAll();  // held for 5 s of fake time that never pass
  EXPECT_EQ(second.count(), 0u);
  t->shutdown();  // hands it on before returning
  EXPECT_EQ(second.count(), 1u);
  EXPECT_EQ(first.count(), 1u);
}

TEST_F(FaultTransportTest, LayerAnnouncementsLeaveLateOtherMessagesAtOnce) {
  auto t = start({.layer_delay = std::chrono::seconds(2)});
  t->send(1, kvproto::encode({7, kvproto::LayerReady{.layer = 0, .first_block = 0, .checksums = {1}}}));
  t->send(1, kvproto::encode({7, kvproto::PrefillDone{.first_token = 3}}));
  EXPECT_EQ(inner_->numSent(), 1);
  clock_.advance(std::chrono::seconds(2));
  ASSERT_TRUE(testutil::waitFor([&] { return inner_->numSent() == 2; }));
}

TEST_F(FaultTransportTest, FirstTransfersAreAbortedInsteadOfDelivered) {
  std::vector<uint64_t> delivered;
  absl::Mutex mu;
  auto factory = faultInjectingTransport({.fail_first_transfers = 1}, clock_,
                                         [this](const transport::TransportOptions&, transport::TransportCallbacks cb) {
                                           auto inner = std::make_unique<FakeInner>();
                                           inner_ = inner.get();
                                           callbacks_ = std::move(cb);
                                           return absl::StatusOr<std::unique_ptr<KvTransport>>(std::move(inner));
                                         });
  transport::TransportCallbacks cb;
  cb.on_message = [&](ConnId, std::vector<uint8_t> bytes) {
    absl::MutexLock lock(&mu);
    delivered.push_back(kvproto::decode(bytes)->transfer_id);
  };
  auto t = factory(transport::TransportOptions{}, std::move(cb));
  ASSERT_TRUE(t.ok());
  callbacks_.on_message(1, kvproto::encode({1, kvproto::PrefillRequest{.tokens = {1, 2}}}));
  callbacks_.on_message(1, kvproto::encode({2, kvproto::PrefillRequest{.tokens = {1, 2}}}));
  EXPECT_EQ(inner_->numSent(), 1) << "the first request is answered with an Abort";
  absl::MutexLock lock(&mu);
  EXPECT_EQ(delivered, std::vector<uint64_t>{2});
}

}  // namespace
}  // namespace tandem::agent::testing
