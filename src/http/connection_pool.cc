#include "src/http/connection_pool.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "src/common/strings.h"
#include "src/http/sse_client_impl.h"

namespace tandem::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using boost::system::error_code;
using tcp = asio::ip::tcp;

namespace {

// Response headers larger than this fail the request.
constexpr uint32_t kHeaderLimit = 64 * 1024;
// Bytes read from the socket at a time while streaming a body.
constexpr size_t kReadChunk = 16 * 1024;

// One kept-alive connection: its own io_context, run only by the thread
// that uses the connection, so a read completes on the reader's thread.
struct Connection {
  asio::io_context ioc{1};
  beast::tcp_stream stream{ioc};
  beast::flat_buffer buffer;
  MonoTime idle_since{};
  bool reused = false;

  // Starts one asynchronous operation (`start(handler)`) and runs it to
  // completion on this thread, bounded by `deadline`.
  template <typename Start>
  error_code run(MonoTime deadline, Start&& start) {
    ioc.restart();
    stream.expires_at(deadline);
    error_code result;
    start([&result](error_code ec, auto&&...) { result = ec; });
    ioc.run();
    return result;
  }

  // True while the server has neither closed an idle connection nor sent
  // anything unasked on it.
  bool quiet() {
    pollfd p{.fd = stream.socket().native_handle(), .events = POLLIN, .revents = 0};
    return ::poll(&p, 1, 0) == 0;
  }
};

bool closedByPeer(const error_code& ec) {
  return ec == bhttp::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset ||
         ec == asio::error::broken_pipe;
}

std::string describe(const error_code& ec) {
  if (ec == beast::error::timeout) return "timed out";
  return ec.message();
}

}  // namespace

StreamCanceller::~StreamCanceller() { detach(); }

void StreamCanceller::cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  // shutdown(2), not close: safe beside the thread blocked on the socket;
  // its read or write ends at once and the server sees the connection end.
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

bool StreamCanceller::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

bool StreamCanceller::attach(int socket_fd) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return false;
  if (fd_ >= 0) ::close(fd_);
  fd_ = ::dup(socket_fd);
  return true;
}

void StreamCanceller::detach() {
  absl::MutexLock lock(&mu_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

struct ConnectionPool::Shared {
  std::string base_url;  // "http://host:port"
  std::string host;
  std::string port;
  ConnectionPoolOptions options;
  std::atomic<int64_t> connects{0};
  absl::Mutex mu;
  std::vector<std::unique_ptr<Connection>> idle ABSL_GUARDED_BY(mu);  // the most recent last

  // An idle connection that is still good, if any.
  std::unique_ptr<Connection> takeIdle(MonoTime now) {
    for (;;) {
      std::unique_ptr<Connection> c;
      {
        absl::MutexLock lock(&mu);
        if (idle.empty()) return nullptr;
        c = std::move(idle.back());
        idle.pop_back();
      }
      if (now - c->idle_since < options.idle_timeout && c->quiet()) {
        c->reused = true;
        return c;
      }
    }
  }

  // Keeps `c` idle; closes those idle past idle_timeout and, when full, the
  // one idle longest (the front: the list is in the order they came back).
  void giveBack(std::unique_ptr<Connection> c, MonoTime now) {
    c->idle_since = now;
    std::vector<std::unique_ptr<Connection>> closing;  // closed outside the lock
    absl::MutexLock lock(&mu);
    while (!idle.empty() && (now - idle.front()->idle_since >= options.idle_timeout || idle.size() >= options.max_idle)) {
      closing.push_back(std::move(idle.front()));
      idle.erase(idle.begin());
    }
    if (options.max_idle > 0) idle.push_back(std::move(c));
  }
};

// A response being read on a pooled connection.
class PooledStream final : public SseClient::Impl {
 public:
  PooledStream(std::weak_ptr<ConnectionPool::Shared> pool, std::unique_ptr<Connection> conn,
               std::unique_ptr<bhttp::response_parser<bhttp::buffer_body>> parser, Duration timeout, std::string what,
               std::shared_ptr<StreamCanceller> canceller)
      : pool_(std::move(pool)),
        conn_(std::move(conn)),
        parser_(std::move(parser)),
        timeout_(timeout),
        what_(std::move(what)),
        canceller_(std::move(canceller)),
        status_(parser_->get().result_int()) {
    for (const auto& field : parser_->get()) {
      std::string name(field.name_string());
      std::string value(field.value());
      auto [it, fresh] = headers_.try_emplace(std::move(name), value);
      if (!fresh) it->second = strCat(it->second, ", ", value);
    }
  }

  ~PooledStream() override {
    canceller_->detach();  // from here on a cancel() cannot reach this socket
    const bool reusable = !canceller_->cancelled() && parser_->is_done() && parser_->keep_alive() &&
                          conn_->buffer.size() == 0 && conn_->stream.socket().is_open();
    if (!reusable) return;
    if (auto pool = pool_.lock()) pool->giveBack(std::move(conn_), std::chrono::steady_clock::now());
  }

  int status() const override { return status_; }
  const Headers& headers() const override { return headers_; }

  absl::Status readEvents(const std::function<bool(const SseEvent&)>& onEvent) override {
    std::vector<char> chunk(kReadChunk);
    for (;;) {
      if (canceller_->cancelled()) return cancelled();
      absl::StatusOr<size_t> got = readSome(chunk);
      if (!got.ok()) return got.status();
      if (*got == 0) return absl::OkStatus();
      for (const SseEvent& event : parser_sse_.feed(std::string_view(chunk.data(), *got))) {
        if (!onEvent(event)) {
          stop();
          return absl::OkStatus();
        }
      }
    }
  }

  absl::StatusOr<std::string> readBody() override {
    std::string body;
    std::vector<char> chunk(kReadChunk);
    for (;;) {
      if (canceller_->cancelled()) return cancelled();
      absl::StatusOr<size_t> got = readSome(chunk);
      if (!got.ok()) return got.status();
      if (*got == 0) return body;
      body.append(chunk.data(), *got);
    }
  }

  void stop() override { canceller_->cancel(); }

 private:
  absl::Status cancelled() const { return absl::CancelledError(strCat(what_, ": stopped")); }

  // The next bytes of the body (0 at its end); waits at most the timeout
  // for them.
  absl::StatusOr<size_t> readSome(std::vector<char>& chunk) {
    for (;;) {
      if (parser_->is_done()) return 0;
      auto& body = parser_->get().body();
      body.data = chunk.data();
      body.size = chunk.size();
      error_code ec = conn_->run(std::chrono::steady_clock::now() + timeout_, [&](auto handler) {
        bhttp::async_read_some(conn_->stream, conn_->buffer, *parser_, std::move(handler));
      });
      const size_t got = chunk.size() - body.size;
      if (ec == bhttp::error::need_buffer) ec = {};
      if (ec) {
        if (canceller_->cancelled()) return cancelled();
        if (ec == beast::error::timeout) {
          return absl::DeadlineExceededError(
              strCat(what_, ": no data for ", absl::FormatDuration(absl::FromChrono(timeout_))));
        }
        return absl::UnavailableError(strCat(what_, ": ", describe(ec)));
      }
      if (got > 0) return got;
    }
  }

  std::weak_ptr<ConnectionPool::Shared> pool_;
  std::unique_ptr<Connection> conn_;
  std::unique_ptr<bhttp::response_parser<bhttp::buffer_body>> parser_;
  const Duration timeout_;
  const std::string what_;
  const std::shared_ptr<StreamCanceller> canceller_;  // stop() is its cancel()
  const int status_;
  Headers headers_;
  SseParser parser_sse_;  // the reading thread only
};

namespace {

bhttp::request<bhttp::string_body> wireRequest(const ClientRequest& r, const ConnectionPool::Shared& pool) {
  bhttp::request<bhttp::string_body> req;
  const bhttp::verb verb = bhttp::string_to_verb(r.method);
  if (verb == bhttp::verb::unknown) {
    req.method_string(r.method);
  } else {
    req.method(verb);
  }
  req.target(r.url.empty() ? "/" : r.url);
  req.version(11);
  req.set(bhttp::field::host, strCat(pool.host, ":", pool.port));
  for (const auto& [name, value] : r.headers) req.set(name, value);
  if (r.headers.find("Accept") == r.headers.end()) req.set(bhttp::field::accept, "text/event-stream");
  if (!r.body.empty()) {
    if (r.headers.find("Content-Type") == r.headers.end()) req.set(bhttp::field::content_type, "application/json");
    req.body() = r.body;
  }
  req.keep_alive(true);
  req.prepare_payload();
  return req;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ConnectionPool>> ConnectionPool::create(std::string_view baseUrl,
                                                                       ConnectionPoolOptions options) {
  std::string base(baseUrl);
  while (!base.empty() && base.back() == '/') base.pop_back();
  constexpr std::string_view kScheme = "http://";
  if (base.compare(0, kScheme.size(), kScheme) != 0) {
    return absl::InvalidArgumentError(strCat("a connection pool needs an http:// URL, not '", baseUrl, "'"));
  }
  const std::string authority = base.substr(kScheme.size());
  const size_t colon = authority.rfind(':');
  if (authority.empty() || authority.find('/') != std::string::npos || colon == std::string::npos ||
      colon == 0 || colon + 1 == authority.size() ||
      authority.find_first_not_of("0123456789", colon + 1) != std::string::npos) {
    return absl::InvalidArgumentError(strCat("a connection pool needs 'http://host:port', not '", baseUrl, "'"));
  }
  auto shared = std::make_shared<Shared>();
  shared->base_url = base;
  shared->host = authority.substr(0, colon);
  shared->port = authority.substr(colon + 1);
  if (shared->host.size() > 2 && shared->host.front() == '[' && shared->host.back() == ']') {
    shared->host = shared->host.substr(1, shared->host.size() - 2);  // [::1]
  }
  shared->options = options;
  return std::unique_ptr<ConnectionPool>(new ConnectionPool(std::move(shared)));
}

ConnectionPool::ConnectionPool(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}
ConnectionPool::~ConnectionPool() = default;

const std::string& ConnectionPool::baseUrl() const { return shared_->base_url; }
int64_t ConnectionPool::numConnects() const { return shared_->connects.load(); }
size_t ConnectionPool::numIdle() const {
  absl::MutexLock lock(&shared_->mu);
  return shared_->idle.size();
}

absl::StatusOr<std::unique_ptr<SseClient>> ConnectionPool::open(const ClientRequest& request,
                                                                std::shared_ptr<StreamCanceller> canceller) {
  if (canceller == nullptr) canceller = std::make_shared<StreamCanceller>();
  const std::string what = strCat(request.method, " ", shared_->base_url, request.url);
  auto cancelled = [&] { return absl::CancelledError(strCat(what, ": cancelled")); };
  if (canceller->cancelled()) return cancelled();
  const bhttp::request<bhttp::string_body> wire = wireRequest(request, *shared_);
  const MonoTime deadline = std::chrono::steady_clock::now() + request.timeout;
  for (int attempt = 0;; ++attempt) {
    // The retry below goes out on a new connection, never another kept one.
    std::unique_ptr<Connection> conn = attempt == 0 ? shared_->takeIdle(std::chrono::steady_clock::now()) : nullptr;
    if (conn == nullptr) {
      conn = std::make_unique<Connection>();
      tcp::resolver resolver(conn->ioc);
      error_code ec;
      tcp::resolver::results_type addresses = resolver.resolve(shared_->host, shared_->port, ec);
      if (ec) return absl::UnavailableError(strCat(what, ": cannot resolve ", shared_->host, ": ", ec.message()));
      const MonoTime connect_by = std::min(deadline, std::chrono::steady_clock::now() + shared_->options.connect_timeout);
      ec = conn->run(connect_by, [&](auto handler) { conn->stream.async_connect(addresses, std::move(handler)); });
      if (ec == beast::error::timeout) return absl::DeadlineExceededError(strCat(what, ": connecting timed out"));
      if (ec) return absl::UnavailableError(strCat(what, ": ", ec.message()));
      conn->stream.socket().set_option(tcp::no_delay(true), ec);
      shared_->connects.fetch_add(1);
    }
    // From here a cancel() shuts this connection down.
    if (!canceller->attach(conn->stream.socket().native_handle())) return cancelled();
    bool wrote = false;
    error_code ec = conn->run(deadline, [&](auto handler) { bhttp::async_write(conn->stream, wire, std::move(handler)); });
    auto parser = std::make_unique<bhttp::response_parser<bhttp::buffer_body>>();
    parser->header_limit(kHeaderLimit);
    parser->body_limit(std::numeric_limits<std::uint64_t>::max());
    if (!ec) {
      wrote = true;
      ec = conn->run(deadline, [&](auto handler) {
        bhttp::async_read_header(conn->stream, conn->buffer, *parser, std::move(handler));
      });
    }
    if (!ec) {
      return std::make_unique<SseClient>(std::make_unique<PooledStream>(shared_, std::move(conn), std::move(parser),
                                                                        request.read_timeout.value_or(request.timeout),
                                                                        what, std::move(canceller)));
    }
    canceller->detach();
    if (canceller->cancelled()) return cancelled();
    // The server closed a kept-alive connection as the request went out:
    // it never saw the request, so a new connection may carry it.
    if (conn->reused && attempt == 0 && closedByPeer(ec) && conn->buffer.size() == 0 && !parser->got_some()) continue;
    if (ec == beast::error::timeout) {
      return absl::DeadlineExceededError(strCat(what, wrote ? ": no response within " : ": sending timed out after ",
                                                absl::FormatDuration(absl::FromChrono(request.timeout))));
    }
    return absl::UnavailableError(strCat(what, ": ", describe(ec)));
  }
}

}  // namespace tandem::http
