// The blocking client and the SSE client against a real server on 127.0.0.1.
// The stream tests run on both ways of opening a stream: a cpprestsdk client
// of its own (SseClient::open) and a kept-alive Beast connection
// (ConnectionPool::open; its pooling has connection_pool_test.cc).

#include "src/http/client.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include <nlohmann/json.hpp>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "src/common/log.h"
#include "src/common/status.h"
#include "src/common/strings.h"
#include "src/http/connection_pool.h"
#include "src/http/error.h"
#include "tests/testing/quiet_logs.h"
#include "src/http/server.h"

namespace tandem::http {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr Duration kPatience = seconds(10);


std::unique_ptr<Server> startServer(Routes routes, ServerOptions options = {}) {
  auto server = Server::start(std::move(options), std::move(routes));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

// A loopback port nothing listens on (bound and released; a connection to it is refused).
int unusedPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// How a test opens a stream.
enum class Opener { kCpprest, kPool };

std::string openerName(Opener o) { return o == Opener::kCpprest ? "cpprest" : "pool"; }

// `request.url` is the path; `base` is "http://host:port".
absl::StatusOr<std::unique_ptr<SseClient>> openStream(Opener opener, const std::string& base, ClientRequest request) {
  if (opener == Opener::kCpprest) {
    request.url = base + request.url;
    return SseClient::open(request);
  }
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<ConnectionPool> pool, ConnectionPool::create(base));
  return pool->open(request);  // a stream may outlive its pool
}

class SseStreamTest : public ::testing::TestWithParam<Opener> {};

INSTANTIATE_TEST_SUITE_P(Openers, SseStreamTest, ::testing::Values(Opener::kCpprest, Opener::kPool),
                         [](const auto& info) { return openerName(info.param); });

Routes testRoutes() {
  Routes routes;
  routes.handle("GET", "/hello", [](Request&) { return Response::text(200, "hello"); });
  routes.handle("POST", "/double", [](Request& req) {
    auto body = req.json();
    if (!body.ok()) return Response::error(body.status());
    return Response::json(200, {{"x", (*body)["x"].get<int>() * 2}});
  });
  routes.handle("GET", "/missing", [](Request&) { return Response::error(absl::NotFoundError("no such model")); });
  return routes;
}

TEST(ClientTest, GetAndPostWithFreeFunctionsAndPooledClient) {
  auto server = startServer(testRoutes());
  ASSERT_NE(server, nullptr);

  auto hello = httpGet(server->baseUrl() + "/hello");
  ASSERT_TRUE(hello.ok()) << hello.status();
  EXPECT_EQ(hello->status, 200);
  EXPECT_EQ(hello->body, "hello");
  EXPECT_TRUE(hello->toStatus().ok());

  auto doubled = httpPost(server->baseUrl() + "/double", {{"x", 21}});
  ASSERT_TRUE(doubled.ok()) << doubled.status();
  ASSERT_TRUE(doubled->json().ok());
  EXPECT_EQ((*doubled->json())["x"], 42);

  auto client = Client::create(server->baseUrl());
  ASSERT_TRUE(client.ok()) << client.status();
  for (int i = 0; i < 3; ++i) {  // connections are reused
    auto r = (*client)->post("/double", {{"x", i}});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->body, strCat("{\"x\":", 2 * i, "}"));
  }
}

TEST(ClientTest, HttpErrorStatusIsAResponseNotAnError) {
  auto server = startServer(testRoutes());
  auto r = httpGet(server->baseUrl() + "/missing");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 404);
  absl::Status asStatus = r->toStatus();
  EXPECT_EQ(asStatus.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(asStatus.message().find("no such model"), absl::string_view::npos) << asStatus;
}

TEST(ClientTest, ConnectionRefusedIsUnavailable) {
  auto r = httpGet(strCat("http://127.0.0.1:", unusedPort(), "/x"), seconds(5));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
}

TEST_P(SseStreamTest, ConnectionRefusedIsUnavailable) {
  auto stream = openStream(GetParam(), strCat("http://127.0.0.1:", unusedPort()), {.url = "/x", .timeout = seconds(5)});
  ASSERT_FALSE(stream.ok());
  EXPECT_EQ(stream.status().code(), absl::StatusCode::kUnavailable) << stream.status();
}

TEST(ClientTest, InvalidUrlIsInvalidArgument) {
  for (std::string url : {"not a url", "ftp://host/x", "http://", ""}) {
    auto r = httpGet(url);
    ASSERT_FALSE(r.ok()) << url;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << url << ": " << r.status();
  }
  EXPECT_EQ(Client::create("::bad::").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ClientTest, SlowServerIsDeadlineExceeded) {
  std::shared_ptr<Responder> held;
  absl::Mutex mu;
  Routes routes;
  routes.handle("GET", "/slow", [&](Request&) {
    return Response::deferred([&](std::shared_ptr<Responder> r) {
      absl::MutexLock lock(&mu);
      held = std::move(r);
    });
  });
  auto server = startServer(std::move(routes));
  auto start = std::chrono::steady_clock::now();
  auto r = httpGet(server->baseUrl() + "/slow", milliseconds(200));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, kPatience);
}

TEST_P(SseStreamTest, StopsMidStreamAndServerSeesIt) {
  absl::Notification opened;
  std::shared_ptr<SseWriter> writer;
  Routes routes;
  routes.handle("POST", "/stream", [&](Request&) {
    return Response::sse([&](std::shared_ptr<SseWriter> w) {
      for (int i = 0; i < 3; ++i) w->send(std::to_string(i));
      writer = std::move(w);  // left open: only the client ends this stream
      opened.Notify();
    });
  });
  auto server = startServer(std::move(routes), {.sseKeepalive = milliseconds(20)});
  auto stream = openStream(GetParam(), server->baseUrl(), {.method = "POST", .url = "/stream", .body = "{}"});
  ASSERT_TRUE(stream.ok()) << stream.status();
  std::vector<std::string> got;
  absl::Status status = (*stream)->readEvents([&](const SseEvent& e) {
    got.push_back(e.data);
    return got.size() < 2;
  });
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(got, (std::vector<std::string>{"0", "1"}));
  ASSERT_TRUE(opened.WaitForNotificationWithTimeout(absl::FromChrono(kPatience)));
  EXPECT_TRUE(writer->context().waitCancelled(kPatience));
  EXPECT_EQ(writer->context().cancelReason(), CancelReason::kClientDisconnected);
}

TEST_P(SseStreamTest, StopFromAnotherThreadUnblocksReader) {
  absl::Notification opened;
  std::shared_ptr<SseWriter> writer;
  Routes routes;
  routes.handle("GET", "/quiet", [&](Request&) {
    return Response::sse([&](std::shared_ptr<SseWriter> w) {
      w->send("hello");
      writer = std::move(w);
      opened.Notify();
    });
  });
  // Keepalives: how the server notices a client that hung up.
  auto server = startServer(std::move(routes), {.sseKeepalive = milliseconds(20)});
  auto stream = openStream(GetParam(), server->baseUrl(), {.url = "/quiet"});
  ASSERT_TRUE(stream.ok()) << stream.status();
  absl::Notification firstEvent;
  std::jthread stopper([&] {
    ASSERT_TRUE(firstEvent.WaitForNotificationWithTimeout(absl::FromChrono(kPatience)));
    (*stream)->stop();
  });
  absl::Status status = (*stream)->readEvents([&](const SseEvent&) {
    firstEvent.Notify();
    return true;  // keep reading: only stop() can end this
  });
  stopper.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  ASSERT_TRUE(opened.WaitForNotificationWithTimeout(absl::FromChrono(kPatience)));
  EXPECT_TRUE(writer->context().waitCancelled(kPatience));
}

// A stream may last far longer than the client's timeout as long as bytes
// keep coming (events or the server's keepalive comments); silence fails it.
TEST_P(SseStreamTest, TimeoutIsAboutSilenceNotStreamLength) {
  struct Quiet {
    absl::Mutex mu;
    std::shared_ptr<SseWriter> writer;
    absl::Notification opened;
  };
  auto quietRoutes = [](Quiet& q) {
    Routes routes;
    routes.handle("GET", "/quiet", [&q](Request&) {
      return Response::sse([&q](std::shared_ptr<SseWriter> w) {
        absl::MutexLock lock(&q.mu);
        q.writer = std::move(w);
        q.opened.Notify();
      });
    });
    return routes;
  };

  Quiet kept;
  auto withKeepalives = startServer(quietRoutes(kept), {.sseKeepalive = milliseconds(30)});
  constexpr Duration kTimeout = milliseconds(300);
  auto stream = openStream(GetParam(), withKeepalives->baseUrl(), {.url = "/quiet", .timeout = kTimeout});
  ASSERT_TRUE(stream.ok()) << stream.status();
  MonoTime opened = std::chrono::steady_clock::now();
  std::jthread late([&] {
    ASSERT_TRUE(kept.opened.WaitForNotificationWithTimeout(absl::FromChrono(kPatience)));
    // Three timeouts of silence from the handler; only keepalives flow meanwhile.
    // Real time on purpose: the client's silence timeout runs on it.
    while (std::chrono::steady_clock::now() < opened + 3 * kTimeout) std::this_thread::sleep_for(milliseconds(5));
    absl::MutexLock lock(&kept.mu);
    kept.writer->send("late");
    kept.writer->close();
  });
  std::vector<std::string> got;
  absl::Status status = (*stream)->readEvents([&](const SseEvent& e) {
    got.push_back(e.data);
    return true;
  });
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(got, (std::vector<std::string>{"late"}));

  Quiet silent;
  auto withoutKeepalives = startServer(quietRoutes(silent), {.sseKeepalive = Duration::zero()});
  auto silentStream =
      openStream(GetParam(), withoutKeepalives->baseUrl(), {.url = "/quiet", .timeout = milliseconds(200)});
  ASSERT_TRUE(silentStream.ok()) << silentStream.status();
  status = (*silentStream)->readEvents([](const SseEvent&) { return true; });
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
}

TEST_P(SseStreamTest, ReadsAnErrorBodyInsteadOfAStream) {
  Routes routes;
  routes.handle("POST", "/v1/completions",
                [](Request&) { return Response::error(400, kInvalidRequestError, "prompt is required"); });
  auto server = startServer(std::move(routes));
  auto stream = openStream(GetParam(), server->baseUrl(), {.method = "POST", .url = "/v1/completions", .body = "{}"});
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ((*stream)->status(), 400);
  auto body = (*stream)->readBody();
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_NE(body->find("prompt is required"), std::string::npos);
}

}  // namespace
}  // namespace tandem::http
