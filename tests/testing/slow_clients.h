#pragma once
// Slow and idle clients against a real HTTP listener (the slowloris attack):
// connections that send half of a request's headers a byte at a time, and
// connections that send nothing after connecting. A server with a header
// deadline closes both kinds at it without answering; one without keeps
// them for ever and runs out of connections or descriptors.
//
//   SlowClients slow({.port = port, .half_request = "POST /v1/completions HTTP/1.1\r\nHo"});
//   ASSERT_EQ(slow.numConnected(), 400);
//   while (slow.numOpen() > 0 && ...) { ...normal requests still succeed... }
//   SlowClients::Report r = slow.report();   // when each was closed, and whether it got an answer
//
// or, with the checks every listener's test makes, expectSlowClientsClosed()
// at the end of this file.
//
// One thread of its own sends the bytes and watches every socket for the
// server's close (EOF or reset), noting when it came. Methods are
// thread-safe. Each connection holds one descriptor here and one in the
// server.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tandem::testutil {

class SlowClients {
 public:
  struct Options {
    int port = 0;  // on 127.0.0.1
    int num_trickling = 200;
    int num_silent = 200;
    // What the trickling connections send, one byte each byte_interval;
    // they keep the connection open once it is all sent. Part of a request
    // whose headers never end.
    std::string half_request;
    std::chrono::milliseconds byte_interval{300};
  };

  // Opens every connection (on loopback a connect completes at once, the
  // server accepting in its own time) and starts sending.
  explicit SlowClients(Options options) : options_(std::move(options)) {
    const int total = options_.num_trickling + options_.num_silent;
    for (int i = 0; i < total; ++i) {
      Conn c;
      c.trickling = i < options_.num_trickling;
      c.fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<uint16_t>(options_.port));
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (c.fd < 0 || ::connect(c.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        if (c.fd >= 0) ::close(c.fd);
        continue;
      }
      c.connected_at = std::chrono::steady_clock::now();
      conns_.push_back(c);
    }
    num_connected_ = static_cast<int>(conns_.size());
    num_open_ = num_connected_;
    thread_ = std::thread([this] { run(); });
  }
  ~SlowClients() {
    stop_ = true;
    thread_.join();
    for (const Conn& c : conns_) ::close(c.fd);
  }
  SlowClients(const SlowClients&) = delete;
  SlowClients& operator=(const SlowClients&) = delete;

  int numConnected() const { return num_connected_; }
  // Connections the server has not closed yet.
  int numOpen() const { return num_open_.load(); }

  struct Report {
    int num_open = 0;      // not closed by the server (yet)
    int num_answered = 0;  // the server sent bytes before closing: a response, not a deadline
    // Over the closed ones: the shortest and longest time from connect to close.
    std::chrono::milliseconds earliest_close{0};
    std::chrono::milliseconds latest_close{0};
  };
  Report report() const {
    absl::MutexLock lock(&mu_);
    Report r;
    bool first = true;
    for (const Conn& c : conns_) {
      if (c.answered) ++r.num_answered;
      if (!c.closed) {
        ++r.num_open;
        continue;
      }
      auto t = std::chrono::duration_cast<std::chrono::milliseconds>(c.closed_at - c.connected_at);
      r.earliest_close = first ? t : std::min(r.earliest_close, t);
      r.latest_close = first ? t : std::max(r.latest_close, t);
      first = false;
    }
    return r;
  }

 private:
  struct Conn {
    int fd = -1;
    bool trickling = false;
    size_t sent = 0;  // bytes of half_request
    std::chrono::steady_clock::time_point connected_at, closed_at;
    bool closed = false;
    bool answered = false;
  };

  void run() {
    auto next_byte = std::chrono::steady_clock::now();
    while (!stop_) {
      const auto now = std::chrono::steady_clock::now();
      const bool send_now = now >= next_byte;
      if (send_now) next_byte = now + options_.byte_interval;
      {
        absl::MutexLock lock(&mu_);
        for (Conn& c : conns_) {
          if (c.closed) continue;
          watch(c);
          if (!c.closed && send_now && c.trickling && c.sent < options_.half_request.size()) {
            if (::send(c.fd, options_.half_request.data() + c.sent, 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1) {
              ++c.sent;
            } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
              markClosed(c);  // reset by the server
            }
          }
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  // Notes a close by the server (EOF or reset) and any bytes it sent first.
  void watch(Conn& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    char buf[512];
    while (true) {
      ssize_t n = ::recv(c.fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0) {
        c.answered = true;
        continue;
      }
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) markClosed(c);
      return;
    }
  }

  // Read after the close was seen, so never earlier than the close.
  void markClosed(Conn& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    c.closed = true;
    c.closed_at = std::chrono::steady_clock::now();
    --num_open_;
  }

  const Options options_;
  mutable absl::Mutex mu_;
  std::vector<Conn> conns_ ABSL_GUARDED_BY(mu_);  // the list is fixed once the constructor returns
  int num_connected_ = 0;
  std::atomic<int> num_open_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The scenario each HTTP listener's test runs: `options`' slow and idle
// clients are held against the listener while `normal_request` (a request
// a user makes; "" when it succeeded, else what went wrong) runs about
// five times a second. Expects every slow connection closed by the server
// without an answer, none before `header_timeout` after its connect (the
// server's deadline counts from its accept, which is later; a refusal at
// the cap would come at once) and all by `header_timeout` + `slack` (slack
// for a loaded machine: the timing is not what is tested), and every
// normal request served meanwhile and after.
inline void expectSlowClientsClosed(SlowClients::Options options, std::chrono::milliseconds header_timeout,
                                    std::chrono::milliseconds slack,
                                    const std::function<std::string()>& normal_request) {
  const int num_slow = options.num_trickling + options.num_silent;
  SlowClients slow(std::move(options));
  ASSERT_EQ(slow.numConnected(), num_slow);
  const auto give_up = std::chrono::steady_clock::now() + header_timeout + slack;
  int num_normal = 0;
  while (slow.numOpen() > 0 && std::chrono::steady_clock::now() < give_up) {
    const std::string failure = normal_request();
    EXPECT_EQ(failure, "") << "a normal request while " << slow.numOpen() << " slow connections were open";
    ++num_normal;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // pacing, not a wait for an outcome
  }
  const SlowClients::Report r = slow.report();
  EXPECT_EQ(r.num_open, 0) << r.num_open << " of " << num_slow << " slow connections still open "
                           << (header_timeout + slack).count() << " ms after they connected";
  EXPECT_EQ(r.num_answered, 0) << "slow connections that got a response instead of being closed";
  if (r.num_open < num_slow) {
    // The client takes its connect time once connect() returned, a little
    // after the server accepted (whose clock the deadline runs on) and
    // truncates to milliseconds: 100 ms of slack on that side only.
    EXPECT_GE(r.earliest_close, header_timeout - std::chrono::milliseconds(100))
        << "a slow connection was closed before the header deadline";
  }
  EXPECT_GT(num_normal, 0);
  std::printf("%d slow connections closed %.1f to %.1f s after connecting; %d normal requests served meanwhile\n",
              num_slow - r.num_open, r.earliest_close.count() / 1e3, r.latest_close.count() / 1e3, num_normal);
  EXPECT_EQ(normal_request(), "") << "a normal request once the slow connections were gone";
}

}  // namespace tandem::testutil
