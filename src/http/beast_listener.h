#pragma once
// The listener on Boost.Beast (Asio underneath): a pool of I/O threads, one
// strand per connection, and the connection limits of ServerOptions
// (headerTimeout, bodyTimeout, idleTimeout, maxConnections), timed on the
// server's TimerQueue, so on its injected clock. Plain HTTP only. Beast's
// headers stay in beast_*.cc. Internal to src/http.

#include <memory>

#include "absl/status/statusor.h"
#include "src/http/listener.h"
#include "src/http/server.h"
#include "src/http/timer_queue.h"

namespace tandem::http {

// Binds options.host:options.port (0: any free port) and starts serving;
// every request goes to `sink`. `timers` must outlive the listener's close().
absl::StatusOr<std::unique_ptr<Listener>> openBeastListener(const ServerOptions& options, TimerQueue& timers,
                                                            RequestSink sink);

}  // namespace tandem::http
