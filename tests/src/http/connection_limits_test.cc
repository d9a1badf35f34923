// Connection hygiene of the Beast listener (server.h, "Connections"): header
// and body deadlines, the idle keep-alive timeout and the connection cap.
// Real sockets on 127.0.0.1; time is a FakeClock the tests advance, so no
// test waits for a timeout in real time.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <vector>

#include "src/common/strings.h"
#include "src/http/server.h"
#include "tests/testing/quiet_logs.h"
#include "tests/testing/wait.h"

namespace tandem::http {
namespace {

using std::chrono::hours;
using std::chrono::seconds;
using testutil::waitFor;

// A client socket; closed on destruction.
class Conn {
 public:
  explicit Conn(int port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    timeval tv{10, 0};  // a blocking read that outlasts this is a failing test
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~Conn() { ::close(fd_); }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  bool connected() const { return connected_; }
  bool send(std::string_view bytes) {
    for (size_t sent = 0; sent < bytes.size();) {
      ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }
  // Reads one response whose body is `Content-Length` long (none when
  // `headOnly`: the answer to HEAD); what arrived so far on failure.
  std::string readResponse(bool headOnly = false) {
    std::string out;
    char buf[4096];
    while (true) {
      size_t end = out.find("\r\n\r\n");
      if (end != std::string::npos) {
        size_t length = 0;
        if (size_t at = out.find("Content-Length: "); at != std::string::npos && !headOnly) {
          length = std::stoul(out.substr(at + 16));
        }
        if (out.size() >= end + 4 + length) return out;
      }
      ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return out;
      out.append(buf, static_cast<size_t>(n));
    }
  }
  // True once the server closed the connection (EOF or reset); never blocks.
  bool peerClosed() {
    char c;
    ssize_t n = ::recv(fd_, &c, 1, MSG_DONTWAIT | MSG_PEEK);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
  }

 private:
  int fd_;
  bool connected_ = false;
};

constexpr char kRequest[] = "GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n";
constexpr char kPartialRequest[] = "GET /healthz HTTP/1.1\r\nHost: test\r\n";  // no blank line: headers never end

class ConnectionLimitsTest : public ::testing::Test {
 protected:
  std::unique_ptr<Server> start(ServerOptions options) {
    options.library = ServerLibrary::kBeast;
    options.clock = &clock_;
    Routes routes;
    routes.handle("GET", "/healthz", [](Request&) { return Response::text(200, "ok\n"); });
    routes.handle("POST", "/echo", [this](Request& req) {
      ++calls_;
      return Response::text(200, req.body());
    });
    auto server = Server::start(std::move(options), std::move(routes));
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? std::move(*server) : nullptr;
  }
  // Advances the clock a step at a time until `done` holds (or the poll gives up).
  bool advanceUntil(Duration step, const std::function<bool()>& done) {
    return waitFor([&] {
      clock_.advance(step);
      return done();
    });
  }

  FakeClock clock_;
  std::atomic<int> calls_ = 0;
};

// The slowloris case: 1,000 half-sent requests stayed open for ever on
// cpprestsdk. Scaled to 250 (each holds two descriptors in this process).
TEST_F(ConnectionLimitsTest, HalfSentRequestsAreClosedAtTheHeaderDeadline) {
  constexpr int kNumConnections = 250;
  auto server = start({.headerTimeout = seconds(10), .idleTimeout = hours(1000)});
  std::vector<std::unique_ptr<Conn>> conns;
  for (int i = 0; i < kNumConnections; ++i) {
    conns.push_back(std::make_unique<Conn>(server->port()));
    ASSERT_TRUE(conns.back()->connected());
    ASSERT_TRUE(conns.back()->send(kPartialRequest));
  }
  // Before the deadline a half-sent request is just slow: finishing it works.
  ASSERT_TRUE(conns[0]->send("\r\n"));
  EXPECT_TRUE(conns[0]->readResponse().starts_with("HTTP/1.1 200"));
  conns.erase(conns.begin());

  const MonoTime start = clock_.now();
  EXPECT_TRUE(advanceUntil(seconds(1), [&] {
    for (auto& c : conns) {
      if (!c->peerClosed()) return false;
    }
    return true;
  }));
  EXPECT_GE(clock_.now() - start, seconds(10));
}

// Slow clients that trickle half of their headers a byte at a time, and idle
// ones that send nothing after connecting: the header deadline counts from
// accept, so the trickled bytes do not extend it, and requests on other
// connections are served meanwhile.
TEST_F(ConnectionLimitsTest, TricklingAndSilentClientsAreClosedAtTheHeaderDeadline) {
  constexpr int kNumEach = 20;
  constexpr Duration kHeader = seconds(10);
  auto server = start({.headerTimeout = kHeader, .idleTimeout = hours(1000), .maxConnections = 64});
  std::vector<std::unique_ptr<Conn>> slow;
  for (int i = 0; i < 2 * kNumEach; ++i) {
    slow.push_back(std::make_unique<Conn>(server->port()));
    ASSERT_TRUE(slow.back()->connected());
  }
  // Accepted in connection order, so once this one is served the slow ones
  // were accepted too, at this time on the clock.
  Conn keptAlive(server->port());
  ASSERT_TRUE(keptAlive.send(kRequest));
  ASSERT_TRUE(keptAlive.readResponse().starts_with("HTTP/1.1 200"));

  // One byte a second on the first half (50 s worth, far past the
  // deadline), one request on a new connection a second, until all are closed.
  const std::string_view half = "POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 5";
  const MonoTime start = clock_.now();
  size_t sent = 0;
  EXPECT_TRUE(advanceUntil(seconds(1), [&] {
    for (int i = 0; i < kNumEach && sent < half.size(); ++i) slow[i]->send(half.substr(sent, 1));
    ++sent;
    Conn other(server->port());
    EXPECT_TRUE(other.send(kRequest) && other.readResponse().starts_with("HTTP/1.1 200"));
    for (auto& c : slow) {
      if (!c->peerClosed()) return false;
    }
    return true;
  }));
  EXPECT_GE(clock_.now() - start, kHeader);
  // Had the trickle counted as progress, they would have lasted past its end
  // (50 s); the margin is for the server arming a deadline a little late.
  EXPECT_LT(clock_.now() - start, seconds(20));
  // The kept-alive connection, on its idle deadline, still serves.
  ASSERT_TRUE(keptAlive.send(kRequest));
  EXPECT_TRUE(keptAlive.readResponse().starts_with("HTTP/1.1 200"));
}

// Slow clients holding every connection the cap allows: a connection over
// the cap is closed at once until the header deadline closes them, then
// requests are served again.
TEST_F(ConnectionLimitsTest, SlowClientsAtTheCapAreClosedAtTheDeadlineAndServingResumes) {
  constexpr int kCap = 16;
  constexpr Duration kHeader = seconds(10);
  auto server = start({.headerTimeout = kHeader, .idleTimeout = hours(1000), .maxConnections = kCap});
  std::vector<std::unique_ptr<Conn>> slow;
  for (int i = 0; i < kCap; ++i) {
    slow.push_back(std::make_unique<Conn>(server->port()));
    ASSERT_TRUE(slow.back()->connected());
    if (i % 2 == 0) {
      ASSERT_TRUE(slow.back()->send(kPartialRequest));  // half of them sent part of a request
    }
  }
  Conn over(server->port());
  EXPECT_TRUE(waitFor([&] { return over.peerClosed(); }));
  const MonoTime start = clock_.now();
  EXPECT_TRUE(advanceUntil(seconds(1), [&] {
    for (auto& c : slow) {
      if (!c->peerClosed()) return false;
    }
    return true;
  }));
  EXPECT_GE(clock_.now() - start, kHeader);
  // The closed ones freed their places (noticed asynchronously: retry).
  EXPECT_TRUE(waitFor([&] {
    Conn next(server->port());
    return next.send(kRequest) && next.readResponse().starts_with("HTTP/1.1 200");
  }));
}

TEST_F(ConnectionLimitsTest, IdleKeepAliveConnectionIsClosed) {
  constexpr Duration kIdle = seconds(60);
  auto server = start({.headerTimeout = hours(1000), .idleTimeout = kIdle});
  Conn conn(server->port());
  ASSERT_TRUE(conn.send(kRequest));
  ASSERT_TRUE(conn.readResponse().starts_with("HTTP/1.1 200"));
  // Not closed early: just short of the idle timeout the connection still serves.
  clock_.advance(kIdle - seconds(1));
  ASSERT_TRUE(conn.send(kRequest));
  ASSERT_TRUE(conn.readResponse().starts_with("HTTP/1.1 200"));

  const MonoTime lastResponse = clock_.now();
  EXPECT_TRUE(advanceUntil(seconds(1), [&] { return conn.peerClosed(); }));
  EXPECT_GE(clock_.now() - lastResponse, kIdle);
}

TEST_F(ConnectionLimitsTest, SlowBodyGets408AtTheBodyDeadline) {
  constexpr Duration kBody = seconds(30);
  auto server = start({.requestTimeout = hours(1000), .headerTimeout = hours(1000), .bodyTimeout = kBody});
  Conn conn(server->port());
  ASSERT_TRUE(conn.send("POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 100\r\n\r\n0123456789"));
  std::string response;
  std::jthread reader([&] { response = conn.readResponse(); });
  const MonoTime start = clock_.now();
  // The reader returns once the 408 arrived (or after 10 s of real time, failing).
  EXPECT_TRUE(advanceUntil(seconds(1), [&] { return conn.peerClosed(); }));
  reader.join();
  EXPECT_TRUE(response.starts_with("HTTP/1.1 408")) << response;
  EXPECT_NE(response.find("did not arrive within 30s"), std::string::npos) << response;
  EXPECT_GE(clock_.now() - start, kBody);
  EXPECT_EQ(calls_.load(), 0);
}

TEST_F(ConnectionLimitsTest, ConnectionsOverTheCapAreClosedAtOnce) {
  constexpr int kCap = 4;
  auto server = start({.headerTimeout = hours(1000), .idleTimeout = hours(1000), .maxConnections = kCap});
  std::vector<std::unique_ptr<Conn>> held;
  for (int i = 0; i < kCap; ++i) {
    held.push_back(std::make_unique<Conn>(server->port()));
    ASSERT_TRUE(held.back()->connected());
  }
  // The server accepts in connection order, so this one is the fifth.
  Conn over(server->port());
  EXPECT_TRUE(waitFor([&] { return over.peerClosed(); }));
  // Those within the cap still serve.
  ASSERT_TRUE(held[0]->send(kRequest));
  EXPECT_TRUE(held[0]->readResponse().starts_with("HTTP/1.1 200"));
  // A closed connection frees its place (noticed asynchronously: retry).
  held.pop_back();
  EXPECT_TRUE(waitFor([&] {
    Conn next(server->port());
    return next.send(kRequest) && next.readResponse().starts_with("HTTP/1.1 200");
  }));
}

TEST_F(ConnectionLimitsTest, ExpectContinueGetsAnInterimResponseBeforeTheBody) {
  auto server = start({});
  Conn conn(server->port());
  ASSERT_TRUE(conn.send("POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"));
  // The client sends nothing more until it sees the 100.
  EXPECT_EQ(conn.readResponse(), "HTTP/1.1 100 Continue\r\n\r\n");
  ASSERT_TRUE(conn.send("hello"));
  std::string response = conn.readResponse();
  EXPECT_TRUE(response.starts_with("HTTP/1.1 200")) << response;
  EXPECT_TRUE(response.ends_with("\r\n\r\nhello")) << response;
}

TEST_F(ConnectionLimitsTest, HeadResponseHasNoBody) {
  auto server = start({});
  Conn conn(server->port());
  ASSERT_TRUE(conn.send("HEAD /healthz HTTP/1.1\r\nHost: test\r\n\r\n"));
  std::string head = conn.readResponse(/*headOnly=*/true);
  EXPECT_TRUE(head.starts_with("HTTP/1.1 405")) << head;  // routes are per method
  EXPECT_TRUE(head.ends_with("\r\n\r\n")) << head;
  // Had a body followed the head, it would stand where this response should start.
  ASSERT_TRUE(conn.send(kRequest));
  std::string next = conn.readResponse();
  EXPECT_TRUE(next.starts_with("HTTP/1.1 200")) << next;
}

}  // namespace
}  // namespace tandem::http
