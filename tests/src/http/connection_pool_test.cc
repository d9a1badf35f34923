// ConnectionPool against a real server on 127.0.0.1 (and, where the test
// needs a server that misbehaves on cue, a hand-written one on a raw
// socket): connections are kept and reused, a stream stopped early closes
// its connection (the server sees the client go), a request the server
// dropped with a kept connection is sent once more, and the header and
// silence timeouts are separate. What every stream does whichever way it
// was opened (stop, errors, silence) is in client_test.cc.

#include "src/http/connection_pool.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include <nlohmann/json.hpp>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "src/common/strings.h"
#include "src/http/error.h"
#include "src/http/server.h"
#include "tests/testing/quiet_logs.h"
#include "tests/testing/wait.h"

namespace tandem::http {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testutil::waitFor;

constexpr Duration kPatience = seconds(10);

std::unique_ptr<Server> startServer(Routes routes, ServerOptions options = {}) {
  auto server = Server::start(std::move(options), std::move(routes));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

std::unique_ptr<ConnectionPool> poolFor(const std::string& base, ConnectionPoolOptions options = {}) {
  auto pool = ConnectionPool::create(base, options);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? std::move(*pool) : nullptr;
}

Routes streamingRoutes() {
  Routes routes;
  routes.handle("POST", "/double", [](Request& req) {
    auto body = req.json();
    if (!body.ok()) return Response::error(body.status());
    return Response::json(200, {{"x", (*body)["x"].get<int>() * 2}});
  });
  routes.handle("GET", "/count", [](Request& req) {
    const int n = std::stoi(req.query("n").value_or("3"));
    return Response::sse([n](std::shared_ptr<SseWriter> w) {
      for (int i = 0; i < n; ++i) w->send(std::to_string(i));
      w->send("[DONE]");
      w->close();
    });
  });
  routes.handle("POST", "/refuse",
                [](Request&) { return Response::error(400, kInvalidRequestError, "prompt is required"); });
  return routes;
}

std::vector<std::string> readAll(SseClient& stream) {
  std::vector<std::string> got;
  absl::Status s = stream.readEvents([&](const SseEvent& e) {
    got.push_back(e.data);
    return true;
  });
  EXPECT_TRUE(s.ok()) << s;
  return got;
}

TEST(ConnectionPoolTest, SequentialRequestsShareOneConnection) {
  auto server = startServer(streamingRoutes());
  auto pool = poolFor(server->baseUrl());
  for (int i = 0; i < 5; ++i) {
    auto stream = pool->open({.method = "GET", .url = strCat("/count?n=", i + 1)});
    ASSERT_TRUE(stream.ok()) << stream.status();
    EXPECT_EQ((*stream)->status(), 200);
    EXPECT_EQ((*stream)->headers().at("content-type"), "text/event-stream");
    std::vector<std::string> got = readAll(**stream);
    ASSERT_EQ(got.size(), static_cast<size_t>(i + 2));
    EXPECT_EQ(got.back(), "[DONE]");
    auto doubled = pool->open({.method = "POST", .url = "/double", .body = strCat("{\"x\":", i, "}")});
    ASSERT_TRUE(doubled.ok()) << doubled.status();
    // The stream above went back to the pool when it was destroyed; the
    // body of this one is read while the first is idle.
    auto body = (*doubled)->readBody();
    ASSERT_TRUE(body.ok()) << body.status();
    EXPECT_EQ(*body, strCat("{\"x\":", 2 * i, "}"));
  }
  EXPECT_EQ(pool->numConnects(), 2);  // the first stream's and, while it was open, the first POST's
  EXPECT_EQ(pool->numIdle(), 2u);
}

TEST(ConnectionPoolTest, AnErrorStatusIsAResponseAndItsConnectionIsKept) {
  auto server = startServer(streamingRoutes());
  auto pool = poolFor(server->baseUrl());
  for (int i = 0; i < 2; ++i) {
    auto stream = pool->open({.method = "POST", .url = "/refuse", .body = "{}"});
    ASSERT_TRUE(stream.ok()) << stream.status();
    EXPECT_EQ((*stream)->status(), 400);
    auto body = (*stream)->readBody();
    ASSERT_TRUE(body.ok()) << body.status();
    EXPECT_NE(body->find("prompt is required"), std::string::npos) << *body;
  }
  EXPECT_EQ(pool->numConnects(), 1);
}

// Stopping a stream before its end closes its connection: the server sees
// the client go, and the connection is not reused.
TEST(ConnectionPoolTest, StoppedStreamClosesItsConnectionAndServerSeesIt) {
  absl::Notification opened;
  std::shared_ptr<SseWriter> writer;
  Routes routes = streamingRoutes();
  routes.handle("POST", "/stream", [&](Request&) {
    return Response::sse([&](std::shared_ptr<SseWriter> w) {
      for (int i = 0; i < 3; ++i) w->send(std::to_string(i));
      writer = std::move(w);  // left open: only the client ends this stream
      opened.Notify();
    });
  });
  auto server = startServer(std::move(routes), {.sseKeepalive = milliseconds(20)});
  auto pool = poolFor(server->baseUrl());
  {
    auto stream = pool->open({.method = "POST", .url = "/stream", .body = "{}"});
    ASSERT_TRUE(stream.ok()) << stream.status();
    std::vector<std::string> got;
    absl::Status status = (*stream)->readEvents([&](const SseEvent& e) {
      got.push_back(e.data);
      return got.size() < 2;
    });
    EXPECT_TRUE(status.ok()) << status;
    EXPECT_EQ(got, (std::vector<std::string>{"0", "1"}));
  }
  ASSERT_TRUE(opened.WaitForNotificationWithTimeout(absl::FromChrono(kPatience)));
  EXPECT_TRUE(writer->context().waitCancelled(kPatience));
  EXPECT_EQ(writer->context().cancelReason(), CancelReason::kClientDisconnected);
  EXPECT_EQ(pool->numIdle(), 0u);
  auto next = pool->open({.method = "GET", .url = "/count?n=1"});
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(readAll(**next).size(), 2u);
  EXPECT_EQ(pool->numConnects(), 2);
}

// `timeout` bounds the wait for the headers; once they are there, the
// longest silence is `read_timeout`.
TEST(ConnectionPoolTest, HeadersAndSilenceHaveTheirOwnTimeouts) {
  std::shared_ptr<Responder> held;
  absl::Mutex mu;
  std::shared_ptr<SseWriter> quiet_writer;
  absl::Notification quiet_opened;
  Routes routes;
  routes.handle("GET", "/slow", [&](Request&) {
    return Response::deferred([&](std::shared_ptr<Responder> r) {
      absl::MutexLock lock(&mu);
      held = std::move(r);
    });
  });
  routes.handle("GET", "/quiet", [&](Request&) {
    return Response::sse([&](std::shared_ptr<SseWriter> w) {
      absl::MutexLock lock(&mu);
      quiet_writer = std::move(w);
      quiet_opened.Notify();
    });
  });
  std::vector<std::shared_ptr<SseWriter>> silent_writers;  // never written to
  routes.handle("GET", "/silent", [&](Request&) {
    return Response::sse([&](std::shared_ptr<SseWriter> w) {
      absl::MutexLock lock(&mu);
      silent_writers.push_back(std::move(w));
    });
  });
  auto server = startServer(std::move(routes), {.sseKeepalive = Duration::zero()});
  auto pool = poolFor(server->baseUrl());
  auto slow = pool->open({.url = "/slow", .timeout = milliseconds(200)});
  ASSERT_FALSE(slow.ok());
  EXPECT_EQ(slow.status().code(), absl::StatusCode::kDeadlineExceeded) << slow.status();

  // Silent for 3x `timeout`, within read_timeout: the late event arrives.
  auto stream = pool->open({.url = "/quiet", .timeout = milliseconds(200), .read_timeout = kPatience});
  ASSERT_TRUE(stream.ok()) << stream.status();
  const MonoTime opened = std::chrono::steady_clock::now();
  std::jthread late([&] {
    ASSERT_TRUE(quiet_opened.WaitForNotificationWithTimeout(absl::FromChrono(kPatience)));
    // Real time on purpose: the socket's deadline runs on it.
    while (std::chrono::steady_clock::now() < opened + milliseconds(600)) std::this_thread::sleep_for(milliseconds(5));
    absl::MutexLock lock(&mu);
    quiet_writer->send("late");
    quiet_writer->close();
  });
  EXPECT_EQ(readAll(**stream), std::vector<std::string>{"late"});
  late.join();

  // No read_timeout: silence longer than `timeout` fails the read.
  auto silent = pool->open({.url = "/silent", .timeout = milliseconds(200)});
  ASSERT_TRUE(silent.ok()) << silent.status();
  absl::Status status = (*silent)->readEvents([](const SseEvent&) { return true; });
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  absl::MutexLock lock(&mu);
  if (held) held->respond(Response::text(200, "late"));
}

// A cancel() from another thread ends an open() still waiting for the
// headers (a non-streamed answer comes only when it is complete); one
// before open() means no request goes out at all.
TEST(ConnectionPoolTest, ACancelEndsAnOpenStillWaitingForTheAnswer) {
  absl::Mutex mu;
  std::vector<std::shared_ptr<Responder>> held;
  absl::Notification arrived;
  Routes routes;
  routes.handle("POST", "/slow", [&](Request&) {
    return Response::deferred([&](std::shared_ptr<Responder> r) {
      absl::MutexLock lock(&mu);
      held.push_back(std::move(r));
      arrived.Notify();
    });
  });
  auto server = startServer(std::move(routes));
  auto pool = poolFor(server->baseUrl());
  auto canceller = std::make_shared<StreamCanceller>();
  std::jthread cancel([&] {
    ASSERT_TRUE(arrived.WaitForNotificationWithTimeout(absl::FromChrono(kPatience)));
    canceller->cancel();
  });
  const auto start = std::chrono::steady_clock::now();
  auto stream = pool->open({.method = "POST", .url = "/slow", .body = "{}", .timeout = seconds(60)}, canceller);
  ASSERT_FALSE(stream.ok());
  EXPECT_EQ(stream.status().code(), absl::StatusCode::kCancelled) << stream.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, kPatience);
  cancel.join();
  EXPECT_EQ(pool->numIdle(), 0u) << "a cancelled connection is not kept";

  auto early = std::make_shared<StreamCanceller>();
  early->cancel();
  const int64_t connects = pool->numConnects();
  auto refused = pool->open({.method = "POST", .url = "/slow", .body = "{}"}, early);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kCancelled) << refused.status();
  EXPECT_EQ(pool->numConnects(), connects) << "nothing was sent";
  absl::MutexLock lock(&mu);
  for (auto& r : held) r->respond(Response::text(200, "late"));
}

TEST(ConnectionPoolTest, BadBaseUrlIsInvalidArgumentNamingIt) {
  for (std::string url : {"https://127.0.0.1:1", "http://127.0.0.1", "http://127.0.0.1:80/v1", "http://:80",
                          "http://host:port", "127.0.0.1:80", ""}) {
    auto pool = ConnectionPool::create(url);
    ASSERT_FALSE(pool.ok()) << url;
    EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument) << url;
    EXPECT_NE(pool.status().message().find(strCat("'", url, "'")), absl::string_view::npos) << pool.status();
  }
  EXPECT_TRUE(ConnectionPool::create("http://127.0.0.1:8100/").ok());
  EXPECT_TRUE(ConnectionPool::create("http://[::1]:8100").ok());
}

TEST(ConnectionPoolTest, KeepsAtMostMaxIdleConnections) {
  auto server = startServer(streamingRoutes());
  auto pool = poolFor(server->baseUrl(), {.max_idle = 2});
  std::vector<std::unique_ptr<SseClient>> open;
  for (int i = 0; i < 3; ++i) {
    auto stream = pool->open({.url = "/count?n=1"});
    ASSERT_TRUE(stream.ok()) << stream.status();
    open.push_back(std::move(*stream));
  }
  for (auto& s : open) EXPECT_EQ(readAll(*s).size(), 2u);
  open.clear();
  EXPECT_EQ(pool->numConnects(), 3);
  EXPECT_EQ(pool->numIdle(), 2u);
}

TEST(ConnectionPoolTest, StreamOutlivesItsPool) {
  auto server = startServer(streamingRoutes());
  auto pool = poolFor(server->baseUrl());
  auto stream = pool->open({.url = "/count?n=2"});
  ASSERT_TRUE(stream.ok()) << stream.status();
  pool.reset();
  EXPECT_EQ(readAll(**stream).size(), 3u);
}

// A server on a raw socket that answers the first request of each
// connection, keeps the connection open, and on the connection's second
// request closes it without a byte of answer: what a server closing an idle
// connection looks like when the request raced with the close.
class ClosingServer {
 public:
  ClosingServer() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    ::listen(fd_, 8);
    socklen_t len = sizeof(a);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~ClosingServer() {
    stop_.store(true);
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }
  int port() const { return port_; }
  int requestsClosedUnanswered() const { return closed_.load(); }

 private:
  // Reads one request's headers (no body is sent in this test).
  static bool readRequest(int c) {
    std::string got;
    char buf[1024];
    while (got.find("\r\n\r\n") == std::string::npos) {
      ssize_t n = ::read(c, buf, sizeof(buf));
      if (n <= 0) return false;
      got.append(buf, static_cast<size_t>(n));
    }
    return true;
  }
  void serve() {
    while (!stop_.load()) {
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      if (readRequest(c)) {
        const std::string ok = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok";
        ::write(c, ok.data(), ok.size());
        // The second request on this connection: taken, then the connection
        // is closed without an answer.
        if (readRequest(c)) closed_.fetch_add(1);
      }
      ::close(c);
    }
  }
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> closed_{0};
  std::thread thread_;
};

TEST(ConnectionPoolTest, ARequestTheServerClosedUnansweredIsSentOnceMoreOnANewConnection) {
  ClosingServer server;
  auto pool = poolFor(strCat("http://127.0.0.1:", server.port()));
  for (int i = 0; i < 3; ++i) {
    auto stream = pool->open({.url = "/x", .timeout = kPatience});
    ASSERT_TRUE(stream.ok()) << i << ": " << stream.status();
    auto body = (*stream)->readBody();
    ASSERT_TRUE(body.ok()) << body.status();
    EXPECT_EQ(*body, "ok");
  }
  // Requests 2 and 3 each went out on the previous kept connection first.
  EXPECT_EQ(server.requestsClosedUnanswered(), 2);
  EXPECT_EQ(pool->numConnects(), 3);
}

}  // namespace
}  // namespace tandem::http
