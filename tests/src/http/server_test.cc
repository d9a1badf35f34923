// Integration tests: a real server and client on 127.0.0.1, port 0. Nothing
// here sleeps to make an assertion true: waits are polls or notifications
// with generous deadlines, so a loaded machine only makes them slower.

#include "src/http/server.h"
#include "tests/testing/quiet_logs.h"
#include "tests/testing/wait.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "src/common/log.h"
#include "src/common/strings.h"
#include "src/http/client.h"
#include "src/http/error.h"

namespace tandem::http {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Upper bound for anything that should happen "soon"; only reached when a test fails.
constexpr Duration kPatience = seconds(10);

using testutil::waitFor;

bool waitNotified(const absl::Notification& n, Duration timeout = kPatience) {
  return n.WaitForNotificationWithTimeout(absl::FromChrono(timeout));
}

nlohmann::json errorOf(const ClientResponse& r) {
  auto parsed = nlohmann::json::parse(r.body, nullptr, false);
  return parsed.is_discarded() ? nlohmann::json() : parsed["error"];
}

ClientResponse mustSend(const ClientRequest& request) {
  auto r = httpSend(request);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : ClientResponse{};
}

// Sends raw bytes on a fresh connection and returns everything the server
// sends back until it closes the connection (requests say Connection: close).
std::string rawExchange(int port, std::string_view bytes) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    for (size_t sent = 0; sent < bytes.size();) {
      ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

std::string chunkedPost(std::string_view path, const std::vector<std::string>& chunks) {
  std::string req = strCat("POST ", path, " HTTP/1.1\r\nHost: test\r\nConnection: close\r\n",
                           "Transfer-Encoding: chunked\r\nContent-Type: text/plain\r\n\r\n");
  for (const std::string& c : chunks) {
    char size[32];
    std::snprintf(size, sizeof(size), "%zx\r\n", c.size());
    req += size + c + "\r\n";
  }
  return req + "0\r\n\r\n";
}

// Every test runs against each library behind server.h: one contract.
class ServerTest : public ::testing::TestWithParam<ServerLibrary> {
 protected:
  std::unique_ptr<Server> startServer(Routes routes, ServerOptions options = {}) {
    options.library = GetParam();
    auto server = Server::start(std::move(options), std::move(routes));
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? std::move(*server) : nullptr;
  }
};

// ---------------------------------------------------------------------------
// Plain requests and responses

Routes echoRoutes(std::atomic<int>* calls = nullptr) {
  Routes routes;
  routes.handle("GET", "/healthz", [](Request&) { return Response::text(200, "ok\n"); });
  Handler echo = [calls](Request& req) {
    if (calls) ++*calls;
    nlohmann::json query = nlohmann::json::object();
    for (const auto& [k, v] : req.queryParams()) query[k] = v;
    return Response::json(200, {{"method", req.method()},
                                {"path", req.path()},
                                {"query", query},
                                {"x_test", req.header("X-TEST").value_or("")},
                                {"body_size", req.body().size()},
                                {"body", req.body()}})
        .setHeader("X-Handled-By", "echo");
  };
  routes.handle("POST", "/echo", echo).handle("PUT", "/echo", echo).handlePrefix("GET", "/files/", echo);
  routes.handle("POST", "/parse", [](Request& req) {
    auto body = req.json();
    if (!body.ok()) return Response::error(body.status());
    return Response::json(200, {{"keys", body->size()}});
  });
  return routes;
}

TEST_P(ServerTest, ServesTextAndJsonWithRequestDetails) {
  auto server = startServer(echoRoutes());
  ASSERT_NE(server, nullptr);
  ASSERT_GT(server->port(), 0);

  ClientResponse health = mustSend({.url = server->baseUrl() + "/healthz"});
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, "ok\n");
  EXPECT_EQ(health.headers["content-type"], "text/plain; charset=utf-8");

  ClientResponse echo = mustSend({.method = "POST",
                                  .url = server->baseUrl() + "/echo?model=llama%202&n=3",
                                  .headers = {{"x-test", "yes"}},
                                  .body = "h\xC3\xA9llo"});
  ASSERT_EQ(echo.status, 200) << echo.body;
  EXPECT_EQ(echo.headers["Content-Type"], "application/json");
  EXPECT_EQ(echo.headers["x-handled-by"], "echo");
  auto body = nlohmann::json::parse(echo.body);
  EXPECT_EQ(body["method"], "POST");
  EXPECT_EQ(body["path"], "/echo");
  EXPECT_EQ(body["query"], (nlohmann::json{{"model", "llama 2"}, {"n", "3"}}));
  EXPECT_EQ(body["x_test"], "yes");
  EXPECT_EQ(body["body"], "h\xC3\xA9llo");

  ClientResponse file = mustSend({.url = server->baseUrl() + "/files/a%2Fb.txt"});
  EXPECT_EQ(file.status, 200);
  EXPECT_EQ(nlohmann::json::parse(file.body)["path"], "/files/a/b.txt");
}

TEST_P(ServerTest, PortZeroGivesEachServerItsOwnPort) {
  auto a = startServer(echoRoutes());
  auto b = startServer(echoRoutes());
  ASSERT_TRUE(a && b);
  EXPECT_NE(a->port(), b->port());
  EXPECT_EQ(mustSend({.url = a->baseUrl() + "/healthz"}).status, 200);
  EXPECT_EQ(mustSend({.url = b->baseUrl() + "/healthz"}).status, 200);
}

// ---------------------------------------------------------------------------
// Bad input

TEST_P(ServerTest, UnknownPathIs404Json) {
  auto server = startServer(echoRoutes());
  ClientResponse r = mustSend({.url = server->baseUrl() + "/v1/nope"});
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.headers["content-type"], "application/json");
  EXPECT_EQ(errorOf(r)["type"], kInvalidRequestError);
  EXPECT_EQ(errorOf(r)["code"], 404);
  EXPECT_NE(errorOf(r)["message"].get<std::string>().find("/v1/nope"), std::string::npos);
}

TEST_P(ServerTest, WrongMethodIs405JsonWithAllow) {
  auto server = startServer(echoRoutes());
  for (std::string method : {"GET", "DELETE", "OPTIONS"}) {
    ClientResponse r = mustSend({.method = method, .url = server->baseUrl() + "/echo"});
    EXPECT_EQ(r.status, 405) << method;
    EXPECT_EQ(r.headers["allow"], "POST, PUT") << method;
    EXPECT_EQ(errorOf(r)["type"], kInvalidRequestError) << method;
    EXPECT_NE(errorOf(r)["message"].get<std::string>().find("not allowed"), std::string::npos) << method;
  }
}

TEST_P(ServerTest, InvalidJsonIs400SayingWhere) {
  auto server = startServer(echoRoutes());
  ClientResponse r = mustSend({.method = "POST", .url = server->baseUrl() + "/parse", .body = "{\"a\": 1,, }"});
  EXPECT_EQ(r.status, 400);
  std::string message = errorOf(r)["message"];
  EXPECT_NE(message.find("not valid JSON"), std::string::npos) << message;
  EXPECT_NE(message.find("line 1, column 9"), std::string::npos) << message;
  EXPECT_EQ(errorOf(r)["type"], kInvalidRequestError);

  // Valid syntax, but a number no double holds: the parser refuses it too.
  ClientResponse huge = mustSend({.method = "POST", .url = server->baseUrl() + "/parse", .body = "{\"t\": 1e400}"});
  EXPECT_EQ(huge.status, 400) << huge.body;
  EXPECT_NE(errorOf(huge)["message"].get<std::string>().find("number overflow parsing '1e400'"), std::string::npos)
      << huge.body;

  ClientResponse ok = mustSend({.method = "POST", .url = server->baseUrl() + "/parse", .body = "{\"a\": 1}"});
  EXPECT_EQ(ok.status, 200) << ok.body;
}

TEST_P(ServerTest, ParseErrorThrownByHandlerIs400) {
  Routes routes;
  routes.handle("POST", "/raw", [](Request& req) {
    auto body = nlohmann::json::parse(req.body());  // throws on bad input
    return Response::json(200, body);
  });
  auto server = startServer(std::move(routes));
  ClientResponse r = mustSend({.method = "POST", .url = server->baseUrl() + "/raw", .body = "[1, 2"});
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(errorOf(r)["message"].get<std::string>().find("not valid JSON"), std::string::npos) << r.body;
}

TEST_P(ServerTest, NonUtf8BodyIs400AndHandlerNotCalled) {
  std::atomic<int> calls = 0;
  auto server = startServer(echoRoutes(&calls));
  ClientResponse r = mustSend({.method = "POST", .url = server->baseUrl() + "/echo", .body = "ok \xC3\x28 no"});
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(errorOf(r)["message"].get<std::string>().find("UTF-8"), std::string::npos) << r.body;
  EXPECT_EQ(calls.load(), 0);
}

TEST_P(ServerTest, BodyOverLimitByContentLengthIs413) {
  std::atomic<int> calls = 0;
  auto server = startServer(echoRoutes(&calls), {.maxBodyBytes = 1024});
  ClientResponse big =
      mustSend({.method = "POST", .url = server->baseUrl() + "/echo", .body = std::string(100 * 1024, 'x')});
  EXPECT_EQ(big.status, 413);
  EXPECT_EQ(errorOf(big)["type"], kInvalidRequestError);
  EXPECT_NE(errorOf(big)["message"].get<std::string>().find("limit of 1024 bytes"), std::string::npos) << big.body;
  EXPECT_EQ(calls.load(), 0);

  // Exactly at the limit is fine, and the connection still works after a 413.
  ClientResponse atLimit =
      mustSend({.method = "POST", .url = server->baseUrl() + "/echo", .body = std::string(1024, 'y')});
  EXPECT_EQ(atLimit.status, 200);
  EXPECT_EQ(nlohmann::json::parse(atLimit.body)["body_size"], 1024);
}

TEST_P(ServerTest, ChunkedBodyOverLimitIs413) {
  std::atomic<int> calls = 0;
  auto server = startServer(echoRoutes(&calls), {.maxBodyBytes = 1024});
  // No Content-Length: the limit can only be enforced while reading.
  std::string over = rawExchange(server->port(), chunkedPost("/echo", {std::string(600, 'a'), std::string(600, 'b')}));
  EXPECT_TRUE(over.starts_with("HTTP/1.1 413")) << over.substr(0, 200);
  EXPECT_NE(over.find("invalid_request_error"), std::string::npos);
  EXPECT_EQ(calls.load(), 0);

  std::string under = rawExchange(server->port(), chunkedPost("/echo", {std::string(500, 'a'), std::string(500, 'b')}));
  EXPECT_TRUE(under.starts_with("HTTP/1.1 200")) << under.substr(0, 200);
  EXPECT_NE(under.find("\"body_size\":1000"), std::string::npos);
  EXPECT_EQ(calls.load(), 1);
}

TEST_P(ServerTest, HandlerExceptionsBecome500Json) {
  Routes routes;
  routes.handle("GET", "/std", [](Request&) -> Response { throw std::runtime_error("boom in handler"); });
  routes.handle("GET", "/other", [](Request&) -> Response { throw 42; });
  routes.handle("GET", "/json-type", [](Request&) -> Response {
    nlohmann::json j = "text";
    return Response::text(200, std::to_string(j.get<int>()));  // nlohmann type_error: a handler bug
  });
  routes.handle("GET", "/deferred", [](Request&) {
    return Response::deferred([](std::shared_ptr<Responder>) { throw std::logic_error("boom in start"); });
  });
  auto server = startServer(std::move(routes));

  ClientResponse r = mustSend({.url = server->baseUrl() + "/std"});
  EXPECT_EQ(r.status, 500);
  EXPECT_EQ(errorOf(r)["type"], kServerError);
  EXPECT_NE(errorOf(r)["message"].get<std::string>().find("boom in handler"), std::string::npos);

  EXPECT_EQ(mustSend({.url = server->baseUrl() + "/other"}).status, 500);
  EXPECT_EQ(mustSend({.url = server->baseUrl() + "/json-type"}).status, 500);
  ClientResponse d = mustSend({.url = server->baseUrl() + "/deferred"});
  EXPECT_EQ(d.status, 500);
  EXPECT_NE(errorOf(d)["message"].get<std::string>().find("boom in start"), std::string::npos);
}

// ---------------------------------------------------------------------------
// Deadlines

TEST_P(ServerTest, HandlerPastDeadlineGives504AndSeesCancellation) {
  FakeClock clock;
  std::atomic<CancelReason> seen = CancelReason::kNone;
  std::atomic<MonoTime> cancelledAt{};
  absl::Notification handlerRunning, handlerDone;
  std::atomic<MonoTime> deadline{};
  Routes routes;
  routes.handle("GET", "/slow", [&](Request& req) {
    deadline = req.deadline();
    req.context().onCancel([&] { cancelledAt = clock.now(); });
    handlerRunning.Notify();
    // A handler that notices it is too late; its own reply must be dropped.
    req.context().waitCancelled(kPatience);
    seen = req.context().cancelReason();
    handlerDone.Notify();
    return Response::text(200, "too late");
  });
  constexpr Duration kTimeout = milliseconds(300);
  const MonoTime arrival = clock.now();
  auto server = startServer(std::move(routes), {.requestTimeout = kTimeout, .clock = &clock});
  absl::StatusOr<ClientResponse> r;
  std::jthread client([&] { r = httpGet(server->baseUrl() + "/slow"); });
  ASSERT_TRUE(waitNotified(handlerRunning));
  // The deadline the handler saw: request arrival + requestTimeout, on the server's clock.
  EXPECT_EQ(deadline.load(), arrival + kTimeout);
  clock.advance(kTimeout - milliseconds(1));
  clock.advance(milliseconds(1));
  client.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 504);
  EXPECT_EQ(errorOf(*r)["type"], kTimeoutError);
  ASSERT_TRUE(waitNotified(handlerDone));
  EXPECT_EQ(seen.load(), CancelReason::kDeadline);
  // Not a moment early: the clock stood 1 ms short of the deadline before the last step.
  EXPECT_GE(cancelledAt.load(), arrival + kTimeout);
}

TEST_P(ServerTest, DeferredWithoutResponseGets504AndLateRespondIsDropped) {
  FakeClock clock;
  std::shared_ptr<Responder> kept;
  absl::Mutex mu;
  Routes routes;
  routes.handle("GET", "/never", [&](Request&) {
    return Response::deferred([&](std::shared_ptr<Responder> r) {
      absl::MutexLock lock(&mu);
      kept = std::move(r);
    });
  });
  auto server = startServer(std::move(routes), {.requestTimeout = milliseconds(200), .clock = &clock});
  absl::StatusOr<ClientResponse> r;
  std::jthread client([&] { r = httpGet(server->baseUrl() + "/never"); });
  ASSERT_TRUE(waitFor([&] {
    absl::MutexLock lock(&mu);
    return kept != nullptr;
  }));
  clock.advance(milliseconds(200));
  client.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 504);
  absl::MutexLock lock(&mu);
  EXPECT_TRUE(kept->cancelled());
  EXPECT_EQ(kept->context().cancelReason(), CancelReason::kDeadline);
  EXPECT_FALSE(kept->respond(Response::text(200, "late")));
}

TEST_P(ServerTest, DeferredResponseFromAnotherThread) {
  std::vector<std::jthread> workers;
  absl::Mutex mu;
  Routes routes;
  routes.handle("GET", "/later", [&](Request& req) {
    return Response::deferred([&, n = req.query("n").value_or("?")](std::shared_ptr<Responder> r) {
      absl::MutexLock lock(&mu);
      workers.emplace_back([r, n] { EXPECT_TRUE(r->respond(Response::json(200, {{"n", n}}))); });
    });
  });
  auto server = startServer(std::move(routes));
  ClientResponse r = mustSend({.url = server->baseUrl() + "/later?n=5"});
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "{\"n\":\"5\"}");
  absl::MutexLock lock(&mu);
  for (auto& t : workers) t.join();
}

// The router's shape: the handler defers, and a worker thread decides later
// (once the upstream's first event arrived) to answer with a stream.
TEST_P(ServerTest, DeferredCallAnsweredWithAStreamFromAnotherThread) {
  std::vector<std::jthread> workers;
  absl::Mutex mu;
  Routes routes;
  routes.handle("POST", "/later-stream", [&](Request&) {
    return Response::deferred([&](std::shared_ptr<Responder> r) {
      absl::MutexLock lock(&mu);
      workers.emplace_back([r] {
        std::shared_ptr<SseWriter> writer;
        EXPECT_TRUE(r->respond(Response::sse([&writer](std::shared_ptr<SseWriter> w) { writer = std::move(w); })));
        ASSERT_NE(writer, nullptr);  // the start callback ran before respond() returned
        EXPECT_TRUE(writer->send("one"));
        EXPECT_TRUE(writer->send("two"));
        writer->close();
        EXPECT_FALSE(r->respond(Response::text(200, "too late")));
      });
    });
  });
  auto server = startServer(std::move(routes));
  auto stream = SseClient::open({.method = "POST", .url = server->baseUrl() + "/later-stream", .body = "{}"});
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ((*stream)->status(), 200);
  std::vector<std::string> data;
  ASSERT_TRUE((*stream)->readEvents([&](const SseEvent& e) {
                 data.push_back(e.data);
                 return true;
               }).ok());
  EXPECT_EQ(data, (std::vector<std::string>{"one", "two"}));
  absl::MutexLock lock(&mu);
  for (auto& t : workers) t.join();
}

TEST_P(ServerTest, DroppedResponderGives500) {
  Routes routes;
  routes.handle("GET", "/drop", [](Request&) { return Response::deferred([](std::shared_ptr<Responder>) {}); });
  auto server = startServer(std::move(routes));
  ClientResponse r = mustSend({.url = server->baseUrl() + "/drop"});
  EXPECT_EQ(r.status, 500);
  EXPECT_NE(errorOf(r)["message"].get<std::string>().find("without responding"), std::string::npos);
}

// ---------------------------------------------------------------------------
// Streams

// A handler whose stream is fed by the test through `writer`.
struct StreamHandle {
  absl::Mutex mu;
  std::shared_ptr<SseWriter> writer;
  absl::Notification opened;

  Handler handler() {
    return [this](Request&) {
      return Response::sse([this](std::shared_ptr<SseWriter> w) {
        {
          absl::MutexLock lock(&mu);
          writer = std::move(w);
        }
        opened.Notify();
      });
    };
  }
  std::shared_ptr<SseWriter> get() {
    absl::MutexLock lock(&mu);
    return writer;
  }
};

TEST_P(ServerTest, StreamEventsReachTheClientBeforeTheStreamEnds) {
  StreamHandle stream;
  Routes routes;
  routes.handle("POST", "/stream", stream.handler());
  auto server = startServer(std::move(routes));
  auto client =
      SseClient::open({.method = "POST", .url = server->baseUrl() + "/stream", .body = "{}", .timeout = kPatience});
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->status(), 200);
  EXPECT_EQ((*client)->headers().at("content-type"), "text/event-stream");
  ASSERT_TRUE(waitNotified(stream.opened));

  // Each event is sent only after the client saw the previous one: if the
  // server buffered until close(), the client would see nothing and the
  // readEvents below would time out instead of completing.
  std::vector<std::string> got;
  std::jthread producer([&] { EXPECT_TRUE(stream.get()->send("first")); });
  absl::Status status = (*client)->readEvents([&](const SseEvent& e) {
    got.push_back(e.data);
    if (got.size() == 1) {
      EXPECT_TRUE(stream.get()->send("second\nline"));
    } else if (got.size() == 2) {
      EXPECT_TRUE(stream.get()->sendEvent({.event = "usage", .data = "{}", .id = "3"}));
    } else {
      EXPECT_EQ(e.event, "usage");
      EXPECT_EQ(e.id, "3");
      stream.get()->close();
    }
    return true;
  });
  producer.join();
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(got, (std::vector<std::string>{"first", "second\nline", "{}"}));
  EXPECT_FALSE(stream.get()->send("after close"));
  EXPECT_FALSE(stream.get()->cancelled());
}

TEST_P(ServerTest, OpenStreamIsNotCutByTheRequestDeadline) {
  FakeClock clock;
  StreamHandle stream;
  std::shared_ptr<Responder> never;  // a call that only its deadline answers
  absl::Mutex mu;
  Routes routes;
  routes.handle("GET", "/stream", stream.handler());
  routes.handle("GET", "/never", [&](Request&) {
    return Response::deferred([&](std::shared_ptr<Responder> r) {
      absl::MutexLock lock(&mu);
      never = std::move(r);
    });
  });
  constexpr Duration kTimeout = milliseconds(200);
  auto server = startServer(std::move(routes), {.requestTimeout = kTimeout, .clock = &clock});
  auto client = SseClient::open({.url = server->baseUrl() + "/stream"});
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE(waitNotified(stream.opened));
  ASSERT_TRUE(stream.get()->send("before deadline"));
  // Same arrival time, later in the timer queue: once this call got its 504,
  // the stream's own deadline has been dealt with.
  absl::StatusOr<ClientResponse> later;
  std::jthread laterClient([&] { later = httpGet(server->baseUrl() + "/never"); });
  ASSERT_TRUE(waitFor([&] {
    absl::MutexLock lock(&mu);
    return never != nullptr;
  }));
  std::vector<std::string> got;
  absl::Status status = (*client)->readEvents([&](const SseEvent& e) {
    got.push_back(e.data);
    if (got.size() == 1) {
      // Past the deadline on purpose: the stream must keep going.
      clock.advance(kTimeout + milliseconds(100));
      laterClient.join();
      EXPECT_TRUE(later.ok() && later->status == 504);
      EXPECT_TRUE(stream.get()->send("after deadline"));
      stream.get()->close();
    }
    return true;
  });
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(got, (std::vector<std::string>{"before deadline", "after deadline"}));
  EXPECT_FALSE(stream.get()->cancelled());
}

TEST_P(ServerTest, StreamingHandlerObservesClientDisconnect) {
  std::atomic<bool> callbackRan = false;
  std::atomic<int> sent = 0;
  std::shared_ptr<CallContext> context;
  std::jthread producer;  // declared before the server: joined after it shut down
  absl::Notification opened;
  Routes routes;
  routes.handle("GET", "/tokens", [&](Request& req) {
    context = req.sharedContext();
    return Response::sse([&](std::shared_ptr<SseWriter> sse) {
      sse->context().onCancel([&] { callbackRan = true; });
      // Like token generation: produce until the client is gone (bounded for safety).
      producer = std::jthread([&, sse] {
        auto stop = std::chrono::steady_clock::now() + kPatience;
        while (!sse->cancelled() && std::chrono::steady_clock::now() < stop) {
          if (sse->send(strCat("token ", sent.load()))) ++sent;
          // Real time on purpose: a generator spends time per token, as the engine does.
          std::this_thread::sleep_for(milliseconds(5));
        }
      });
      opened.Notify();
    });
  });
  auto server = startServer(std::move(routes), {.sseKeepalive = Duration::zero()});
  auto client = SseClient::open({.url = server->baseUrl() + "/tokens"});
  ASSERT_TRUE(client.ok()) << client.status();
  int events = 0;
  absl::Status status = (*client)->readEvents([&](const SseEvent&) {
    ++events;
    return false;  // read one event, then hang up
  });
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(events, 1);
  client->reset();

  ASSERT_TRUE(waitNotified(opened));
  EXPECT_TRUE(context->waitCancelled(kPatience)) << "disconnect not observed; events sent: " << sent.load();
  EXPECT_EQ(context->cancelReason(), CancelReason::kClientDisconnected);
  // Callbacks run just after the state flips, on the cancelling thread.
  EXPECT_TRUE(waitFor([&] { return callbackRan.load(); }));
  producer.join();
  EXPECT_TRUE(waitFor([&] { return server->numInFlight() == 0; }));
}

TEST_P(ServerTest, IdleStreamDisconnectIsFoundByKeepalives) {
  FakeClock clock;
  StreamHandle stream;
  Routes routes;
  routes.handle("GET", "/idle", stream.handler());
  constexpr Duration kKeepalive = seconds(15);
  auto server = startServer(std::move(routes), {.sseKeepalive = kKeepalive, .clock = &clock});
  auto client = SseClient::open({.url = server->baseUrl() + "/idle"});
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE(waitNotified(stream.opened));
  ASSERT_TRUE(stream.get()->send("only event"));
  EXPECT_TRUE((*client)->readEvents([](const SseEvent&) { return false; }).ok());
  client->reset();
  // The handler never writes again; only the server's keepalives can find
  // out. Each step of the clock is one keepalive (detection takes about two).
  CallContext& context = stream.get()->context();
  EXPECT_TRUE(waitFor([&] {
    clock.advance(kKeepalive);
    return context.cancelled();
  }));
  EXPECT_EQ(context.cancelReason(), CancelReason::kClientDisconnected);
}

TEST_P(ServerTest, ExceptionInStreamStartEndsStreamWithErrorEvent) {
  Routes routes;
  routes.handle("GET", "/bad", [](Request&) {
    return Response::sse([](std::shared_ptr<SseWriter> sse) {
      sse->send("partial");
      throw std::runtime_error("engine exploded");
    });
  });
  auto server = startServer(std::move(routes));
  auto client = SseClient::open({.url = server->baseUrl() + "/bad"});
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<std::string> got;
  EXPECT_TRUE((*client)
                  ->readEvents([&](const SseEvent& e) {
                    got.push_back(e.data);
                    return true;
                  })
                  .ok());
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], "partial");
  EXPECT_EQ(nlohmann::json::parse(got[1])["error"]["type"], kServerError);
}

// ---------------------------------------------------------------------------
// Shutdown

TEST_P(ServerTest, ShutdownLetsAnOpenStreamFinishAndRefusesNewRequests) {
  StreamHandle stream;
  Routes routes;
  routes.handle("GET", "/stream", stream.handler());
  routes.handle("GET", "/healthz", [](Request&) { return Response::text(200, "ok"); });
  auto server = startServer(std::move(routes));
  std::string baseUrl = server->baseUrl();
  auto client = SseClient::open({.url = baseUrl + "/stream"});
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE(waitNotified(stream.opened));
  ASSERT_TRUE(stream.get()->send("0"));

  std::jthread shutdown;
  std::atomic<bool> shutdownReturned = false;
  constexpr int kEvents = 5;
  std::vector<std::string> got;
  absl::Status status = (*client)->readEvents([&](const SseEvent& e) {
    got.push_back(e.data);
    if (got.size() == 1) {
      shutdown = std::jthread([&] {
        server->shutdown(kPatience);
        shutdownReturned = true;
      });
      EXPECT_TRUE(waitFor([&] { return server->draining(); }));
      // While draining, new requests are turned away...
      auto refused = httpGet(baseUrl + "/healthz");
      EXPECT_TRUE(refused.ok() && refused->status == 503)
          << (refused.ok() ? refused->body : refused.status().ToString());
      // ...and the stream in flight keeps going.
      EXPECT_FALSE(shutdownReturned.load());
    }
    if (static_cast<int>(got.size()) < kEvents) {
      EXPECT_TRUE(stream.get()->send(std::to_string(got.size())));
    } else {
      stream.get()->close();
    }
    return true;
  });
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(got, (std::vector<std::string>{"0", "1", "2", "3", "4"}));
  EXPECT_TRUE(waitFor([&] { return shutdownReturned.load(); })) << "shutdown did not return after the stream ended";
  shutdown.join();
  EXPECT_FALSE(stream.get()->cancelled());
}

TEST_P(ServerTest, ShutdownCancelsWhatOutlivesTheGracePeriod) {
  FakeClock clock;
  StreamHandle stream;
  std::shared_ptr<Responder> pending;
  absl::Mutex mu;
  Routes routes;
  routes.handle("GET", "/stream", stream.handler());
  routes.handle("GET", "/pending", [&](Request&) {
    return Response::deferred([&](std::shared_ptr<Responder> r) {
      absl::MutexLock lock(&mu);
      pending = std::move(r);
    });
  });
  auto server = startServer(std::move(routes), {.clock = &clock});
  auto client = SseClient::open({.url = server->baseUrl() + "/stream"});
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE(waitNotified(stream.opened));
  absl::StatusOr<ClientResponse> pendingResponse;
  std::jthread waiter([&] { pendingResponse = httpGet(server->baseUrl() + "/pending"); });
  ASSERT_TRUE(waitFor([&] {
    absl::MutexLock lock(&mu);
    return pending != nullptr;
  }));

  constexpr Duration kGrace = milliseconds(100);
  std::jthread shutdown([&] { server->shutdown(kGrace); });
  // Parked on the grace deadline (the timer thread is the other waiter):
  // nothing has been cancelled yet.
  ASSERT_TRUE(waitFor([&] { return server->draining() && clock.numWaiters() >= 2; }));
  EXPECT_FALSE(stream.get()->cancelled());
  clock.advance(kGrace);
  shutdown.join();

  EXPECT_TRUE(stream.get()->cancelled());
  EXPECT_EQ(stream.get()->context().cancelReason(), CancelReason::kShutdown);
  EXPECT_FALSE(stream.get()->send("too late"));
  // The stream was ended, so the reader returns.
  EXPECT_TRUE((*client)->readEvents([](const SseEvent&) { return true; }).ok());
  waiter.join();
  ASSERT_TRUE(pendingResponse.ok()) << pendingResponse.status();
  EXPECT_EQ(pendingResponse->status, 503);
  absl::MutexLock lock(&mu);
  EXPECT_EQ(pending->context().cancelReason(), CancelReason::kShutdown);
}

INSTANTIATE_TEST_SUITE_P(Libraries, ServerTest, ::testing::Values(ServerLibrary::kBeast, ServerLibrary::kCpprest),
                         [](const ::testing::TestParamInfo<ServerLibrary>& info) {
                           return std::string(serverLibraryName(info.param));
                         });

}  // namespace
}  // namespace tandem::http
