#pragma once
// One attempt to serve a client's request on one decode agent, the part of
// the router that speaks HTTP to D (docs/routing.md, "Router role").
//
// A streamed request is relayed event by event as D sends it: the client's
// stream opens only when D's first event arrives, so a refusal (an HTTP
// error, or an error event before any token, e.g. a prefill that timed out)
// is still invisible to the client and the router may send the request to
// another worker. Once a token went out the attempt is the request's only
// one. When the client hangs up, the router closes its connection to D,
// which cancels the request there and frees its blocks (D notices the
// closed connection at its next write).
//
// Each attempt borrows a kept-alive connection to D from that worker's
// ConnectionPool (UpstreamPools) and runs on the caller's thread until it
// ends. Thread-safe.

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "src/common/clock.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "src/http/client.h"
#include "src/http/connection_pool.h"
#include "src/http/server.h"
#include "src/routing/reject_reason.h"

namespace tandem::agent {

// The router's connections to its decode workers: one pool per worker
// address, made on first use and kept while the router runs.
class UpstreamPools {
 public:
  // New connections to D take at most `connect_timeout`.
  explicit UpstreamPools(Duration connect_timeout) : connect_timeout_(connect_timeout) {}

  // InvalidArgument for a base URL a pool cannot take.
  absl::StatusOr<http::ConnectionPool*> get(const std::string& base_url);

 private:
  const Duration connect_timeout_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<http::ConnectionPool>> pools_ ABSL_GUARDED_BY(mu_);
};

// One attempt's link to the router's liveness view of its decode worker
// (docs/routing.md "Liveness"): until the client's response starts, the
// router may call the attempt off (the worker stopped answering) and send
// the request elsewhere; once it started, the attempt is the request's
// only one. Calling off cuts the connection to D (StreamCanceller), which D
// takes as a cancel. Thread-safe.
class UpstreamAttempt {
 public:
  UpstreamAttempt() : canceller_(std::make_shared<http::StreamCanceller>()) {}

  // The router: calls the attempt off unless the client's response has
  // started. True when it did.
  bool callOff();
  // The relay, right before the client's response starts: false when the
  // attempt was called off (nothing may be sent to the client then).
  bool start();
  bool calledOff() const;
  bool started() const;
  const std::shared_ptr<http::StreamCanceller>& canceller() const { return canceller_; }

 private:
  const std::shared_ptr<http::StreamCanceller> canceller_;
  mutable absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool called_off_ ABSL_GUARDED_BY(mu_) = false;
};

struct UpstreamRequest {
  std::string base_url;  // "http://host:port" of D's agent API
  std::string path;      // "/v1/chat/completions"
  std::string body;      // the client's body, as it came
  http::Headers headers;  // the client's session header and the decision's headers
  // Streamed: until D's response headers, which D sends at once.
  Duration open_timeout = std::chrono::seconds(10);
  // The longest silence once D answered a stream (D sends a keepalive
  // comment on an idle one), and the whole wait for a non-streamed answer,
  // whose headers come only with the finished completion.
  Duration idle_timeout = std::chrono::minutes(10);
  // Set by the router: lets it call the attempt off (null: never).
  std::shared_ptr<UpstreamAttempt> attempt;
};

// How an attempt ended.
struct UpstreamOutcome {
  enum class Kind {
    kServed,       // D's answer (success, or an error to relay as it is) reached the client
    kRefused,      // D refused before any token, for a typed reason: the client saw nothing yet
    kUnreachable,  // no response from D at all: the client saw nothing yet
    kClientGone,   // the client hung up (or the router is shutting down); D's request was cancelled
    kCalledOff,    // the router called it off (D stopped answering): the client saw nothing yet
  };
  Kind kind = Kind::kServed;
  std::optional<routing::RejectReason> reason;  // kRefused
  // What D said, to relay if no other worker takes the request (kRefused):
  // an HTTP error response, or (in_stream) the error event D sent as the
  // first event of its 200 stream.
  bool in_stream = false;
  int status = 0;
  std::string body;
  http::Headers headers;
  std::string detail;  // kUnreachable: the client library's message
  // Streams that reached the client: content chunks sent, when the first
  // and the last went out.
  int64_t chunks = 0;
  std::optional<MonoTime> first_chunk;
  MonoTime last_chunk{};
};

// Non-streamed: sends the request and, unless D refused for a reason
// another worker could serve, answers `responder` with D's response.
UpstreamOutcome forwardUnary(UpstreamPools& pools, const UpstreamRequest& request, http::Responder& responder);

// Streamed: opens a stream to D; on D's first token answers `responder`
// with an event stream and relays every event until D ends it.
// `on_first_chunk` runs when the first token is on its way to the client.
UpstreamOutcome forwardStream(UpstreamPools& pools, const UpstreamRequest& request, http::Responder& responder,
                              const Clock& clock, const std::function<void()>& on_first_chunk);

// Answers the client with a refusal that no worker could get past: D's own
// status and body (its `code` says why).
void relayRefusal(const UpstreamOutcome& outcome, http::Responder& responder);

}  // namespace tandem::agent
