#pragma once
// The KV transport as the P/D services see it (DESIGN.md §3): control
// messages to and from peers, and one-sided gets from a peer's registered KV
// region into this process's memory. UcxTransport is the implementation;
// tests put a fault-injecting wrapper in front of it (tests/agent/faults/).
//
// Contract every implementation keeps, which the P/D services rely on:
//  * Every method is thread-safe and never runs a callback inline: callbacks
//    run on the transport's own thread(s), so callers may hold their locks
//    while calling in.
//  * A get's `done` runs exactly once: success, failure (peer gone) or
//    cancellation. cancelGet() only asks; the caller frees the destination
//    after `done` ran ("a reader frees blocks only after its gets completed
//    or were cancelled").
//  * After shutdown() returns no callback runs, and commands are ignored.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "src/common/status.h"

namespace tandem::transport {

using ConnId = uint64_t;
using GetId = uint64_t;
struct TransportOptions;  // ucx_transport.h

struct TransportCallbacks {
  // A peer connected to our listener.
  std::function<void(ConnId)> on_accept;
  // A control message arrived on a connection (raw kvproto bytes, copied).
  std::function<void(ConnId, std::vector<uint8_t>)> on_message;
  // A connection failed or was closed by the peer. Outstanding gets on it
  // complete with an error first.
  std::function<void(ConnId, absl::Status)> on_disconnect;
};

class KvTransport {
 public:
  virtual ~KvTransport() = default;

  // Closes every connection (outstanding gets complete first) and stops the
  // transport's threads. Idempotent.
  virtual void shutdown() = 0;

  // The bound listener port.
  virtual int port() const = 0;
  // What a peer needs to read our region: put these in kvproto::Hello.
  virtual uint64_t regionBase() const = 0;
  virtual const std::string& packedRkey() const = 0;

  // Opens a connection; failures arrive as on_disconnect.
  virtual ConnId connect(const std::string& host, int port) = 0;
  // Sends one control message (copied).
  virtual void send(ConnId conn, std::vector<uint8_t> bytes) = 0;
  // The peer's region (from its Hello): needed before a get on `conn`.
  virtual void setRemoteRegion(ConnId conn, uint64_t base, uint64_t length, std::string packed_rkey) = 0;
  // Closes the connection once what was sent on it went out (so a last
  // message, e.g. why it is closed, reaches the peer). Its gets fail;
  // on_disconnect does not run for it.
  virtual void close(ConnId conn) = 0;
  // The peer's IP address ("" when unknown or closed): for an accepted
  // connection the client's, for one this side opened the host it named.
  // For logs, never for trust decisions.
  virtual std::string peerAddress(ConnId conn) const { return {}; }

  // One logical get of several segments from the peer's region into local
  // memory (which must stay valid until `done` runs). `done` runs once,
  // after every part finished: OK only if all succeeded.
  struct Segment {
    void* local = nullptr;
    uint64_t remote_offset = 0;
    size_t length = 0;
  };
  virtual GetId getv(ConnId conn, std::vector<Segment> segments, std::function<void(absl::Status)> done) = 0;
  // Requests cancellation; the get's `done` still runs (Cancelled, or OK if
  // it completed first).
  virtual void cancelGet(GetId id) = 0;

  // Gets issued on the wire after merging adjacent segments (for metrics).
  virtual uint64_t ucxGetsIssued() const = 0;
};

// Starts a transport with the given options and callbacks (the P/D services
// start theirs through one; UcxTransport::start by default).
using KvTransportFactory =
    std::function<absl::StatusOr<std::unique_ptr<KvTransport>>(const TransportOptions&, TransportCallbacks)>;

}  // namespace tandem::transport
