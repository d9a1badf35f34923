#pragma once
// The listener on cpprestsdk's http_listener (the server's original
// library). Its limits, which the Beast listener does not have: no deadline
// for reading headers or body, no idle-connection timeout, no connection cap
// (ServerOptions' headerTimeout, bodyTimeout, idleTimeout and maxConnections
// are ignored here); a response goes out only after the whole request body
// arrived; a vanished client shows only when a write fails. Internal to src/http.

#include <memory>

#include "absl/status/statusor.h"
#include "src/http/listener.h"
#include "src/http/server.h"

namespace tandem::http {

// Binds options.host:options.port (port 0: see Server::start) and starts
// serving; every request goes to `sink`.
absl::StatusOr<std::unique_ptr<Listener>> openCpprestListener(const ServerOptions& options, RequestSink sink);

}  // namespace tandem::http
