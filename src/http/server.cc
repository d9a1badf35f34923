#include "src/http/server.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <thread>

#include <boost/asio/ssl.hpp>
#include <cpprest/http_listener.h>
#include <cpprest/producerconsumerstream.h>
#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "src/common/log.h"
#include "src/common/status.h"
#include "src/common/strings.h"
#include "src/http/error.h"

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
// After the grace period, how long shutdown waits for the 503s and final
// chunks it forced to be written before closing the listener (which then
// closes whatever is left).
constexpr Duration kForcedFlushWait = std::chrono::seconds(2);

MonoTime now() { return std::chrono::steady_clock::now(); }

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

std::string invalidJsonMessage(const nlohmann::json::exception& e) {
  std::string_view what = e.what();
  // "[json.exception.parse_error.101] parse error at line 1, column 2: ..." -> from "parse error".
  if (size_t end = what.find("] "); what.starts_with("[json.exception.") && end != std::string_view::npos) {
    what.remove_prefix(end + 2);
  }
  return strCat("request body is not valid JSON: ", what);
}

std::string formatSeconds(Duration d) {
  return strCat(std::chrono::duration_cast<std::chrono::milliseconds>(d).count() / 1000.0, "s");
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

}  // namespace

// ---------------------------------------------------------------------------
// CallContext, Request, Response, Routes

std::string_view cancelReasonName(CancelReason reason) {
  switch (reason) {
    case CancelReason::kNone:
      return "none";
    case CancelReason::kDeadline:
      return "deadline";
    case CancelReason::kClientDisconnected:
      return "client_disconnected";
    case CancelReason::kShutdown:
      return "shutdown";
  }
  return "unknown";
}

void CallContext::onCancel(std::function<void()> callback) {
  {
    absl::MutexLock lock(&mu_);
    if (!cancelled()) {
      callbacks_.push_back(std::move(callback));
      return;
    }
  }
  callback();
}

bool CallContext::waitCancelled(Duration timeout) const {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(this, &CallContext::cancelled), absl::FromChrono(timeout));
  return cancelled();
}

bool CallContext::cancel(CancelReason reason) {
  std::vector<std::function<void()>> callbacks;
  {
    absl::MutexLock lock(&mu_);
    if (cancelled()) return false;
    reason_.store(reason, std::memory_order_release);
    callbacks.swap(callbacks_);
  }
  for (auto& callback : callbacks) {
    try {
      callback();
    } catch (const std::exception& e) {
      Logger("http").error("onCancel callback threw", {{"what", e.what()}});
    } catch (...) {
      Logger("http").error("onCancel callback threw a non-std exception");
    }
  }
  return true;
}

Request::Request(std::string method, std::string path, QueryParams query, Headers headers, std::string body,
                 std::shared_ptr<CallContext> context)
    : method_(std::move(method)),
      path_(std::move(path)),
      query_(std::move(query)),
      headers_(std::move(headers)),
      body_(std::move(body)),
      context_(std::move(context)) {}

std::optional<std::string> Request::query(std::string_view name) const {
  auto it = query_.find(name);
  if (it == query_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> Request::header(std::string_view name) const {
  auto it = headers_.find(name);
  if (it == headers_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<nlohmann::json> Request::json() const {
  try {
    return nlohmann::json::parse(body_);
  } catch (const nlohmann::json::exception& e) {
    // Bad syntax (parse_error), and valid syntax the parser still refuses:
    // a number beyond a double's range (out_of_range.406, "number overflow
    // parsing '1e400'").
    return absl::InvalidArgumentError(invalidJsonMessage(e));
  }
}

Response Response::text(int status, std::string body, std::string contentType) {
  Response r;
  r.status_ = status;
  r.body_ = std::move(body);
  r.headers_["Content-Type"] = std::move(contentType);
  return r;
}

Response Response::json(int status, const nlohmann::json& body) {
  return text(status, body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), "application/json");
}

Response Response::error(int status, std::string_view type, std::string_view message) {
  return text(status, errorBody(status, type, message), "application/json");
}

Response Response::error(const absl::Status& status) {
  int code = httpStatusForStatus(status);
  return error(code, errorTypeForStatus(code), toStd(status.message()));
}

Response Response::sse(SseStart start) {
  Response r;
  r.kind_ = Kind::kSse;
  r.sseStart_ = std::move(start);
  return r;
}

Response Response::deferred(DeferredStart start) {
  Response r;
  r.kind_ = Kind::kDeferred;
  r.deferredStart_ = std::move(start);
  return r;
}

Response& Response::setHeader(std::string name, std::string value) {
  headers_[std::move(name)] = std::move(value);
  return *this;
}

Routes& Routes::handle(std::string method, std::string path, Handler handler) {
  return add(std::move(method), std::move(path), false, std::move(handler));
}

Routes& Routes::handlePrefix(std::string method, std::string prefix, Handler handler) {
  return add(std::move(method), std::move(prefix), true, std::move(handler));
}

Routes& Routes::add(std::string method, std::string path, bool prefix, Handler handler) {
  auto route = std::find_if(routes_.begin(), routes_.end(),
                            [&](const Route& r) { return r.path == path && r.prefix == prefix; });
  if (route == routes_.end()) {
    routes_.push_back(Route{std::move(path), prefix, {}});
    route = std::prev(routes_.end());
  }
  auto same = std::find_if(route->byMethod.begin(), route->byMethod.end(),
                           [&](const auto& entry) { return entry.first == method; });
  if (same != route->byMethod.end()) {
    same->second = std::move(handler);  // the later registration wins
  } else {
    route->byMethod.emplace_back(std::move(method), std::move(handler));
  }
  return *this;
}

Routes::Match Routes::match(std::string_view method, std::string_view path) const {
  // Candidates by priority: the exact route, then prefixes, longest first.
  std::vector<const Route*> candidates;
  for (const Route& r : routes_) {
    if (r.prefix ? path.starts_with(r.path) : path == r.path) candidates.push_back(&r);
  }
  std::stable_sort(candidates.begin(), candidates.end(), [](const Route* a, const Route* b) {
    if (a->prefix != b->prefix) return !a->prefix;
    return a->path.size() > b->path.size();
  });
  Match match;
  std::vector<std::string> allowed;
  for (const Route* r : candidates) {
    for (const auto& [m, handler] : r->byMethod) {
      if (m == method) {
        match.handler = &handler;
        return match;
      }
      if (std::find(allowed.begin(), allowed.end(), m) == allowed.end()) allowed.push_back(m);
    }
  }
  std::sort(allowed.begin(), allowed.end());
  for (const std::string& m : allowed) match.allow = match.allow.empty() ? m : strCat(match.allow, ", ", m);
  return match;
}

// ---------------------------------------------------------------------------
// Server internals

namespace {

// One request/response exchange, from the request's headers until the
// response (or stream) has been written or failed.
class Exchange {
 public:
  enum class State {
    kPending,    // nothing sent yet: whoever claims it answers
    kAnswered,   // a complete response was handed to cpprestsdk
    kStreaming,  // an event stream is open (or was; see streamClosed_)
  };

  Exchange(std::shared_ptr<Server::Impl> server, wh::http_request raw, uint64_t id, MonoTime deadline)
      : server(std::move(server)), raw(std::move(raw)), id(id), context(std::make_shared<CallContext>(deadline)) {}

  const std::shared_ptr<Server::Impl> server;  // outlives every exchange
  wh::http_request raw;
  const uint64_t id;  // 0: not tracked (rejected while draining)
  const std::shared_ptr<CallContext> context;
  // Written only by the body-reading chain (one step at a time), then moved
  // into the Request.
  std::string body;
  // This exchange's entry in the server's timer queue; guarded by the
  // server's mutex. Erased when the exchange finishes, so finished exchanges
  // do not linger in the queue until their deadline.
  std::optional<std::pair<MonoTime, uint64_t>> deadlineTimer;

  // Moves kPending -> `next`; true for exactly one caller.
  bool claim(State next) {
    absl::MutexLock lock(&mu_);
    if (state_ != State::kPending) return false;
    state_ = next;
    if (next == State::kStreaming) {
      stream_.emplace();
      lastWrite_ = now();
    }
    return true;
  }

  bool pending() const {
    absl::MutexLock lock(&mu_);
    return state_ == State::kPending;
  }

  bool streamOpen() const {
    absl::MutexLock lock(&mu_);
    return state_ == State::kStreaming && !streamClosed_;
  }

  // The buffer cpprestsdk reads the response body from; call after claim(kStreaming).
  ByteBuffer stream() const {
    absl::MutexLock lock(&mu_);
    return *stream_;
  }

  // Appends bytes to the open stream and makes them readable at once (sync),
  // so cpprestsdk writes them as a chunk now instead of waiting for 4 KiB.
  bool write(std::string_view bytes) {
    absl::MutexLock lock(&mu_);
    if (state_ != State::kStreaming || streamClosed_ || context->cancelled()) return false;
    try {
      // producer_consumer_buffer copies synchronously; the task is already done.
      size_t n = stream_->putn_nocopy(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()).get();
      if (n != bytes.size()) return false;
      observe(stream_->sync());
    } catch (...) {
      return false;
    }
    lastWrite_ = now();
    return true;
  }

  // Ends the stream: cpprestsdk sends what is buffered, then the last chunk.
  void closeStream() {
    absl::MutexLock lock(&mu_);
    if (state_ != State::kStreaming || streamClosed_) return;
    streamClosed_ = true;
    try {
      observe(stream_->close(std::ios_base::out));
    } catch (...) {
    }
  }

  // When an idle stream should next get a keepalive; nullopt once closed.
  std::optional<MonoTime> keepaliveDue(Duration interval) const {
    absl::MutexLock lock(&mu_);
    if (state_ != State::kStreaming || streamClosed_) return std::nullopt;
    return lastWrite_ + interval;
  }

 private:
  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kPending;
  std::optional<ByteBuffer> stream_ ABSL_GUARDED_BY(mu_);
  bool streamClosed_ ABSL_GUARDED_BY(mu_) = false;
  MonoTime lastWrite_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

class Server::Impl : public std::enable_shared_from_this<Server::Impl> {
 public:
  Impl(ServerOptions options, Routes routes) : options_(std::move(options)), routes_(std::move(routes)) {}

  absl::Status open();
  void shutdown(Duration grace);

  int port() const { return port_; }
  const ServerOptions& options() const { return options_; }
  bool draining() const {
    absl::MutexLock lock(&mu_);
    return draining_;
  }
  size_t numInFlight() const {
    absl::MutexLock lock(&mu_);
    return inFlight_.size();
  }

  // Sends a complete response if nobody answered yet; false otherwise.
  bool answer(const std::shared_ptr<Exchange>& ex, const Response& response);
  bool answerError(const std::shared_ptr<Exchange>& ex, int status, std::string_view message) {
    return answer(ex, Response::error(status, errorTypeForStatus(status), message));
  }

 private:
  enum class TimerKind { kDeadline, kKeepalive };
  struct Timer {
    std::weak_ptr<Exchange> exchange;
    TimerKind kind;
  };
  // Ordered by time; the sequence number keeps keys unique so an entry can be erased.
  using TimerKey = std::pair<MonoTime, uint64_t>;

  void onRequest(wh::http_request raw);
  void readBody(std::shared_ptr<Exchange> ex);
  static void discardBody(ByteStreambuf body, std::shared_ptr<std::vector<uint8_t>> scratch);
  void dispatch(const std::shared_ptr<Exchange>& ex);
  Response callHandler(const Handler& handler, Request& request);
  void deliver(const std::shared_ptr<Exchange>& ex, Response response);
  void openStream(const std::shared_ptr<Exchange>& ex, const Response& response);
  void sendReply(const std::shared_ptr<Exchange>& ex, const wh::http_response& response);
  void finish(Exchange& ex);

  bool enterHandler();
  void leaveHandler();

  void addTimer(MonoTime when, const std::shared_ptr<Exchange>& ex, TimerKind kind);
  void timerLoop();
  void fire(const std::shared_ptr<Exchange>& ex, TimerKind kind);

  const ServerOptions options_;
  const Routes routes_;
  const Logger log_{"http"};
  int port_ = 0;
  std::unique_ptr<wh::experimental::listener::http_listener> listener_;
  std::thread timerThread_;

  mutable absl::Mutex mu_;
  absl::CondVar timersChanged_;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;  // new requests get 503
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;   // no more handler calls
  bool shutdownDone_ ABSL_GUARDED_BY(mu_) = false;
  bool stopTimers_ ABSL_GUARDED_BY(mu_) = false;
  int numRunningHandlers_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t nextId_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::weak_ptr<Exchange>> inFlight_ ABSL_GUARDED_BY(mu_);
  uint64_t nextTimerSeq_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<TimerKey, Timer> timers_ ABSL_GUARDED_BY(mu_);
};

namespace {

class SseWriterImpl final : public SseWriter {
 public:
  explicit SseWriterImpl(std::shared_ptr<Exchange> ex) : ex_(std::move(ex)) {}
  ~SseWriterImpl() override { ex_->closeStream(); }

  bool send(std::string_view data) override { return ex_->write(formatSseEvent(data)); }
  bool sendEvent(const SseEvent& event) override {
    return ex_->write(formatSseEvent(event.data, event.event == "message" ? "" : event.event, event.id));
  }
  bool sendRaw(std::string_view bytes) override { return ex_->write(bytes); }
  void close() override { ex_->closeStream(); }
  CallContext& context() override { return *ex_->context; }

 private:
  const std::shared_ptr<Exchange> ex_;
};

class ResponderImpl final : public Responder {
 public:
  explicit ResponderImpl(std::shared_ptr<Exchange> ex) : ex_(std::move(ex)) {}
  ~ResponderImpl() override {
    if (!responded_.load()) {
      ex_->server->answerError(ex_, 500, "internal error: the handler dropped the request without responding");
    }
  }

  bool respond(Response response) override {
    responded_.store(true);
    if (response.kind() != Response::Kind::kPlain) {
      return ex_->server->answerError(ex_, 500, "internal error: a deferred response must be a plain response");
    }
    return ex_->server->answer(ex_, response);
  }
  CallContext& context() override { return *ex_->context; }

 private:
  const std::shared_ptr<Exchange> ex_;
  std::atomic<bool> responded_{false};
};

}  // namespace

absl::Status Server::Impl::open() {
  std::string lastError;
  for (int attempt = 0; attempt < kMaxBindAttempts; ++attempt) {
    int port = options_.port;
    if (port == 0) {
      TANDEM_ASSIGN_OR_RETURN(port, pickFreePort(options_.host));
    }
    try {
      wh::experimental::listener::http_listener_config config;
      bool tls = !options_.tlsCertFile.empty();
      if (tls) {
        config.set_ssl_context_callback([cert = options_.tlsCertFile, key = options_.tlsKeyFile,
                                         client_ca = options_.tlsClientCaFile](boost::asio::ssl::context& ctx) {
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
      auto listener = std::make_unique<wh::experimental::listener::http_listener>(
          strCat(tls ? "https://" : "http://", options_.host, ":", port, "/"), config);
      auto entry = [this](wh::http_request raw) { onRequest(std::move(raw)); };
      listener->support(entry);
      // cpprestsdk answers OPTIONS and TRACE itself unless told otherwise; we route them like any method.
      listener->support(wh::methods::OPTIONS, entry);
      listener->support(wh::methods::TRCE, entry);
      listener->open().wait();
      listener_ = std::move(listener);
      port_ = port;
      break;
    } catch (const std::exception& e) {
      lastError = e.what();
      if (options_.port != 0) break;  // a fixed port that is taken stays taken
    }
  }
  if (!listener_) {
    return absl::UnavailableError(strCat("cannot listen on ", options_.host, ":",
                                         options_.port == 0 ? "<any>" : std::to_string(options_.port), ": ",
                                         lastError));
  }
  timerThread_ = std::thread([this] { timerLoop(); });
  log_.info("listening", {{"host", options_.host}, {"port", port_}});
  return absl::OkStatus();
}

void Server::Impl::onRequest(wh::http_request raw) {
  // Runs on a cpprestsdk I/O thread: nothing here may block or throw.
  try {
    std::shared_ptr<Exchange> ex;
    bool draining;
    {
      absl::MutexLock lock(&mu_);
      draining = draining_;
      uint64_t id = draining ? 0 : nextId_++;
      ex = std::make_shared<Exchange>(shared_from_this(), std::move(raw), id, now() + options_.requestTimeout);
      if (!draining) inFlight_[id] = ex;
    }
    if (draining) {
      answer(ex, Response::error(503, kUnavailableError, "server is shutting down").setHeader("Connection", "close"));
      discardBody(ex->raw.body().streambuf(), std::make_shared<std::vector<uint8_t>>(kBodyReadChunk));
      return;
    }
    addTimer(ex->context->deadline(), ex, TimerKind::kDeadline);
    uint64_t declared = ex->raw.headers().content_length();
    if (declared > options_.maxBodyBytes) {
      answerError(
          ex, 413,
          strCat("request body of ", declared, " bytes is over the limit of ", options_.maxBodyBytes, " bytes"));
      // cpprestsdk sends the response only after the whole body arrived;
      // throw the bytes away as they come instead of buffering them.
      discardBody(ex->raw.body().streambuf(), std::make_shared<std::vector<uint8_t>>(kBodyReadChunk));
      return;
    }
    readBody(std::move(ex));
  } catch (const std::exception& e) {
    log_.error("failed to accept a request", {{"what", e.what()}});
  }
}

void Server::Impl::readBody(std::shared_ptr<Exchange> ex) {
  // Reads at most maxBodyBytes + 1 bytes: one more than allowed proves the
  // body is too large without holding more of it.
  size_t offset = ex->body.size();
  size_t want = std::min(kBodyReadChunk, options_.maxBodyBytes + 1 - offset);
  ex->body.resize(offset + want);
  auto buf = ex->raw.body().streambuf();
  buf.getn(reinterpret_cast<uint8_t*>(ex->body.data() + offset), want)
      .then([this, ex, offset, buf](pplx::task<size_t> task) {
        size_t got = 0;
        try {
          got = task.get();
        } catch (const std::exception& e) {
          ex->body.clear();
          ex->context->cancel(CancelReason::kClientDisconnected);
          answerError(ex, 400, strCat("could not read the request body: ", e.what()));
          return;
        }
        ex->body.resize(offset + got);
        if (ex->body.size() > options_.maxBodyBytes) {
          ex->body.clear();
          answerError(ex, 413, strCat("request body is over the limit of ", options_.maxBodyBytes, " bytes"));
          discardBody(buf, std::make_shared<std::vector<uint8_t>>(kBodyReadChunk));
        } else if (got == 0) {
          dispatch(ex);
        } else {
          readBody(ex);
        }
      });
}

void Server::Impl::discardBody(ByteStreambuf body, std::shared_ptr<std::vector<uint8_t>> scratch) {
  body.getn(scratch->data(), scratch->size()).then([body, scratch](pplx::task<size_t> task) {
    size_t got = 0;
    try {
      got = task.get();
    } catch (...) {
      return;  // the connection failed; nothing left to discard
    }
    if (got > 0) discardBody(body, scratch);
  });
}

void Server::Impl::dispatch(const std::shared_ptr<Exchange>& ex) {
  if (!ex->pending()) return;  // the deadline passed while the body was arriving
  const std::string method = ex->raw.method();
  std::string path;
  QueryParams query;
  try {
    const web::uri& uri = ex->raw.request_uri();
    path = web::uri::decode(uri.path());
    for (const auto& [name, value] : web::uri::split_query(uri.query())) {
      query[web::uri::decode(name)] = web::uri::decode(value);
    }
  } catch (const std::exception& e) {
    answerError(ex, 400, strCat("invalid request URI: ", e.what()));
    return;
  }
  Routes::Match match = routes_.match(method, path);
  if (match.handler == nullptr) {
    if (match.allow.empty()) {
      answerError(ex, 404, strCat("no route for ", method, " ", path));
    } else {
      answer(ex, Response::error(405, kInvalidRequestError,
                                 strCat("method ", method, " is not allowed for ", path, "; allowed: ", match.allow))
                     .setHeader("Allow", match.allow));
    }
    return;
  }
  if (options_.requireUtf8Body && !isValidUtf8(ex->body)) {
    answerError(ex, 400, "request body is not valid UTF-8");
    return;
  }
  Headers headers;
  for (const auto& [name, value] : ex->raw.headers()) headers[name] = value;
  Request request(method, std::move(path), std::move(query), std::move(headers), std::move(ex->body), ex->context);
  if (!enterHandler()) {
    answerError(ex, 503, "server is shutting down");
    return;
  }
  deliver(ex, callHandler(*match.handler, request));
  leaveHandler();
}

Response Server::Impl::callHandler(const Handler& handler, Request& request) {
  try {
    return handler(request);
  } catch (const nlohmann::json::parse_error& e) {
    return Response::error(400, kInvalidRequestError, invalidJsonMessage(e));
  } catch (const std::exception& e) {
    log_.error("handler threw", {{"method", request.method()}, {"path", request.path()}, {"what", e.what()}});
    return Response::error(500, kServerError, strCat("internal error: ", e.what()));
  } catch (...) {
    log_.error("handler threw a non-std exception", {{"method", request.method()}, {"path", request.path()}});
    return Response::error(500, kServerError, "internal error: unknown exception");
  }
}

void Server::Impl::deliver(const std::shared_ptr<Exchange>& ex, Response response) {
  switch (response.kind()) {
    case Response::Kind::kPlain:
      answer(ex, response);
      return;
    case Response::Kind::kSse:
      openStream(ex, response);
      return;
    case Response::Kind::kDeferred: {
      auto responder = std::make_shared<ResponderImpl>(ex);
      try {
        if (response.deferredStart()) response.deferredStart()(responder);
      } catch (const std::exception& e) {
        responder->respond(Response::error(500, kServerError, strCat("internal error: ", e.what())));
      } catch (...) {
        responder->respond(Response::error(500, kServerError, "internal error: unknown exception"));
      }
      return;
    }
  }
}

void Server::Impl::openStream(const std::shared_ptr<Exchange>& ex, const Response& response) {
  if (!ex->claim(Exchange::State::kStreaming)) return;  // answered already (deadline): never start
  wh::http_response resp(wh::status_codes::OK);
  // No Content-Length: cpprestsdk sends the body chunked, one chunk per sync().
  resp.set_body(concurrency::streams::istream(ex->stream()), "text/event-stream");
  resp.headers()["Cache-Control"] = "no-cache";
  resp.headers()["X-Accel-Buffering"] = "no";  // tell nginx-style proxies not to buffer
  for (const auto& [name, value] : response.headers()) resp.headers()[name] = value;
  sendReply(ex, resp);
  if (options_.sseKeepalive > Duration::zero()) addTimer(now() + options_.sseKeepalive, ex, TimerKind::kKeepalive);

  auto writer = std::make_shared<SseWriterImpl>(ex);
  try {
    if (response.sseStart()) response.sseStart()(writer);
  } catch (const std::exception& e) {
    // The status line is gone already; the error travels as the last event.
    writer->send(errorBody(500, kServerError, strCat("internal error: ", e.what())));
    writer->close();
  } catch (...) {
    writer->send(errorBody(500, kServerError, "internal error: unknown exception"));
    writer->close();
  }
}

bool Server::Impl::answer(const std::shared_ptr<Exchange>& ex, const Response& response) {
  if (!ex->claim(Exchange::State::kAnswered)) return false;
  if (response.status() >= 500 && response.status() != 503) {  // 503s come in floods while draining
    log_.warn("server error response", {{"method", ex->raw.method()},
                                        {"path", ex->raw.request_uri().path()},
                                        {"status", response.status()},
                                        {"body", response.body()}});
  }
  try {
    sendReply(ex, toCpprest(response));
  } catch (const std::exception& e) {
    log_.error("failed to build a response", {{"what", e.what()}});
    finish(*ex);
  }
  return true;
}

void Server::Impl::sendReply(const std::shared_ptr<Exchange>& ex, const wh::http_response& response) {
  try {
    // The task completes when the last byte was written, and fails when a
    // write fails: the only sign cpprestsdk gives of a vanished client.
    ex->raw.reply(response).then([ex](pplx::task<void> task) {
      try {
        task.get();
      } catch (...) {
        ex->context->cancel(CancelReason::kClientDisconnected);
        ex->closeStream();
      }
      ex->server->finish(*ex);
    });
  } catch (const std::exception& e) {
    // cpprestsdk already answered (it replies 500 to requests whose
    // connection it closed) or the connection is gone.
    log_.debug("reply failed", {{"what", e.what()}});
    ex->context->cancel(CancelReason::kClientDisconnected);
    ex->closeStream();
    finish(*ex);
  }
}

void Server::Impl::finish(Exchange& ex) {
  absl::MutexLock lock(&mu_);
  if (ex.deadlineTimer) {
    timers_.erase(*ex.deadlineTimer);
    ex.deadlineTimer.reset();
  }
  if (ex.id != 0) inFlight_.erase(ex.id);
}

bool Server::Impl::enterHandler() {
  absl::MutexLock lock(&mu_);
  if (stopped_) return false;
  ++numRunningHandlers_;
  return true;
}

void Server::Impl::leaveHandler() {
  absl::MutexLock lock(&mu_);
  --numRunningHandlers_;
}

void Server::Impl::addTimer(MonoTime when, const std::shared_ptr<Exchange>& ex, TimerKind kind) {
  absl::MutexLock lock(&mu_);
  if (stopTimers_) return;
  bool earliest = timers_.empty() || when < timers_.begin()->first.first;
  TimerKey key{when, nextTimerSeq_++};
  timers_.emplace(key, Timer{ex, kind});
  if (kind == TimerKind::kDeadline) ex->deadlineTimer = key;
  if (earliest) timersChanged_.Signal();
}

void Server::Impl::timerLoop() {
  mu_.Lock();
  while (!stopTimers_) {
    if (timers_.empty()) {
      timersChanged_.Wait(&mu_);
      continue;
    }
    MonoTime t = now();
    auto first = timers_.begin();
    if (first->first.first > t) {
      timersChanged_.WaitWithTimeout(&mu_, absl::FromChrono(first->first.first - t));
      continue;
    }
    Timer timer = std::move(first->second);
    timers_.erase(first);
    std::shared_ptr<Exchange> ex = timer.exchange.lock();
    if (!ex) continue;  // finished and gone
    if (timer.kind == TimerKind::kDeadline) ex->deadlineTimer.reset();
    mu_.Unlock();
    fire(ex, timer.kind);
    ex.reset();  // the last reference may go here; never destroy an exchange under mu_
    mu_.Lock();
  }
  mu_.Unlock();
}

void Server::Impl::fire(const std::shared_ptr<Exchange>& ex, TimerKind kind) {
  if (kind == TimerKind::kDeadline) {
    if (!ex->claim(Exchange::State::kAnswered)) return;  // answered or streaming: the deadline is moot
    ex->context->cancel(CancelReason::kDeadline);
    Response timeout =
        Response::error(504, kTimeoutError,
                        strCat("no response within the request deadline of ", formatSeconds(options_.requestTimeout)));
    log_.warn("request deadline passed", {{"method", ex->raw.method()}, {"path", ex->raw.request_uri().path()}});
    try {
      sendReply(ex, toCpprest(timeout));
    } catch (...) {
      finish(*ex);
    }
    return;
  }
  std::optional<MonoTime> due = ex->keepaliveDue(options_.sseKeepalive);
  if (!due) return;
  if (*due <= now()) {
    ex->write(formatSseComment("keepalive"));
    due = ex->keepaliveDue(options_.sseKeepalive);
    if (!due) return;
  }
  addTimer(*due, ex, TimerKind::kKeepalive);
}

void Server::Impl::shutdown(Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (draining_) {
      // Another caller runs the shutdown; wait for it.
      mu_.Await(absl::Condition(&shutdownDone_));
      return;
    }
    draining_ = true;
  }
  log_.info("shutting down", {{"port", port_}, {"in_flight", numInFlight()}, {"grace", formatSeconds(grace)}});

  // 1. Let calls in flight and open streams finish on their own.
  auto idle = [this]() {
    mu_.AssertReaderHeld();
    return inFlight_.empty();
  };
  {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&idle), absl::FromChrono(grace));
    // 2. No handler starts from now on; wait for the ones running (they are
    // meant to be short). After this nothing can open a new stream.
    stopped_ = true;
    auto handlersDone = [this]() {
      mu_.AssertReaderHeld();
      return numRunningHandlers_ == 0;
    };
    mu_.Await(absl::Condition(&handlersDone));
  }

  // 3. Cancel what is left: close streams, answer the unanswered with 503.
  std::vector<std::shared_ptr<Exchange>> rest;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, weak] : inFlight_) {
      if (auto ex = weak.lock()) rest.push_back(std::move(ex));
    }
  }
  if (!rest.empty())
    log_.warn("cancelling calls still running at the end of the grace period", {{"count", rest.size()}});
  for (const auto& ex : rest) {
    if (ex->claim(Exchange::State::kAnswered)) {
      ex->context->cancel(CancelReason::kShutdown);
      sendReply(ex, toCpprest(Response::error(503, kUnavailableError, "server shut down before the call finished")
                                  .setHeader("Connection", "close")));
    } else if (ex->streamOpen()) {
      ex->context->cancel(CancelReason::kShutdown);
      ex->closeStream();
    }
  }
  rest.clear();
  {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&idle), absl::FromChrono(kForcedFlushWait));
  }

  // 4. Close the listener (cpprestsdk closes the remaining connections when
  // the process's last listener closes), then the timer thread.
  try {
    if (listener_) listener_->close().wait();
  } catch (const std::exception& e) {
    log_.warn("closing the listener failed", {{"what", e.what()}});
  }
  {
    absl::MutexLock lock(&mu_);
    stopTimers_ = true;
    timers_.clear();
    timersChanged_.Signal();
  }
  if (timerThread_.joinable()) timerThread_.join();
  {
    absl::MutexLock lock(&mu_);
    shutdownDone_ = true;
  }
  log_.info("shut down", {{"port", port_}});
}

// ---------------------------------------------------------------------------
// Server

absl::StatusOr<std::unique_ptr<Server>> Server::start(ServerOptions options, Routes routes) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(strCat("port out of range: ", options.port));
  }
  if (options.tlsCertFile.empty() != options.tlsKeyFile.empty()) {
    return absl::InvalidArgumentError("tlsCertFile and tlsKeyFile go together");
  }
  if (!options.tlsCertFile.empty()) {
    // cpprestsdk loads the files per connection and drops a connection whose
    // context fails; check them here so a bad file fails start() instead.
    try {
      boost::asio::ssl::context ctx(boost::asio::ssl::context::tls_server);
      ctx.use_certificate_chain_file(options.tlsCertFile);
      ctx.use_private_key_file(options.tlsKeyFile, boost::asio::ssl::context::pem);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(
          strCat("TLS certificate ", options.tlsCertFile, " / key ", options.tlsKeyFile, ": ", e.what()));
    }
  }
  auto impl = std::make_shared<Impl>(std::move(options), std::move(routes));
  TANDEM_RETURN_IF_ERROR(impl->open());
  return std::make_unique<Server>(std::move(impl));
}

Server::Server(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() { impl_->shutdown(Duration::zero()); }

int Server::port() const { return impl_->port(); }

std::string Server::baseUrl() const {
  const std::string& host = impl_->options().host;
  return strCat(impl_->options().tlsCertFile.empty() ? "http://" : "https://", host == "0.0.0.0" ? "127.0.0.1" : host,
                ":", impl_->port());
}

bool Server::draining() const { return impl_->draining(); }

size_t Server::numInFlight() const { return impl_->numInFlight(); }

void Server::shutdown(Duration grace) { impl_->shutdown(grace); }

}  // namespace tandem::http
