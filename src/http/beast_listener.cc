#include "src/http/beast_listener.h"

#include <algorithm>
#include <thread>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/strand.hpp>

#include "src/common/log.h"
#include "src/common/strings.h"
#include "src/http/beast_connection.h"
#include "src/common/thread_name.h"

namespace tandem::http {

namespace asio = boost::asio;
using asio::ip::tcp;
using beast_impl::Connection;
using beast_impl::Shared;
using boost::system::error_code;

namespace {

// Handlers run on these threads too (server.h), so a few more than cores.
constexpr unsigned kMinIoThreads = 4;
// accept() failing for a reason other than shutdown (out of file
// descriptors) is retried after this, not in a busy loop.
constexpr Duration kAcceptRetry = std::chrono::milliseconds(50);

class BeastListener final : public Listener {
 public:
  BeastListener(std::shared_ptr<Shared> shared, tcp::acceptor acceptor)
      : shared_(std::move(shared)),
        acceptor_(std::move(acceptor)),
        port_(acceptor_.local_endpoint().port()),
        work_(asio::make_work_guard(shared_->io)) {}
  ~BeastListener() override { close(); }

  void start() {
    accept();
    unsigned n = std::max(kMinIoThreads, std::thread::hardware_concurrency());
    for (unsigned i = 0; i < n; ++i) threads_.emplace_back([this] {
      nameThisThread("http-io");
      shared_->io.run();
    });
  }

  int port() const override { return port_; }

  void close() override {
    if (shared_->closed.exchange(true)) return;
    asio::post(acceptor_.get_executor(), [this] {
      error_code ignored;
      acceptor_.close(ignored);
    });
    std::vector<std::shared_ptr<Connection>> open;
    {
      absl::MutexLock lock(&shared_->mu);
      for (const auto& weak : shared_->connections) {
        if (auto c = weak.lock()) open.push_back(std::move(c));
      }
      shared_->connections.clear();
    }
    for (const auto& c : open) c->closeSoon();
    open.clear();
    // With every socket closed, the I/O threads run out of work and return.
    work_.reset();
    for (auto& t : threads_) t.join();
  }

 private:
  void accept() {
    acceptor_.async_accept(asio::make_strand(shared_->io), [this](error_code ec, tcp::socket socket) {
      if (shared_->closed.load() || ec == asio::error::operation_aborted) return;
      if (ec) {
        Logger("http").warn("accept failed", {{"what", ec.message()}});
        shared_->timers.schedule(shared_->timers.clock().now() + kAcceptRetry, [this] {
          if (!shared_->closed.load()) asio::post(acceptor_.get_executor(), [this] { accept(); });
        });
        return;
      }
      admit(std::move(socket));
      accept();
    });
  }

  void admit(tcp::socket socket) {
    error_code ignored;
    if (shared_->numConnections.load() >= shared_->options.maxConnections) {
      // Over the cap: closed at once, before a byte is read.
      socket.close(ignored);
      Logger("http").debug("connection refused: at the connection cap",
                           {{"max_connections", shared_->options.maxConnections}});
      return;
    }
    socket.set_option(tcp::no_delay(true), ignored);  // stream events go out as they are written
    shared_->numConnections.fetch_add(1);
    auto connection = std::make_shared<Connection>(shared_, std::move(socket));
    {
      absl::MutexLock lock(&shared_->mu);
      auto& all = shared_->connections;
      if (all.size() > 2 * shared_->numConnections.load() + 64) {
        all.erase(std::remove_if(all.begin(), all.end(), [](const auto& w) { return w.expired(); }), all.end());
      }
      all.push_back(connection);
    }
    connection->start();
  }

  const std::shared_ptr<Shared> shared_;
  tcp::acceptor acceptor_;
  const int port_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::vector<std::thread> threads_;
};

absl::StatusOr<tcp::endpoint> resolve(asio::io_context& io, const std::string& host, int port) {
  error_code ec;
  asio::ip::address address = asio::ip::make_address(host, ec);
  if (!ec) return tcp::endpoint(address, static_cast<uint16_t>(port));
  tcp::resolver resolver(io);
  auto found = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
  if (ec || found.empty())
    return absl::InvalidArgumentError(strCat("cannot resolve host '", host, "': ", ec.message()));
  return found.begin()->endpoint();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Listener>> openBeastListener(const ServerOptions& options, TimerQueue& timers,
                                                            RequestSink sink) {
  auto shared = std::make_shared<Shared>(options, timers, std::move(sink));
  auto endpoint = resolve(shared->io, options.host, options.port);
  if (!endpoint.ok()) return endpoint.status();
  // On a strand: the accept loop and close() never touch the acceptor at once.
  tcp::acceptor acceptor(asio::make_strand(shared->io));
  error_code ec;
  acceptor.open(endpoint->protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(*endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(strCat("cannot listen on ", options.host, ":",
                                         options.port == 0 ? "<any>" : std::to_string(options.port), ": ",
                                         ec.message()));
  }
  auto listener = std::make_unique<BeastListener>(std::move(shared), std::move(acceptor));
  listener->start();
  return listener;
}

}  // namespace tandem::http
