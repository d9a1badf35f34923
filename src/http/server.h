#pragma once
// The HTTP server under the agent's OpenAI-compatible API, its internal API,
// /metrics and /healthz, and the router. Two libraries serve it behind this
// one contract (ServerOptions::library): Boost.Beast and cpprestsdk's
// listener; neither appears in this header.
//
//   Routes routes;
//   routes.handle("GET", "/healthz", [](Request&) { return Response::text(200, "ok\n"); });
//   routes.handle("POST", "/v1/completions", [&engine](Request& req) -> Response {
//     auto body = req.json();
//     if (!body.ok()) return Response::error(body.status());       // 400 with the parser's message
//     if (!(*body).value("stream", false)) {
//       return Response::deferred([&engine, b = *body](std::shared_ptr<Responder> r) {
//         engine.submit(b, [r](nlohmann::json result) { r->respond(Response::json(200, result)); });
//       });
//     }
//     return Response::sse([&engine, b = *body](std::shared_ptr<SseWriter> sse) {
//       auto id = engine.submit(b, sse);        // engine thread: sse->send(chunk) per token, then close()
//       sse->context().onCancel([&engine, id] { engine.cancel(id); });   // client gone, shutdown
//     });
//   });
//   TANDEM_ASSIGN_OR_RETURN(auto server, Server::start({.port = 8100}, std::move(routes)));
//   ...
//   server->shutdown(std::chrono::seconds(10));
//
// Before a handler runs, the server answers these itself, in this order, each
// with an errorBody() JSON (error.h):
//   shutting down                         503 (and Connection: close)
//   Content-Length over maxBodyBytes      413; the body is discarded as it arrives, never held
//   body grows past maxBodyBytes          413 (chunked uploads; checked while reading)
//   no route for the path                 404
//   a route, but not for this method      405 with an Allow header
//   body not UTF-8 (requireUtf8Body)      400
// (cpprestsdk writes any response only after the whole request body arrived,
// so there a 413 reaches a client once it finished sending; Beast sends it at
// once and closes the connection.) A handler that throws gets 400 for
// nlohmann::json::parse_error (with the parser's message: what was wrong, at
// which line and column) and 500 for anything else; nothing escapes into the
// library.
//
// Deadlines. Each request's deadline is requestTimeout after its headers
// arrived. A plain or deferred response that has not been started by then is
// replaced by 504 and the call's context is cancelled (kDeadline); whatever the
// handler sends later is dropped. For streams the deadline covers only the time
// until the stream opens (the handler returned Response::sse); an open stream
// lives until close(), a client disconnect, or shutdown, and the handler
// enforces its own limits (max_tokens, ...).
//
// Client disconnects. Neither library reads the socket while it writes a
// response, so a closed connection shows only when a write fails: on a stream,
// at the next event or keepalive comment (sseKeepalive). The kernel usually
// accepts one more write after the peer closed, so expect detection within
// two writes. The context is then cancelled with kClientDisconnected.
// Non-streamed responses are bounded by the deadline instead.
//
// Connections (Beast). A connection is closed when a request's headers do
// not arrive within headerTimeout, when a kept-alive connection stays without
// a request for idleTimeout, and at once when maxConnections are open
// already; a body that does not arrive within bodyTimeout gets 408 and the
// connection is closed. A response that did not consume the whole request
// body (413, 503) closes the connection after it, reading and dropping what
// the client still sends for a moment so that it sees the response. The
// cpprestsdk listener has none of these limits.
//
// Threads. Handlers and start callbacks run on the library's I/O threads
// (cpprestsdk's shared thread pool; Beast's own pool of at least 4),
// which also does the socket I/O; they must return quickly. Work that waits
// (the engine) is handed off through Response::deferred / Response::sse, whose
// Responder / SseWriter are thread-safe and may be used from any thread, also
// after the server is gone (they then report failure). Server methods are
// thread-safe.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "src/common/clock.h"
#include "src/http/headers.h"
#include "src/http/sse.h"

namespace tandem::http {

enum class CancelReason {
  kNone,                // not cancelled
  kDeadline,            // no response before the deadline; the client got 504
  kClientDisconnected,  // a write to the client failed
  kShutdown,            // the server's shutdown grace period ran out
};
std::string_view cancelReasonName(CancelReason reason);

// Per-call state shared by the server and the handler: the deadline and
// cancellation. Thread-safe. Held through std::shared_ptr, so it outlives the
// handler call for deferred and streamed responses.
class CallContext {
 public:
  explicit CallContext(MonoTime deadline) : deadline_(deadline) {}
  CallContext(const CallContext&) = delete;
  CallContext& operator=(const CallContext&) = delete;

  // When a non-streamed response must have been started (see the top).
  MonoTime deadline() const { return deadline_; }

  bool cancelled() const { return reason_.load(std::memory_order_acquire) != CancelReason::kNone; }
  CancelReason cancelReason() const { return reason_.load(std::memory_order_acquire); }

  // Runs `callback` once when the call is cancelled, or right away on this
  // thread if it already is. It runs on the cancelling thread (a server or
  // cpprestsdk thread) just after cancelled() turned true, so it must be short
  // and must not block (nor call Server::shutdown). It never runs for a call
  // that completes normally.
  void onCancel(std::function<void()> callback);

  // Blocks until the call is cancelled or `timeout` passes; returns cancelled().
  bool waitCancelled(Duration timeout) const;

  // Cancels the call and runs the callbacks; false if it already was cancelled.
  // The server calls this; handlers normally only observe.
  bool cancel(CancelReason reason);

 private:
  const MonoTime deadline_;
  std::atomic<CancelReason> reason_{CancelReason::kNone};
  mutable absl::Mutex mu_;
  std::vector<std::function<void()>> callbacks_ ABSL_GUARDED_BY(mu_);
};

// One request as the handler sees it. The server builds it; tests of handlers
// can build one directly.
class Request {
 public:
  Request(std::string method, std::string path, QueryParams query, Headers headers, std::string body,
          std::shared_ptr<CallContext> context);

  const std::string& method() const { return method_; }  // "GET", "POST", ...
  const std::string& path() const { return path_; }      // percent-decoded, without the query
  const QueryParams& queryParams() const { return query_; }
  std::optional<std::string> query(std::string_view name) const;
  const Headers& headers() const { return headers_; }
  std::optional<std::string> header(std::string_view name) const;  // case-insensitive
  const std::string& body() const { return body_; }

  // The body parsed as JSON. InvalidArgument("request body is not valid JSON:
  // <what and where>") when it is not; Response::error() turns that into 400.
  // (This header only forward-declares nlohmann::json: callers include <nlohmann/json.hpp>.)
  absl::StatusOr<nlohmann::json> json() const;

  CallContext& context() const { return *context_; }
  const std::shared_ptr<CallContext>& sharedContext() const { return context_; }
  MonoTime deadline() const { return context_->deadline(); }
  bool cancelled() const { return context_->cancelled(); }

 private:
  std::string method_;
  std::string path_;
  QueryParams query_;
  Headers headers_;
  std::string body_;
  std::shared_ptr<CallContext> context_;
};

// An open event stream (Content-Type: text/event-stream, chunked). Each call
// is pushed to the client at once, not buffered until the end. Thread-safe.
// Dropping the last reference closes the stream.
class SseWriter {
 public:
  virtual ~SseWriter() = default;
  // Sends one `data:` event. False, and nothing sent, once the stream is
  // closed or the call cancelled (client gone, shutdown); the caller should
  // then stop producing.
  virtual bool send(std::string_view data) = 0;
  // Sends an event with a type and/or id (sse.h).
  virtual bool sendEvent(const SseEvent& event) = 0;
  // Sends `bytes` as they are, without SSE framing, for streams in another
  // format (a Kubernetes watch: newline-delimited JSON). Such a stream sets
  // its own Content-Type with Response::setHeader and runs on a server whose
  // sseKeepalive is zero, since keepalive comments are SSE framing.
  virtual bool sendRaw(std::string_view bytes) = 0;
  // Bytes handed to the stream and not yet written to the socket: how far a
  // slow reader is behind, so a producer can stop feeding it instead of
  // queueing without bound. 0 where the library cannot tell.
  virtual size_t numUnsentBytes() const { return 0; }
  // Ends the stream (the final chunk goes out after what was sent). Idempotent.
  virtual void close() = 0;
  virtual CallContext& context() = 0;
  bool cancelled() { return context().cancelled(); }
};

class Response;

// The reply to a deferred call. Thread-safe; the first respond() wins.
// Dropping the last reference without responding sends 500.
class Responder {
 public:
  virtual ~Responder() = default;
  // Sends `response`: plain, or an event stream (Response::sse, whose start
  // callback runs on this thread before respond() returns), not deferred.
  // A handler that must wait before it knows whether it will stream (the
  // router, until D's first token) answers this way. False if a response
  // was already sent, e.g. 504 after the deadline or 503 at shutdown.
  virtual bool respond(Response response) = 0;
  virtual CallContext& context() = 0;
  bool cancelled() { return context().cancelled(); }
};

using SseStart = std::function<void(std::shared_ptr<SseWriter>)>;
using DeferredStart = std::function<void(std::shared_ptr<Responder>)>;

// What a handler returns: a complete response, an event stream, or a promise
// to respond later. Cheap to move.
class Response {
 public:
  enum class Kind { kPlain, kSse, kDeferred };

  Response() = default;
  static Response text(int status, std::string body, std::string contentType = "text/plain; charset=utf-8");
  // Never throws: invalid UTF-8 in strings is replaced with U+FFFD.
  static Response json(int status, const nlohmann::json& body);
  // errorBody(status, type, message) as application/json.
  static Response error(int status, std::string_view type, std::string_view message);
  // The Status's message, with httpStatusForStatus() and errorTypeForStatus().
  static Response error(const absl::Status& status);
  // 200 text/event-stream. `start` runs once the response headers are on
  // their way; it typically hands the writer to the thread that produces the
  // events. Not called if the call was already answered (deadline, shutdown).
  static Response sse(SseStart start);
  // No response yet: `start` runs right after the handler returns and hands
  // the Responder to whoever will answer. The deadline applies.
  static Response deferred(DeferredStart start);

  // Adds or replaces a response header (also on streams).
  Response& setHeader(std::string name, std::string value);

  Kind kind() const { return kind_; }
  int status() const { return status_; }
  const Headers& headers() const { return headers_; }
  const std::string& body() const { return body_; }
  const SseStart& sseStart() const { return sseStart_; }
  const DeferredStart& deferredStart() const { return deferredStart_; }

 private:
  Kind kind_ = Kind::kPlain;
  int status_ = 200;
  Headers headers_;
  std::string body_;
  SseStart sseStart_;
  DeferredStart deferredStart_;
};

using Handler = std::function<Response(Request&)>;

// The route table: method + exact path, or method + path prefix. An exact
// route beats a prefix route; among prefixes the longest wins. Methods are
// case-sensitive ("GET"). Immutable once given to the server.
class Routes {
 public:
  Routes& handle(std::string method, std::string path, Handler handler);
  Routes& handlePrefix(std::string method, std::string prefix, Handler handler);

  struct Match {
    const Handler* handler = nullptr;  // null: 404 if `allow` is empty, else 405
    std::string allow;                 // methods the path supports, ", "-separated
  };
  Match match(std::string_view method, std::string_view path) const;

 private:
  struct Route {
    std::string path;
    bool prefix = false;
    std::vector<std::pair<std::string, Handler>> byMethod;
  };
  Routes& add(std::string method, std::string path, bool prefix, Handler handler);

  std::vector<Route> routes_;
};

// The HTTP library under the server. Both honour this header's contract;
// only Beast enforces ServerOptions' connection limits (headerTimeout,
// bodyTimeout, idleTimeout, maxConnections). docs/http.md has the
// measurements behind the default.
enum class ServerLibrary { kBeast, kCpprest };
std::string_view serverLibraryName(ServerLibrary library);  // "beast", "cpprest"
// "beast" or "cpprest"; InvalidArgument naming the value otherwise.
absl::StatusOr<ServerLibrary> parseServerLibrary(std::string_view name);

struct ServerOptions {
  // Address to bind. "0.0.0.0" serves every interface.
  std::string host = "127.0.0.1";
  // 0: pick a free port (see Server::start for the race this implies).
  int port = 0;
  // Largest request body accepted; larger ones get 413.
  size_t maxBodyBytes = 16 << 20;
  // How long a non-streamed response may take (see Deadlines above).
  Duration requestTimeout = std::chrono::seconds(60);
  // An idle stream gets a ": keepalive" comment this often, so proxies keep it
  // open and a vanished client is noticed. Zero disables keepalives.
  Duration sseKeepalive = std::chrono::seconds(15);
  // Reject request bodies that are not UTF-8 with 400 (everything we accept is JSON or text).
  bool requireUtf8Body = true;
  // HTTPS: PEM files with the certificate chain and its private key. Both set:
  // the server speaks TLS only (baseUrl() is https://...); both empty: plain HTTP.
  // Unreadable or mismatched files fail start().
  std::string tlsCertFile;
  std::string tlsKeyFile;
  // Mutual TLS: when set (PEM CA bundle), clients must present a certificate
  // signed by it; the handshake fails otherwise.
  std::string tlsClientCaFile;
  // Time for deadlines, keepalives, connection limits and the shutdown
  // grace period. Not owned; must outlive the server. Null: SystemClock::instance().
  const Clock* clock = nullptr;
  // Which library serves. TLS (tlsCertFile) is served by cpprestsdk whatever
  // this says: the Beast listener speaks plain HTTP only.
  ServerLibrary library = ServerLibrary::kBeast;
  // Connection hygiene (Beast; see Connections above). A request's headers
  // must be complete this long after the connection was accepted or, on a
  // kept-alive connection, after the request's first byte; otherwise the
  // connection is closed without a response.
  Duration headerTimeout = std::chrono::seconds(10);
  // The body must be complete this long after the headers; otherwise 408 and
  // the connection is closed.
  Duration bodyTimeout = std::chrono::seconds(60);
  // A kept-alive connection with no request under way is closed after this.
  Duration idleTimeout = std::chrono::seconds(60);
  // Connections accepted beyond this many open ones are closed at once.
  size_t maxConnections = 4096;
};

class Server {
 public:
  // Binds and starts serving; returns once the port accepts connections.
  // cpprestsdk cannot listen on port 0 and report the port it got, so for
  // port 0 it gets a port found free by binding a socket to port 0 and
  // closing it. Another process could take the port in between; a failed
  // bind is retried with a fresh port a few times. (Beast binds port 0 itself.)
  static absl::StatusOr<std::unique_ptr<Server>> start(ServerOptions options, Routes routes);

  // shutdown(0) if it has not run.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const;
  // "http://<host>:<port>" (host as bound; "0.0.0.0" becomes "127.0.0.1"),
  // "https://..." with tlsCertFile.
  std::string baseUrl() const;

  // True once shutdown() started: /readyz can report not ready.
  bool draining() const;
  // Calls accepted and not finished (streams included).
  size_t numInFlight() const;

  // Stops taking requests (new ones get 503), lets calls in flight and open
  // streams finish for up to `grace`, then cancels the rest (kShutdown): open
  // streams are ended (the client sees the stream end without [DONE]),
  // unanswered calls get 503. Waits for handler calls that
  // are running to return, closes the listener, and returns. Idempotent.
  // cpprestsdk limitation: the port is released only when the last listener
  // in the process closes; until then new connections get a plain 404.
  void shutdown(Duration grace);

  class Impl;
  // Use start(); Impl (server_core.h) is private to src/http.
  explicit Server(std::shared_ptr<Impl> impl);

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace tandem::http
