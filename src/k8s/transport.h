#pragma once
// The HTTP seam under k8s::Client. Production uses makeHttpTransport()
// (cpprestsdk, HTTPS with the config's CA and client certificate, bearer
// token); tests may pass their own Transport to Client::createWithTransport().
//
// Thread-safety: a Transport is used from many threads at once. A LineStream
// is read by one thread; stop() may be called from any thread.

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "src/common/clock.h"
#include "src/k8s/config.h"

namespace tandem::k8s {

struct HttpRequest {
  std::string method = "GET";
  std::string path;         // path and query: "/api/v1/namespaces/x/pods?watch=true"
  std::string contentType;  // for a body
  std::string body;
  std::string accept = "application/json";
  // Whole exchange for send(); for a stream: opening, then the longest
  // silence between two reads.
  Duration timeout = std::chrono::seconds(30);
};

struct HttpResponse {
  int status = 0;
  std::string body;
};

// A streamed response body read line by line (newline-delimited JSON).
class LineStream {
 public:
  virtual ~LineStream() = default;
  // The next line without its '\n'; nullopt when the server closed the
  // stream cleanly. Cancelled after stop(), Unavailable / DeadlineExceeded
  // when the connection broke or went silent.
  virtual absl::StatusOr<std::optional<std::string>> nextLine() = 0;
  // Closes the connection; a nextLine() in progress returns. Idempotent.
  virtual void stop() = 0;
};

struct StreamResponse {
  int status = 0;
  std::string errorBody;              // the whole body, when status is not 2xx
  std::unique_ptr<LineStream> lines;  // set when status is 2xx
};

class Transport {
 public:
  virtual ~Transport() = default;
  // Transport failures are errors; an HTTP error status is not (it is in
  // the response).
  virtual absl::StatusOr<HttpResponse> send(const HttpRequest& request) = 0;
  virtual absl::StatusOr<StreamResponse> stream(const HttpRequest& request) = 0;
};

// InvalidArgument for a malformed server URL or unusable TLS material.
absl::StatusOr<std::unique_ptr<Transport>> makeHttpTransport(const ClusterConfig& config);

}  // namespace tandem::k8s
