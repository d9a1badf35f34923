// WorkerEventsPublisher through its sink seam, on a FakeClock: a snapshot
// then every delta in order, batching, load coalescing, heartbeats, a slow
// subscriber dropped rather than waited for.

#include "agent/worker_events.h"

#include <gtest/gtest.h>

#include <atomic>

#include "absl/synchronization/mutex.h"
#include "agent/worker_events_json.h"
#include "tests/testing/quiet_logs.h"
#include "tests/testing/wait.h"

namespace tandem::agent {
namespace {

using routing::WorkerDelta;
using routing::WorkerLoad;
using routing::WorkerSnapshot;
using testutil::waitFor;

// Records what the publisher sends; its backlog is whatever the test says.
class RecordingSink final : public WorkerEventSink {
 public:
  bool send(std::string_view message) override {
    absl::MutexLock lock(&mu_);
    if (closed_) return false;
    auto e = decodeWorkerEvent(message);
    EXPECT_TRUE(e.ok()) << e.status();
    if (e.ok()) events_.push_back(std::move(*e));
    return true;
  }
  size_t numUnsentBytes() const override { return unsent.load(); }
  void close() override {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }

  std::vector<WorkerEvent> events() const {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  size_t size() const {
    absl::MutexLock lock(&mu_);
    return events_.size();
  }
  bool closed() const {
    absl::MutexLock lock(&mu_);
    return closed_;
  }
  // Waits for `n` messages; false if they did not come.
  bool waitForSize(size_t n) const {
    return waitFor([&] { return size() >= n; });
  }

  std::atomic<size_t> unsent{0};

 private:
  mutable absl::Mutex mu_;
  std::vector<WorkerEvent> events_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

engine::StepStats stats(int running, int free_blocks = 100) {
  engine::StepStats s;
  s.num_running = running;
  s.num_free_blocks = free_blocks;
  s.num_total_blocks = 128;
  return s;
}

engine::RoutableChanges stored(std::vector<uint64_t> hashes) {
  engine::RoutableChanges c;
  for (uint64_t h : hashes) c.blocks.push_back({engine::KvEvent::Kind::kStored, BlockHash(h)});
  return c;
}

class WorkerEventsTest : public ::testing::Test {
 protected:
  void start(WorkerEventsOptions o = {}) {
    o.worker = "w0";
    o.clock = &clock_;
    o.initial_load = workerLoad(stats(0), false);
    publisher_ = WorkerEventsPublisher::start(o, registry_, {{"pool", "p"}, {"role", "both"}});
  }
  std::shared_ptr<RecordingSink> subscribe() {
    auto sink = std::make_shared<RecordingSink>();
    publisher_->subscribe(sink);
    EXPECT_TRUE(sink->waitForSize(1));
    return sink;
  }
  double metric(const std::string& name) {
    const std::string text = metrics::serializeText(registry_);
    const size_t at = text.find(name + "{");
    if (at == std::string::npos) return -1;
    const size_t eol = text.find('\n', at);
    return std::stod(text.substr(text.rfind(' ', eol) + 1, eol));
  }

  FakeClock clock_;
  metrics::Registry registry_;
  std::unique_ptr<WorkerEventsPublisher> publisher_;
};

const WorkerDelta& delta(const WorkerEvent& e) { return std::get<WorkerDelta>(e); }

TEST_F(WorkerEventsTest, SnapshotHoldsTheStateThenEveryLaterDeltaInOrder) {
  start();
  publisher_->onEngineStep(stored({1, 2}), stats(0));
  auto sink = subscribe();
  const WorkerSnapshot snap = std::get<WorkerSnapshot>(sink->events()[0]);
  EXPECT_EQ(snap.seq, 1u);
  EXPECT_EQ(snap.epoch, publisher_->epoch());
  EXPECT_EQ(snap.worker, "w0");
  EXPECT_EQ(snap.cached.size(), 2u);

  // One step: 1 evicted, then 3 and 4 stored: two messages, order kept.
  engine::RoutableChanges c = stored({3, 4});
  c.blocks.insert(c.blocks.begin(), {engine::KvEvent::Kind::kRemoved, BlockHash(1)});
  publisher_->onEngineStep(c, stats(0));
  ASSERT_TRUE(sink->waitForSize(3));
  const auto events = sink->events();
  EXPECT_EQ(delta(events[1]).seq, 2u);
  EXPECT_EQ(std::get<routing::BlocksRemoved>(delta(events[1]).body).hashes, std::vector<BlockHash>{BlockHash(1)});
  EXPECT_EQ(delta(events[2]).seq, 3u);
  EXPECT_EQ(std::get<routing::BlocksStored>(delta(events[2]).body).hashes,
            (std::vector<BlockHash>{BlockHash(3), BlockHash(4)}));

  // A later subscriber's snapshot holds all of it.
  auto late = subscribe();
  const WorkerSnapshot snap2 = std::get<WorkerSnapshot>(late->events()[0]);
  EXPECT_EQ(snap2.seq, 3u);
  std::vector<BlockHash> cached = snap2.cached;
  std::sort(cached.begin(), cached.end());
  EXPECT_EQ(cached, (std::vector<BlockHash>{BlockHash(2), BlockHash(3), BlockHash(4)}));
  EXPECT_EQ(metric("tandem_events_subscribers"), 2);
  EXPECT_EQ(metric("tandem_events_snapshots_sent_total"), 2);
  EXPECT_EQ(metric("tandem_events_deltas_sent_total"), 2);
}

// Load changes within load_interval are held back and only the latest is
// sent when the interval ends. A block delta pushed after them is the
// barrier: a load delta sent early would come before it.
TEST_F(WorkerEventsTest, LoadIsCoalescedToTheLatestValuePerInterval) {
  start({.load_interval = std::chrono::milliseconds(50)});
  auto sink = subscribe();
  publisher_->onEngineStep({}, stats(1));  // the first change goes out at once
  ASSERT_TRUE(sink->waitForSize(2));
  EXPECT_EQ(std::get<WorkerLoad>(delta(sink->events()[1]).body).running, 1);
  publisher_->onEngineStep({}, stats(2));
  publisher_->onEngineStep({}, stats(3));
  publisher_->onEngineStep(stored({9}), stats(3));
  ASSERT_TRUE(sink->waitForSize(3));
  EXPECT_TRUE(std::holds_alternative<routing::BlocksStored>(delta(sink->events()[2]).body));
  clock_.advance(std::chrono::milliseconds(50));
  ASSERT_TRUE(sink->waitForSize(4));
  const auto events = sink->events();
  EXPECT_EQ(std::get<WorkerLoad>(delta(events[3]).body).running, 3);  // 2 never went out
  EXPECT_EQ(delta(events[3]).seq, 3u);
}

TEST_F(WorkerEventsTest, DrainingIsSentAtOnce) {
  start({.load_interval = std::chrono::seconds(10)});
  auto sink = subscribe();
  publisher_->onEngineStep({}, stats(1));
  ASSERT_TRUE(sink->waitForSize(2));
  publisher_->setDraining(true);  // within the interval, yet not held back
  ASSERT_TRUE(sink->waitForSize(3));
  const WorkerLoad l = std::get<WorkerLoad>(delta(sink->events()[2]).body);
  EXPECT_TRUE(l.draining);
  EXPECT_EQ(l.running, 1);
}

TEST_F(WorkerEventsTest, DrainingAndIdleEndsEveryStream) {
  start();
  auto sink = subscribe();
  publisher_->onEngineStep({}, stats(1));
  publisher_->setDraining(true);
  ASSERT_TRUE(sink->waitForSize(3));
  EXPECT_FALSE(sink->closed());  // a request still runs
  publisher_->onEngineStep({}, stats(0));
  ASSERT_TRUE(waitFor([&] { return sink->closed(); }));
  // What it was owed went out first: the last load says draining and idle.
  const WorkerLoad last = std::get<WorkerLoad>(delta(sink->events().back()).body);
  EXPECT_TRUE(last.draining);
  EXPECT_EQ(last.running, 0);
}

// An engine that never stepped is idle: draining ends the streams at once.
TEST_F(WorkerEventsTest, DrainingBeforeAnyStepEndsEveryStream) {
  start();
  auto sink = subscribe();
  publisher_->setDraining(true);
  ASSERT_TRUE(waitFor([&] { return sink->closed(); }));
  EXPECT_TRUE(std::get<WorkerLoad>(delta(sink->events().back()).body).draining);
}

TEST_F(WorkerEventsTest, IdleStreamGetsAHeartbeatWithItsSeq) {
  start({.heartbeat_interval = std::chrono::seconds(5)});
  publisher_->onEngineStep(stored({1}), stats(0));
  auto sink = subscribe();
  clock_.advance(std::chrono::seconds(5));
  ASSERT_TRUE(sink->waitForSize(2));
  EXPECT_EQ(std::get<WorkerHeartbeat>(sink->events()[1]), (WorkerHeartbeat{.epoch = publisher_->epoch(), .seq = 1}));
}

TEST_F(WorkerEventsTest, SessionStoredAgainUnchangedIsNotRepeated) {
  start();
  auto sink = subscribe();
  engine::RoutableChanges c;
  c.sessions.push_back({.id = SessionId("s"), .resident = true, .hashes = {BlockHash(5)}, .num_tokens = 20});
  publisher_->onEngineStep(c, stats(0));
  publisher_->onEngineStep(c, stats(0));  // taken and put back unchanged
  c.sessions[0] = {.id = SessionId("s"), .resident = false};
  publisher_->onEngineStep(c, stats(0));
  publisher_->onEngineStep(c, stats(0));  // not resident before either
  ASSERT_TRUE(sink->waitForSize(3));
  publisher_->onEngineStep(stored({1}), stats(0));  // barrier
  ASSERT_TRUE(sink->waitForSize(4));
  const auto events = sink->events();
  ASSERT_EQ(events.size(), 4u);
  const auto& s = std::get<routing::SessionStored>(delta(events[1]).body).state;
  EXPECT_EQ(s.session, SessionId("s"));
  EXPECT_EQ(s.num_tokens, 20);
  EXPECT_EQ(std::get<routing::SessionRemoved>(delta(events[2]).body).session, SessionId("s"));
  EXPECT_TRUE(std::holds_alternative<routing::BlocksStored>(delta(events[3]).body));
}

// A subscriber whose backlog stays over max_unsent_bytes falls behind the
// buffer and is closed; the engine side never waits, and another
// subscriber gets every delta.
TEST_F(WorkerEventsTest, SlowSubscriberIsDroppedAndOthersGetEverything) {
  start({.max_buffered_deltas = 4, .max_unsent_bytes = 100});
  auto fast = subscribe();
  auto slow = subscribe();
  slow->unsent = 1000;
  for (uint64_t h = 1; h <= 20; ++h) publisher_->onEngineStep(stored({h}), stats(0));
  ASSERT_TRUE(fast->waitForSize(21));
  ASSERT_TRUE(waitFor([&] { return slow->closed(); }));
  EXPECT_EQ(slow->size(), 1u);  // the snapshot only
  const auto events = fast->events();
  for (uint64_t i = 1; i <= 20; ++i) EXPECT_EQ(delta(events[i]).seq, i);
  EXPECT_TRUE(waitFor([&] { return metric("tandem_events_subscribers_dropped_total") == 1; }));
  EXPECT_TRUE(waitFor([&] { return metric("tandem_events_subscribers") == 1; }));
}

// Held back but still within the buffer: it catches up once it drains.
TEST_F(WorkerEventsTest, HeldBackSubscriberCatchesUpWithinTheBuffer) {
  start({.max_buffered_deltas = 16, .max_unsent_bytes = 100});
  auto sink = subscribe();
  sink->unsent = 1000;
  for (uint64_t h = 1; h <= 5; ++h) publisher_->onEngineStep(stored({h}), stats(0));
  sink->unsent = 0;
  publisher_->onEngineStep(stored({6}), stats(0));  // new deltas retry it
  ASSERT_TRUE(sink->waitForSize(7));
  EXPECT_FALSE(sink->closed());
  EXPECT_EQ(delta(sink->events()[6]).seq, 6u);
}

TEST_F(WorkerEventsTest, UnsubscribedSinkGetsNothingMore) {
  start();
  auto sink = std::make_shared<RecordingSink>();
  const uint64_t id = publisher_->subscribe(sink);
  ASSERT_TRUE(sink->waitForSize(1));
  publisher_->unsubscribe(id);
  ASSERT_TRUE(waitFor([&] { return metric("tandem_events_subscribers") == 0; }));
  auto other = subscribe();
  publisher_->onEngineStep(stored({1}), stats(0));
  ASSERT_TRUE(other->waitForSize(2));
  EXPECT_EQ(sink->size(), 1u);  // the delta went to `other` and not here
}

}  // namespace
}  // namespace tandem::agent
