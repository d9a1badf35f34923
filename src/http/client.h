#pragma once
// Blocking HTTP client and an incremental Server-Sent Events client, on
// cpprestsdk's http_client (kept out of this header).
//
//   TANDEM_ASSIGN_OR_RETURN(ClientResponse r, httpPost("http://127.0.0.1:8100/v1/completions", body));
//   if (r.status != 200) ...
//
//   TANDEM_ASSIGN_OR_RETURN(auto stream, SseClient::open({.method = "POST", .url = url, .body = body.dump()}));
//   absl::Status s = stream->readEvents([&](const SseEvent& e) {
//     if (e.data == "[DONE]") return false;   // false: stop and close the connection
//     handle(e.data);
//     return true;
//   });
//
// Errors are Status values, never exceptions: Unavailable for connection
// failures, DeadlineExceeded when the timeout ran out, InvalidArgument for a
// malformed URL, Cancelled after SseClient::stop(). An HTTP error status is not
// an error here: it comes back in ClientResponse::status.
//
// Thread-safety: Client and the free functions may be used from any number
// of threads. An SseClient is read by one thread; stop() may be called from
// any thread.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/common/clock.h"
#include "src/http/headers.h"
#include "src/http/sse.h"

namespace tandem::http {

struct ClientRequest {
  std::string method = "GET";
  std::string url;  // absolute: "http://host:port/path?query"
  Headers headers;
  std::string body;  // sent with Content-Length when not empty
  // Blocking calls: the whole exchange. SseClient: opening (until the
  // response headers arrive), and then the longest silence between two
  // reads of the stream.
  Duration timeout = std::chrono::seconds(30);
  // ConnectionPool only: the longest silence between two reads once the
  // response headers arrived, when it should differ from `timeout` (a
  // server that answers its headers at once and may then think a while).
  std::optional<Duration> read_timeout;
};

struct ClientResponse {
  int status = 0;
  Headers headers;
  std::string body;

  // The body parsed as JSON; InvalidArgument with the parser's message if it is not.
  absl::StatusOr<nlohmann::json> json() const;
  // OK for 2xx, else a Status carrying the error body's message (error.h's
  // shape) or the raw body, with statusCodeForHttpStatus().
  absl::Status toStatus() const;
};

// Sends one request and waits for the whole response.
absl::StatusOr<ClientResponse> httpSend(const ClientRequest& request);
absl::StatusOr<ClientResponse> httpGet(std::string_view url, Duration timeout = std::chrono::seconds(30));
// POSTs `body` as application/json.
absl::StatusOr<ClientResponse> httpPost(std::string_view url, const nlohmann::json& body,
                                        Duration timeout = std::chrono::seconds(30));

// A client bound to one server ("http://host:port") that reuses its
// connections; what the router keeps per agent.
class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> create(std::string_view baseUrl);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // `request.url` is the path and query ("/v1/models?x=1").
  absl::StatusOr<ClientResponse> send(const ClientRequest& request);
  absl::StatusOr<ClientResponse> get(std::string_view path, Duration timeout = std::chrono::seconds(30));
  absl::StatusOr<ClientResponse> post(std::string_view path, const nlohmann::json& body,
                                      Duration timeout = std::chrono::seconds(30));

  class Impl;
  // Use create().
  explicit Client(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

// Reads a streamed response event by event as the bytes arrive. Each
// SseClient owns its connection while it lives; stop(), or destruction
// before the end of the response, closes it, which is how a client tells
// the server it went away. (A stream from a ConnectionPool read to its end
// gives its connection back to the pool instead.)
class SseClient {
 public:
  // Sends the request and returns once the response headers arrived (any
  // status; check status() and read an error body with readBody()).
  static absl::StatusOr<std::unique_ptr<SseClient>> open(const ClientRequest& request);
  ~SseClient();  // stop()s, unless the pooled response was read to its end
  SseClient(const SseClient&) = delete;
  SseClient& operator=(const SseClient&) = delete;

  int status() const;
  const Headers& headers() const;

  // Calls `onEvent` for each event until the stream ends (OK), `onEvent`
  // returns false (OK; the connection is closed), stop() is called
  // (Cancelled), the connection fails (Unavailable) or stays silent longer
  // than the timeout (DeadlineExceeded). Call from one thread at a time.
  absl::Status readEvents(const std::function<bool(const SseEvent&)>& onEvent);
  // Reads the rest of the body as a whole (for non-stream responses).
  absl::StatusOr<std::string> readBody();
  // Closes the connection; a readEvents() in progress returns Cancelled.
  // Thread-safe, idempotent.
  void stop();

  class Impl;
  // Use open().
  explicit SseClient(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::http
