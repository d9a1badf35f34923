#pragma once
// A TCP forwarder on 127.0.0.1 for tests that cut a connection from the
// outside: every connection to port() is relayed to the target; cutAll()
// shuts down the relayed connections both ways (each side sees its
// connection end), while new connections keep working. bytesToTarget()
// shows what the clients sent, for tests of what a process passes on.

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tandem::testutil {

class TcpProxy {
 public:
  explicit TcpProxy(int target_port) : target_port_(target_port) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = loopback(0);
    bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    listen(listen_fd_, 16);
    socklen_t len = sizeof(a);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { acceptLoop(); });
  }

  ~TcpProxy() {
    stop_.store(true);
    shutdown(listen_fd_, SHUT_RDWR);
    acceptor_.join();
    cutAll();
    for (auto& t : relays_) t.join();
    absl::MutexLock lock(&mu_);
    for (int fd : open_) close(fd);
    close(listen_fd_);
  }

  int port() const { return port_; }

  // Ends every connection relayed so far.
  void cutAll() {
    absl::MutexLock lock(&mu_);
    for (int fd : open_) shutdown(fd, SHUT_RDWR);
  }

  int numAccepted() const { return accepted_.load(); }

  // Every byte the clients sent to the target so far, connections in the
  // order they were accepted (interleaved where they overlapped).
  std::string bytesToTarget() const {
    absl::MutexLock lock(&mu_);
    return to_target_;
  }

 private:
  static sockaddr_in loopback(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
  }

  void acceptLoop() {
    while (!stop_.load()) {
      int client = accept(listen_fd_, nullptr, nullptr);
      if (client < 0) return;
      int server = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a = loopback(target_port_);
      if (connect(server, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        close(client);
        close(server);
        continue;
      }
      accepted_.fetch_add(1);
      {
        absl::MutexLock lock(&mu_);
        open_.push_back(client);
        open_.push_back(server);
      }
      relays_.emplace_back([this, client, server] { relay(client, server); });
    }
  }

  // Copies bytes both ways until either side ends; `a` is the client.
  void relay(int a, int b) {
    char buf[16384];
    pollfd fds[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
    for (;;) {
      if (poll(fds, 2, -1) < 0) break;
      bool done = false;
      for (int i = 0; i < 2 && !done; ++i) {
        if (fds[i].revents == 0) continue;
        ssize_t n = read(fds[i].fd, buf, sizeof(buf));
        if (n > 0 && i == 0) {
          absl::MutexLock lock(&mu_);
          to_target_.append(buf, static_cast<size_t>(n));
        }
        if (n <= 0 || send(fds[1 - i].fd, buf, static_cast<size_t>(n), MSG_NOSIGNAL) != n) done = true;
      }
      if (done) break;
    }
    shutdown(a, SHUT_RDWR);
    shutdown(b, SHUT_RDWR);
  }

  const int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  mutable absl::Mutex mu_;
  std::vector<int> open_ ABSL_GUARDED_BY(mu_);
  std::string to_target_ ABSL_GUARDED_BY(mu_);  // both ends of every relayed connection; closed at the end
  std::thread acceptor_;
  std::vector<std::thread> relays_;  // the acceptor's until it is joined
};

}  // namespace tandem::testutil
