#pragma once
// A TCP forwarder for one ClusterIP Service port (what kube-proxy does with
// iptables rules): accepts on ADDRESS:PORT and joins each connection to one
// of the Service's ready endpoints, round-robin, copying bytes both ways
// until both sides have closed. With no ready endpoint a connection is
// closed at once (a client sees its connection reset, as with no endpoints
// on a real cluster).
//
// Thread-safety: setBackends() and stop() from any thread; a thread per
// connection (local use: tens of connections, not thousands).

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::kubelet {

struct Backend {
  std::string ip;
  int port = 0;
  bool operator==(const Backend&) const = default;
};

class TcpProxy {
 public:
  static absl::StatusOr<std::unique_ptr<TcpProxy>> start(const std::string& address, int port);
  ~TcpProxy();  // stop()
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  void setBackends(std::vector<Backend> backends);
  // Stops accepting, closes open connections, joins every thread.
  void stop();

 private:
  TcpProxy(int listen_fd) : listen_fd_(listen_fd) {}
  void acceptLoop();
  void serve(int client);
  void reapFinished();  // joins the threads of connections that ended

  const int listen_fd_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::vector<Backend> backends_;
  size_t next_ = 0;
  struct Connection {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Connection> connections_;
  std::vector<int> open_;  // client and backend sockets of open connections
  std::thread acceptor_;
};

}  // namespace tandem::kubelet
