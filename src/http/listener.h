#pragma once
// An HTTP library's half of the server: it binds, accepts, parses each
// request's headers and hands the request to the core as a Wire (wire.h).
// One implementation per library: cpprest_listener.h, beast_listener.h.
// Internal to src/http.

#include <functional>
#include <memory>

#include "src/http/wire.h"

namespace tandem::http {

// Called once per request whose headers arrived, on a library thread; must
// not block.
using RequestSink = std::function<void(std::shared_ptr<Wire>)>;

class Listener {
 public:
  virtual ~Listener() = default;
  // The port bound (the one picked, for port 0).
  virtual int port() const = 0;
  // Stops accepting and closes the connections still open. The sink is not
  // called after it returns; Wires still held report failure. Call once.
  virtual void close() = 0;
};

}  // namespace tandem::http
