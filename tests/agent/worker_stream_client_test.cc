// WorkerStreamClient against the stream served in-process (the publisher
// behind a real HTTP server, or a hand-written stream), all on one
// FakeClock: gaps and epochs resync from one snapshot, a silent stream is
// cut, a worker that is down is stale once however often it is retried,
// and a reader that stops reading is dropped while others keep up.

#include "agent/worker_stream_client.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>

#include "agent/worker_events_http.h"
#include "agent/worker_events_json.h"
#include "src/http/server.h"
#include "tests/agent/worker_stream_recorder.h"
#include "tests/testing/quiet_logs.h"

namespace tandem::agent {
namespace {

using routing::WorkerDelta;
using testing::StreamRecorder;
using testutil::waitFor;

engine::RoutableChanges stored(std::vector<uint64_t> hashes) {
  engine::RoutableChanges c;
  for (uint64_t h : hashes) c.blocks.push_back({engine::KvEvent::Kind::kStored, BlockHash(h)});
  return c;
}

class WorkerStreamClientTest : public ::testing::Test {
 protected:
  // Serves `publisher_` (started with `options`) unless `handler` is given.
  void serve(WorkerEventsOptions options = {}, http::Handler handler = nullptr) {
    options.worker = "w0";
    options.clock = &clock_;
    publisher_ = WorkerEventsPublisher::start(options, registry_, {{"pool", "p"}, {"role", "both"}});
    http::Routes routes;
    routes.handle(
        "GET", "/internal/v1/events",
        handler ? handler : [this](http::Request&) { return serveWorkerEvents(*publisher_); });
    auto server = http::Server::start({.clock = &clock_, .library = library_}, std::move(routes));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  void connect() {
    client_ = WorkerStreamClient::start({.url = server_->baseUrl(),
                                         .stale_after = std::chrono::seconds(15),
                                         .backoff_initial = std::chrono::milliseconds(100),
                                         .backoff_max = std::chrono::seconds(1),
                                         .clock = &clock_},
                                        recorder_.callbacks());
  }
  // Moves time on (a second at a time) until `done`.
  bool advanceUntil(const std::function<bool()>& done, Duration step = std::chrono::seconds(1)) {
    return waitFor(
        [&] {
          if (done()) return true;
          clock_.advance(step);
          return done();
        },
        std::chrono::seconds(30), std::chrono::milliseconds(5));
  }
  void TearDown() override {
    client_.reset();
    if (server_) server_->shutdown(Duration(0));
  }

  FakeClock clock_;
  http::ServerLibrary library_ = http::ServerLibrary::kBeast;
  metrics::Registry registry_;
  std::unique_ptr<WorkerEventsPublisher> publisher_;
  std::unique_ptr<http::Server> server_;
  StreamRecorder recorder_;
  std::unique_ptr<WorkerStreamClient> client_;
};

TEST_F(WorkerStreamClientTest, SnapshotThenDeltasOverHttp) {
  serve();
  publisher_->onEngineStep(stored({1, 2}), {});
  connect();
  ASSERT_TRUE(recorder_.waitForSnapshots(1));
  EXPECT_EQ(recorder_.snapshots()[0].cached.size(), 2u);
  EXPECT_EQ(recorder_.snapshots()[0].epoch, publisher_->epoch());
  publisher_->onEngineStep(stored({3}), {});
  ASSERT_TRUE(recorder_.waitForDelta([](const WorkerDelta& d) { return d.seq == 2; }));
  EXPECT_EQ(std::get<routing::BlocksStored>(recorder_.deltas()[0].body).hashes, std::vector<BlockHash>{BlockHash(3)});
  EXPECT_TRUE(recorder_.stale().empty());
}

// No heartbeat from the worker: after stale_after of silence the client
// takes the stream for dead, says stale once, and resyncs from one snapshot.
TEST_F(WorkerStreamClientTest, SilentStreamIsCutAndResyncedFromOneSnapshot) {
  serve({.heartbeat_interval = Duration(0)});
  connect();
  ASSERT_TRUE(recorder_.waitForSnapshots(1));
  ASSERT_TRUE(advanceUntil([&] { return recorder_.numSnapshots() >= 2; }));
  EXPECT_EQ(recorder_.numSnapshots(), 2u);
  // "Fresh" is said just after the snapshot callback returns.
  EXPECT_TRUE(waitFor([&] { return recorder_.stale().size() == 2; }));
  EXPECT_EQ(recorder_.stale(), (std::vector<bool>{true, false}));
  // Silence is the worker's: unresponsive until the snapshot.
  EXPECT_EQ(recorder_.unresponsive(), (std::vector<bool>{true, false}));
}

// The worker's heartbeats keep a quiet stream alive: a minute of fake time
// (four times stale_after) passes on one connection.
TEST_F(WorkerStreamClientTest, HeartbeatsKeepAQuietStreamAlive) {
  serve({.heartbeat_interval = std::chrono::seconds(5)});
  connect();
  ASSERT_TRUE(recorder_.waitForSnapshots(1));
  const MonoTime start = clock_.now();
  ASSERT_TRUE(advanceUntil([&] { return clock_.now() >= start + std::chrono::seconds(60); }));
  // A cut would have resnapshotted (and said stale) before any later delta.
  publisher_->onEngineStep(stored({1}), {});
  ASSERT_TRUE(recorder_.waitForDelta([](const WorkerDelta& d) { return d.seq == 1; }));
  EXPECT_EQ(recorder_.numSnapshots(), 1u);
  EXPECT_TRUE(recorder_.stale().empty());
}

// A hand-written stream: the first connection skips seq 7, the second
// changes epoch; each is answered with one fresh snapshot.
TEST_F(WorkerStreamClientTest, GapOrNewEpochResyncsFromOneSnapshot) {
  std::atomic<int> connections{0};
  absl::Mutex mu;
  std::vector<std::shared_ptr<http::SseWriter>> open;  // dropping a writer would end its stream
  serve({}, [&](http::Request&) {
    const int n = connections.fetch_add(1);
    return http::Response::sse([n, &mu, &open](std::shared_ptr<http::SseWriter> w) {
      {
        absl::MutexLock lock(&mu);
        open.push_back(w);
      }
      const uint64_t epoch = n == 2 ? 2 : 1;
      w->send(encodeWorkerSnapshot({.epoch = epoch, .seq = 5, .worker = "w", .block_size = 16}));
      if (n == 0) {
        w->send(encodeWorkerDelta({.epoch = 1, .seq = 6, .body = routing::BlocksStored{{BlockHash(6)}}}));
        w->send(encodeWorkerDelta({.epoch = 1, .seq = 8, .body = routing::BlocksStored{{BlockHash(8)}}}));
      } else if (n == 1) {
        w->send(encodeWorkerDelta({.epoch = 9, .seq = 6, .body = routing::BlocksStored{{BlockHash(9)}}}));
      }
      // n == 2: stays open and quiet.
    });
  });
  connect();
  ASSERT_TRUE(recorder_.waitForSnapshots(3));
  EXPECT_EQ(connections.load(), 3);
  const auto deltas = recorder_.deltas();
  ASSERT_EQ(deltas.size(), 1u);  // 6 of the first connection; neither 8 nor epoch 9's
  EXPECT_EQ(deltas[0].seq, 6u);
  EXPECT_EQ(recorder_.snapshots()[2].epoch, 2u);
  EXPECT_TRUE(waitFor([&] { return recorder_.stale().size() == 4; }));
  EXPECT_EQ(recorder_.stale(), (std::vector<bool>{true, false, true, false}));
  // Resyncs say nothing of the worker's liveness.
  EXPECT_TRUE(recorder_.unresponsive().empty());
}

// While the worker answers 503 the client retries with backoff on the
// clock, and says stale once; the snapshot that ends it says fresh.
TEST_F(WorkerStreamClientTest, WorkerDownIsStaleOnceWhileRetried) {
  std::atomic<int> attempts{0};
  std::atomic<bool> up{false};
  serve({}, [&](http::Request&) {
    if (up.load()) return serveWorkerEvents(*publisher_);
    attempts.fetch_add(1);
    return http::Response::text(503, "starting");
  });
  connect();
  ASSERT_TRUE(advanceUntil([&] { return attempts.load() >= 5; }, std::chrono::milliseconds(500)));
  EXPECT_EQ(recorder_.stale(), std::vector<bool>{true});
  EXPECT_EQ(recorder_.numSnapshots(), 0u);
  EXPECT_EQ(recorder_.unresponsive(), std::vector<bool>{true});
  up.store(true);
  ASSERT_TRUE(advanceUntil([&] { return recorder_.numSnapshots() >= 1; }, std::chrono::milliseconds(500)));
  // "Fresh" is said just after the snapshot callback returns.
  EXPECT_TRUE(waitFor([&] { return recorder_.stale().size() == 2; }));
  EXPECT_EQ(recorder_.stale(), (std::vector<bool>{true, false}));
  EXPECT_EQ(recorder_.unresponsive(), (std::vector<bool>{true, false}));
}

// A subscriber that reads nothing (a raw socket with a small receive
// buffer) is dropped once it falls behind the buffer; a client reading
// alongside gets every delta.
class WorkerStreamSlowReaderTest : public WorkerStreamClientTest,
                                   public ::testing::WithParamInterface<http::ServerLibrary> {};

INSTANTIATE_TEST_SUITE_P(Libraries, WorkerStreamSlowReaderTest,
                         ::testing::Values(http::ServerLibrary::kBeast, http::ServerLibrary::kCpprest),
                         [](const auto& info) { return std::string(http::serverLibraryName(info.param)); });

TEST_P(WorkerStreamSlowReaderTest, ReaderThatStopsReadingIsDroppedOthersKeepUp) {
  library_ = GetParam();
  serve({.max_buffered_deltas = 8, .max_unsent_bytes = 16 << 10});
  connect();
  ASSERT_TRUE(recorder_.waitForSnapshots(1));
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const int rcvbuf = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(server_->port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  const std::string get = "GET /internal/v1/events HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(write(fd, get.data(), get.size()), static_cast<ssize_t>(get.size()));
  ASSERT_TRUE(waitFor([&] {
    return metrics::serializeText(registry_).find("tandem_events_subscribers{pool=\"p\",role=\"both\"} 2") !=
           std::string::npos;
  }));
  // Up to 15 MB of deltas, far beyond what the socket buffers hold (4 MiB at most here).
  uint64_t h = 1;
  const auto dropped = [&] {
    return metrics::serializeText(registry_).find(
               "tandem_events_subscribers_dropped_total{pool=\"p\",role=\"both\"} 1") != std::string::npos;
  };
  for (int i = 0; i < 400 && !dropped(); ++i) {
    std::vector<uint64_t> batch;
    for (int j = 0; j < 2000; ++j) batch.push_back(h++);
    publisher_->onEngineStep(stored(batch), {});
    if (i % 8 == 7) {  // pace the burst to the reading client's speed (held back, it is retried on the clock)
      const uint64_t seq = static_cast<uint64_t>(i + 1);
      ASSERT_TRUE(advanceUntil(
          [&] {
            const auto d = recorder_.deltas();
            return !d.empty() && d.back().seq >= seq;
          },
          std::chrono::milliseconds(20)));
    }
  }
  EXPECT_TRUE(waitFor(dropped));
  close(fd);
  const uint64_t last = recorder_.deltas().empty() ? 0 : recorder_.deltas().back().seq;
  const auto deltas = recorder_.deltas();
  for (size_t i = 0; i < deltas.size(); ++i) EXPECT_EQ(deltas[i].seq, i + 1);  // in order, none missing
  EXPECT_GT(last, 8u);
  EXPECT_EQ(recorder_.numSnapshots(), 1u);
}

}  // namespace
}  // namespace tandem::agent
