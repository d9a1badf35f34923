#pragma once
// Internal to src/http: what an SseClient reads through. Two
// implementations: a cpprestsdk client of its own per stream
// (SseClient::open, client.cc) and a kept-alive Boost.Beast connection
// borrowed from a ConnectionPool (connection_pool.cc).

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/http/client.h"

namespace tandem::http {

class SseClient::Impl {
 public:
  virtual ~Impl() = default;
  virtual int status() const = 0;
  virtual const Headers& headers() const = 0;
  virtual absl::Status readEvents(const std::function<bool(const SseEvent&)>& onEvent) = 0;
  virtual absl::StatusOr<std::string> readBody() = 0;
  // Thread-safe, idempotent.
  virtual void stop() = 0;
};

}  // namespace tandem::http
