#pragma once
// The seam between the server's core (server_core.h: routing, deadlines,
// the one-responder state machine, shutdown) and an HTTP library. A listener
// (listener.h) accepts connections, parses a request's headers and hands the
// core one Wire per request; the core reads the body and answers through it.
// Internal to src/http.
//
// Order of calls from the core, for one Wire:
//   readBody (at most once; or discardBody after an early answer)
//   then exactly one of: reply(...) | openStream(...), writeStream* , closeStream
// `done` of reply/openStream runs exactly once: true when the last byte went
// out (a stream: after closeStream), false when the connection failed first.
// All methods are thread-safe and never throw; done callbacks run on a
// library thread and must not block.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "src/http/headers.h"

namespace tandem::http {

class Response;

// What readBody found.
struct BodyRead {
  enum class Outcome {
    kComplete,  // `body` holds all of it
    kTooLarge,  // more than the limit arrived (or was declared); nothing kept
    kTimedOut,  // the body did not arrive within bodyTimeout; `error` says so
    kFailed,    // the connection failed; `error` says how
  };
  Outcome outcome = Outcome::kComplete;
  std::string body;
  std::string error;
};

class Wire {
 public:
  virtual ~Wire() = default;

  virtual const std::string& method() const = 0;
  // The request target's path as sent (not decoded), for logs.
  virtual std::string rawPath() const = 0;
  // The path, percent-decoded, and the query parameters. InvalidArgument
  // when the target cannot be decoded (the core answers 400).
  virtual absl::Status decodeTarget(std::string& path, QueryParams& query) const = 0;
  virtual Headers headers() const = 0;
  // Content-Length, when the request declared one.
  virtual std::optional<uint64_t> declaredLength() const = 0;

  // Reads the whole body, holding at most `limit` bytes; calls `done` once.
  virtual void readBody(size_t limit, std::function<void(BodyRead)> done) = 0;
  // Throws the rest of the body away as it arrives (after an answer that did
  // not need it), so the memory held stays bounded.
  virtual void discardBody() = 0;

  // Sends `response` (a plain one) as it is.
  virtual void reply(const Response& response, std::function<void(bool ok)> done) = 0;
  // Sends 200 with `headers` and a chunked body that writeStream() feeds.
  virtual void openStream(const Headers& headers, std::function<void(bool ok)> done) = 0;
  // Queues `bytes` and pushes them to the client now (one chunk). False when
  // the stream cannot take them (closed, failed).
  virtual bool writeStream(std::string_view bytes) = 0;
  // Bytes queued by writeStream() and not yet written to the socket.
  virtual size_t numUnsentBytes() const = 0;
  // Ends the stream after what was written. Idempotent.
  virtual void closeStream() = 0;
};

}  // namespace tandem::http
