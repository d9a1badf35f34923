#pragma once
// Kept-alive HTTP/1.1 connections to one server, for a caller that sends
// many requests to it: the router to each decode agent (docs/http.md,
// "Client"). Boost.Beast, run on the caller's thread: no thread hand-off
// between the socket and the reader, and no connection set-up per request.
//
//   TANDEM_ASSIGN_OR_RETURN(auto pool, ConnectionPool::create("http://10.0.0.7:8100"));
//   TANDEM_ASSIGN_OR_RETURN(auto stream, pool->open({.method = "POST", .url = "/v1/completions", .body = b}));
//   stream->readEvents(...);   // as with SseClient::open
//
// A stream's connection goes back to the pool when the stream is destroyed
// after its whole response was read and the server left the connection
// open; a stream stopped (or destroyed) before its end closes its
// connection, which is how the server learns the client went away. An idle
// connection the server closed meanwhile is noticed before it is used. If a
// request still fails on a reused connection with the connection closed and
// not one response byte (the server closed it as the request went out), it
// is sent once more on a new connection; any other failure is returned.
//
// Timeouts: `request.timeout` bounds connecting (also bounded by the
// pool's connect_timeout), sending and the response headers together; then
// `request.read_timeout` (else `timeout`) bounds each silence while reading
// the body.
//
// Thread-safety: open() may be called from any number of threads; each
// stream is read by one thread and stop()ped from any. The pool may be
// destroyed while streams it opened are still in use.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "src/common/clock.h"
#include "src/http/client.h"

namespace tandem::http {

// Lets another thread abandon a pooled request at any point: during
// open() (connecting, sending, waiting for the headers) and while its
// stream is read. cancel() shuts the request's connection down, so the
// server sees the client go and a blocked call returns Cancelled. Create
// one per request, hand it to open(), and call cancel() from anywhere
// (e.g. the server call's onCancel); a cancel() before open() makes open()
// return Cancelled at once. Thread-safe. Once the request's connection is
// back in the pool, cancel() no longer touches it.
class StreamCanceller {
 public:
  StreamCanceller() = default;
  ~StreamCanceller();
  StreamCanceller(const StreamCanceller&) = delete;
  StreamCanceller& operator=(const StreamCanceller&) = delete;

  void cancel();
  bool cancelled() const;

 private:
  friend class ConnectionPool;
  friend class PooledStream;
  // The request's socket (its own descriptor, a dup, so that the number is
  // never another connection's); false if cancelled already.
  bool attach(int socket_fd);
  // The socket is no longer the request's (it went back to the pool, or
  // is closed).
  void detach();

  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
};

struct ConnectionPoolOptions {
  // Idle connections kept; one more is closed instead of kept.
  size_t max_idle = 64;
  // An idle connection older than this is closed rather than reused (below
  // the servers' own idle timeout, 60 s by default, so the client closes
  // first).
  Duration idle_timeout = std::chrono::seconds(30);
  // Connecting a new connection takes at most this (and at most the
  // request's own timeout).
  Duration connect_timeout = std::chrono::seconds(10);
};

class ConnectionPool {
 public:
  // `baseUrl`: "http://host:port" (no https).
  static absl::StatusOr<std::unique_ptr<ConnectionPool>> create(std::string_view baseUrl,
                                                                ConnectionPoolOptions options = {});
  ~ConnectionPool();
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;

  // Sends `request` (its `url` is the path and query) on an idle connection
  // or a new one, and returns once the response headers arrived; errors as
  // SseClient::open.
  // `canceller` (optional): see StreamCanceller; the stream's stop() cancels it too.
  absl::StatusOr<std::unique_ptr<SseClient>> open(const ClientRequest& request,
                                                  std::shared_ptr<StreamCanceller> canceller = nullptr);

  const std::string& baseUrl() const;
  // Connections opened so far, and kept idle now.
  int64_t numConnects() const;
  size_t numIdle() const;

  struct Shared;

 private:
  explicit ConnectionPool(std::shared_ptr<Shared> shared);
  std::shared_ptr<Shared> shared_;
};

}  // namespace tandem::http
