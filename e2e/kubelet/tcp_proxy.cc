#include "e2e/kubelet/tcp_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>

#include "src/common/strings.h"

namespace tandem::kubelet {
namespace {

bool toAddress(const std::string& ip, int port, sockaddr_in& out) {
  out = {};
  out.sin_family = AF_INET;
  out.sin_port = htons(static_cast<uint16_t>(port));
  return inet_pton(AF_INET, ip.c_str(), &out.sin_addr) == 1;
}

// Connects within 2 s; -1 on failure.
int connectTo(const Backend& b) {
  sockaddr_in addr;
  if (!toAddress(b.ip, b.port, addr)) return -1;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  pollfd p{fd, POLLOUT, 0};
  int err = 0;
  socklen_t len = sizeof err;
  if (poll(&p, 1, 2000) != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
    close(fd);
    return -1;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpProxy>> TcpProxy::start(const std::string& address, int port) {
  sockaddr_in addr;
  if (!toAddress(address, port, addr)) return absl::InvalidArgumentError(strCat("proxy: bad address ", address));
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(strCat("proxy: socket: ", std::strerror(errno)));
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(fd, 128) != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    return absl::UnavailableError(strCat("proxy: cannot listen on ", address, ":", port, ": ", why));
  }
  std::unique_ptr<TcpProxy> p(new TcpProxy(fd));
  p->acceptor_ = std::thread([raw = p.get()] { raw->acceptLoop(); });
  return p;
}

TcpProxy::~TcpProxy() { stop(); }

void TcpProxy::setBackends(std::vector<Backend> backends) {
  std::lock_guard l(mu_);
  backends_ = std::move(backends);
}

void TcpProxy::stop() {
  if (stopping_.exchange(true)) return;
  if (acceptor_.joinable()) acceptor_.join();
  close(listen_fd_);
  std::vector<Connection> connections;
  {
    std::lock_guard l(mu_);
    for (int fd : open_) shutdown(fd, SHUT_RDWR);
    connections.swap(connections_);
  }
  for (auto& c : connections) c.thread.join();
}

void TcpProxy::reapFinished() {
  std::vector<Connection> finished;
  {
    std::lock_guard l(mu_);
    auto keep = std::partition(connections_.begin(), connections_.end(), [](const Connection& c) { return !*c.done; });
    std::move(keep, connections_.end(), std::back_inserter(finished));
    connections_.erase(keep, connections_.end());
  }
  for (auto& c : finished) c.thread.join();
}

void TcpProxy::acceptLoop() {
  while (!stopping_) {
    reapFinished();
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 100) != 1) continue;
    const int client = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    std::lock_guard l(mu_);
    if (stopping_) {
      close(client);
      break;
    }
    open_.push_back(client);
    auto done = std::make_shared<std::atomic<bool>>(false);
    connections_.push_back({std::thread([this, client, done] {
                              serve(client);
                              *done = true;
                            }),
                            done});
  }
}

void TcpProxy::serve(int client) {
  Backend backend;
  {
    std::lock_guard l(mu_);
    if (!backends_.empty()) backend = backends_[next_++ % backends_.size()];
  }
  const int upstream = backend.port > 0 ? connectTo(backend) : -1;
  if (upstream >= 0) {
    {
      std::lock_guard l(mu_);
      open_.push_back(upstream);
    }
    // Copy both ways; a side that closed its sending half is passed on as a
    // half-close, and the connection ends once both have.
    int fds[2] = {client, upstream};
    bool open_in[2] = {true, true};
    char buf[16384];
    while ((open_in[0] || open_in[1]) && !stopping_) {
      pollfd p[2] = {{open_in[0] ? fds[0] : -1, POLLIN, 0}, {open_in[1] ? fds[1] : -1, POLLIN, 0}};
      if (poll(p, 2, 200) < 0 && errno != EINTR) break;
      bool failed = false;
      for (int i = 0; i < 2 && !failed; ++i) {
        if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const ssize_t n = read(fds[i], buf, sizeof buf);
        if (n <= 0) {
          open_in[i] = false;
          shutdown(fds[1 - i], SHUT_WR);
          failed = n < 0;
          continue;
        }
        for (ssize_t done = 0; done < n;) {
          // send(MSG_NOSIGNAL): a peer that reset its connection is an error here, not SIGPIPE.
          const ssize_t w = send(fds[1 - i], buf + done, static_cast<size_t>(n - done), MSG_NOSIGNAL);
          if (w <= 0) {
            failed = true;
            break;
          }
          done += w;
        }
      }
      if (failed) break;
    }
  }
  std::lock_guard l(mu_);
  for (int fd : {client, upstream}) {
    if (fd < 0) continue;
    close(fd);
    open_.erase(std::remove(open_.begin(), open_.end(), fd), open_.end());
  }
}

}  // namespace tandem::kubelet
