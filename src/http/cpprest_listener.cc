#include "src/http/cpprest_listener.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include <cpprest/http_listener.h>
#include <cpprest/producerconsumerstream.h>
#include <boost/asio/ssl.hpp>

#include "absl/synchronization/mutex.h"
#include "src/common/log.h"
#include "src/common/status.h"
#include "src/common/strings.h"

namespace tandem::http {

namespace wh = web::http;
using ByteBuffer = concurrency::streams::producer_consumer_buffer<uint8_t>;
using ByteStreambuf = concurrency::streams::streambuf<uint8_t>;

namespace {

// Bytes asked of the request body stream per read. cpprestsdk completes a
// read when this much arrived or the body ended.
constexpr size_t kBodyReadChunk = 64 * 1024;
// Binds with an OS-picked port are retried this often when another process
// grabbed the port between our probe and cpprestsdk's bind.
constexpr int kMaxBindAttempts = 8;

// Completes a task nobody waits for. pplx terminates the process when a
// faulted task is destroyed without its exception being looked at.
template <typename T>
void observe(pplx::task<T> task) {
  task.then([](pplx::task<T> t) {
    try {
      t.wait();
    } catch (...) {
    }
  });
}

wh::http_response toCpprest(const Response& r) {
  wh::http_response resp(static_cast<wh::status_code>(r.status()));
  auto type = r.headers().find("Content-Type");
  resp.set_body(r.body(), type != r.headers().end() ? type->second : "text/plain; charset=utf-8");
  for (const auto& [name, value] : r.headers()) {
    if (type == r.headers().end() || name != type->first) resp.headers()[name] = value;
  }
  return resp;
}

// A port the OS considers free right now on `host` (see Server::start for the race).
absl::StatusOr<int> pickFreePort(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), "0", &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(strCat("cannot resolve host '", host, "': ", ::gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(found, &::freeaddrinfo);
  int fd = ::socket(found->ai_family, found->ai_socktype, found->ai_protocol);
  if (fd < 0) return absl::InternalError(strCat("socket(): ", std::strerror(errno)));
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  int port = -1;
  if (::bind(fd, found->ai_addr, found->ai_addrlen) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) == 0) {
    port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                       : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  }
  int err = errno;
  ::close(fd);
  if (port <= 0) return absl::UnavailableError(strCat("cannot bind ", host, ":0: ", std::strerror(err)));
  return port;
}

// Reads and drops a body until it ends or the connection fails.
void discardAll(ByteStreambuf body, std::shared_ptr<std::vector<uint8_t>> scratch) {
  body.getn(scratch->data(), scratch->size()).then([body, scratch](pplx::task<size_t> task) {
    size_t got = 0;
    try {
      got = task.get();
    } catch (...) {
      return;  // the connection failed; nothing left to discard
    }
    if (got > 0) discardAll(body, scratch);
  });
}

// One request on cpprestsdk. A stream is a producer_consumer_buffer that
// cpprestsdk reads the (chunked) response body from.
class CpprestWire final : public Wire, public std::enable_shared_from_this<CpprestWire> {
 public:
  explicit CpprestWire(wh::http_request raw) : raw_(std::move(raw)), method_(raw_.method()) {}

  const std::string& method() const override { return method_; }
  std::string rawPath() const override { return raw_.request_uri().path(); }
  absl::Status decodeTarget(std::string& path, QueryParams& query) const override;
  Headers headers() const override;
  std::optional<uint64_t> declaredLength() const override;
  void readBody(size_t limit, std::function<void(BodyRead)> done) override;
  void discardBody() override;
  void reply(const Response& response, std::function<void(bool ok)> done) override;
  void openStream(const Headers& headers, std::function<void(bool ok)> done) override;
  bool writeStream(std::string_view bytes) override;
  size_t numUnsentBytes() const override;
  void closeStream() override;

 private:
  // Reads the next chunk of the body into body_ (at most limit + 1 bytes in all).
  void readChunk(size_t limit, std::function<void(BodyRead)> done);
  void send(const wh::http_response& response, std::function<void(bool ok)> done);

  wh::http_request raw_;
  const std::string method_;
  // Written only by the body-reading chain (one step at a time).
  std::string body_;
  mutable absl::Mutex mu_;
  std::optional<ByteBuffer> stream_ ABSL_GUARDED_BY(mu_);
  bool streamClosed_ ABSL_GUARDED_BY(mu_) = false;
};

absl::Status CpprestWire::decodeTarget(std::string& path, QueryParams& query) const {
  try {
    const web::uri& uri = raw_.request_uri();
    path = web::uri::decode(uri.path());
    for (const auto& [name, value] : web::uri::split_query(uri.query())) {
      query[web::uri::decode(name)] = web::uri::decode(value);
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(strCat("invalid request URI: ", e.what()));
  }
  return absl::OkStatus();
}

Headers CpprestWire::headers() const {
  Headers headers;
  for (const auto& [name, value] : raw_.headers()) headers[name] = value;
  return headers;
}

std::optional<uint64_t> CpprestWire::declaredLength() const {
  uint64_t length = 0;
  if (!raw_.headers().match(wh::header_names::content_length, length)) return std::nullopt;
  return length;
}

void CpprestWire::readBody(size_t limit, std::function<void(BodyRead)> done) { readChunk(limit, std::move(done)); }

void CpprestWire::readChunk(size_t limit, std::function<void(BodyRead)> done) {
  // Reads at most limit + 1 bytes: one more than allowed proves the body is
  // too large without holding more of it.
  size_t offset = body_.size();
  size_t want = std::min(kBodyReadChunk, limit + 1 - offset);
  body_.resize(offset + want);
  auto self = shared_from_this();
  raw_.body()
      .streambuf()
      .getn(reinterpret_cast<uint8_t*>(body_.data() + offset), want)
      .then([self, offset, limit, done = std::move(done)](pplx::task<size_t> task) {
        size_t got = 0;
        try {
          got = task.get();
        } catch (const std::exception& e) {
          self->body_.clear();
          done({.outcome = BodyRead::Outcome::kFailed, .error = e.what()});
          return;
        }
        self->body_.resize(offset + got);
        if (self->body_.size() > limit) {
          self->body_.clear();
          done({.outcome = BodyRead::Outcome::kTooLarge});
        } else if (got == 0) {
          done({.body = std::move(self->body_)});
        } else {
          self->readChunk(limit, done);
        }
      });
}

void CpprestWire::discardBody() {
  // cpprestsdk sends a response only after the whole body arrived; throw the
  // bytes away as they come instead of buffering them.
  discardAll(raw_.body().streambuf(), std::make_shared<std::vector<uint8_t>>(kBodyReadChunk));
}

void CpprestWire::reply(const Response& response, std::function<void(bool ok)> done) {
  wh::http_response resp;
  try {
    resp = toCpprest(response);
  } catch (const std::exception& e) {
    Logger("http").error("failed to build a response", {{"what", e.what()}});
    done(false);
    return;
  }
  send(resp, std::move(done));
}

void CpprestWire::openStream(const Headers& headers, std::function<void(bool ok)> done) {
  wh::http_response resp(wh::status_codes::OK);
  ByteBuffer stream;
  {
    absl::MutexLock lock(&mu_);
    stream_.emplace();
    stream = *stream_;
  }
  // No Content-Length: cpprestsdk sends the body chunked, one chunk per sync().
  resp.set_body(concurrency::streams::istream(stream), "text/event-stream");
  for (const auto& [name, value] : headers) resp.headers()[name] = value;
  send(resp, std::move(done));
}

bool CpprestWire::writeStream(std::string_view bytes) {
  absl::MutexLock lock(&mu_);
  if (!stream_ || streamClosed_) return false;
  try {
    // producer_consumer_buffer copies synchronously; the task is already done.
    size_t n = stream_->putn_nocopy(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()).get();
    if (n != bytes.size()) return false;
    // sync() makes the bytes readable at once, so cpprestsdk writes them as
    // a chunk now instead of waiting for 4 KiB.
    observe(stream_->sync());
  } catch (...) {
    return false;
  }
  return true;
}

size_t CpprestWire::numUnsentBytes() const {
  absl::MutexLock lock(&mu_);
  if (!stream_ || streamClosed_) return 0;
  try {
    // What cpprestsdk has not read from the buffer yet (it reads the next
    // chunk once the previous one was written to the socket).
    return stream_->in_avail();
  } catch (...) {
    return 0;
  }
}

void CpprestWire::closeStream() {
  absl::MutexLock lock(&mu_);
  if (!stream_ || streamClosed_) return;
  streamClosed_ = true;
  try {
    observe(stream_->close(std::ios_base::out));
  } catch (...) {
  }
}

void CpprestWire::send(const wh::http_response& response, std::function<void(bool ok)> done) {
  try {
    // The task completes when the last byte was written, and fails when a
    // write fails: the only sign cpprestsdk gives of a vanished client.
    raw_.reply(response).then([done](pplx::task<void> task) {
      try {
        task.get();
      } catch (...) {
        done(false);
        return;
      }
      done(true);
    });
  } catch (const std::exception& e) {
    // cpprestsdk already answered (it replies 500 to requests whose
    // connection it closed) or the connection is gone.
    Logger("http").debug("reply failed", {{"what", e.what()}});
    done(false);
  }
}

void configureTls(wh::experimental::listener::http_listener_config& config, const ServerOptions& options) {
  config.set_ssl_context_callback([cert = options.tlsCertFile, key = options.tlsKeyFile,
                                   client_ca = options.tlsClientCaFile](boost::asio::ssl::context& ctx) {
    ctx.set_options(boost::asio::ssl::context::default_workarounds | boost::asio::ssl::context::no_sslv2 |
                    boost::asio::ssl::context::no_sslv3 | boost::asio::ssl::context::no_tlsv1 |
                    boost::asio::ssl::context::no_tlsv1_1);
    ctx.use_certificate_chain_file(cert);
    ctx.use_private_key_file(key, boost::asio::ssl::context::pem);
    if (!client_ca.empty()) {
      ctx.load_verify_file(client_ca);
      ctx.set_verify_mode(boost::asio::ssl::verify_peer | boost::asio::ssl::verify_fail_if_no_peer_cert);
    }
  });
}

class CpprestListener final : public Listener {
 public:
  CpprestListener(std::unique_ptr<wh::experimental::listener::http_listener> listener, int port)
      : listener_(std::move(listener)), port_(port) {}

  int port() const override { return port_; }
  void close() override {
    // cpprestsdk closes the remaining connections when the process's last
    // listener closes (server.h: the port is released only then).
    try {
      listener_->close().wait();
    } catch (const std::exception& e) {
      Logger("http").warn("closing the listener failed", {{"what", e.what()}});
    }
  }

 private:
  std::unique_ptr<wh::experimental::listener::http_listener> listener_;
  const int port_;
};

// Opens a cpprestsdk listener on `port`; throws what cpprestsdk throws.
std::unique_ptr<wh::experimental::listener::http_listener> listen(const ServerOptions& options, int port,
                                                                  const RequestSink& sink) {
  wh::experimental::listener::http_listener_config config;
  bool tls = !options.tlsCertFile.empty();
  if (tls) configureTls(config, options);
  auto listener = std::make_unique<wh::experimental::listener::http_listener>(
      strCat(tls ? "https://" : "http://", options.host, ":", port, "/"), config);
  auto entry = [sink](wh::http_request raw) {
    // Runs on a cpprestsdk I/O thread: nothing here may block or throw.
    try {
      sink(std::make_shared<CpprestWire>(std::move(raw)));
    } catch (const std::exception& e) {
      Logger("http").error("failed to accept a request", {{"what", e.what()}});
    }
  };
  listener->support(entry);
  // cpprestsdk answers OPTIONS and TRACE itself unless told otherwise; we route them like any method.
  listener->support(wh::methods::OPTIONS, entry);
  listener->support(wh::methods::TRCE, entry);
  listener->open().wait();
  return listener;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Listener>> openCpprestListener(const ServerOptions& options, RequestSink sink) {
  std::string lastError;
  for (int attempt = 0; attempt < kMaxBindAttempts; ++attempt) {
    int port = options.port;
    if (port == 0) {
      TANDEM_ASSIGN_OR_RETURN(port, pickFreePort(options.host));
    }
    try {
      return std::make_unique<CpprestListener>(listen(options, port, sink), port);
    } catch (const std::exception& e) {
      lastError = e.what();
      if (options.port != 0) break;  // a fixed port that is taken stays taken
    }
  }
  return absl::UnavailableError(strCat("cannot listen on ", options.host, ":",
                                       options.port == 0 ? "<any>" : std::to_string(options.port), ": ", lastError));
}

}  // namespace tandem::http
