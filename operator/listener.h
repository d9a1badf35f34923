#pragma once
// The operator's HTTP listener (/healthz, /readyz, /metrics; port 8080):
// its clients are the kubelet's probes and Prometheus, a handful of
// connections with small requests, so its connection limits are tighter
// than an agent's (docs/operator.md).

#include <chrono>
#include <string>

#include "src/http/server.h"

namespace tandem::op {

inline http::ServerOptions operatorListenerOptions(std::string host, int port) {
  return {.host = std::move(host),
          .port = port,
          .maxBodyBytes = 1 << 20,  // nothing it serves takes a body
          .headerTimeout = std::chrono::seconds(5),
          .idleTimeout = std::chrono::seconds(30),
          .maxConnections = 1024};
}

}  // namespace tandem::op
