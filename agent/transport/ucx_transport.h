#pragma once
// The KV transport between agents on UCX's UCP API (DESIGN.md §2-§3).
//
// One UCP worker per agent, owned by one progress thread; every public
// method only queues a command and wakes that thread, so all of them are
// thread-safe. Callbacks run on the progress thread: keep them short.
//
//  * Control messages (src/kvproto bytes) travel as UCP active messages.
//  * Bulk KV moves only by get: the reader pulls from the peer's registered
//    region into its own memory. Nobody writes into another process's
//    memory, so a late transfer cannot land in a block that was freed and
//    reused ("owner writes").
//  * A get's completion callback runs exactly once: success, failure (peer
//    gone) or cancellation. Callers free the destination only after it —
//    cancelGet() asks UCX to cancel, it does not pretend the get is over.
//
// Transports: UCX picks among what UCX_TLS allows (TransportOptions::tls):
// "tcp" and shared memory ("posix", "sysv", "cma") on one machine, RDMA
// ("rc", "dc", "ud") on a cluster with the same code. The KV traffic's
// InfiniBand service level and RoCE traffic class go to UCX as
// UCX_IB_SL / UCX_IB_TRAFFIC_CLASS (TransportOptions::ib_sl/ib_traffic_class).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "src/common/status.h"

namespace tandem::transport {

using ConnId = uint64_t;
using GetId = uint64_t;

struct TransportOptions {
  std::string host = "127.0.0.1";  // listen address
  int port = 8200;                 // 0: any free port (see port())
  // Memory peers may read (the KV pool); registered once at start.
  std::span<std::byte> region;
  // UCX_TLS for this worker, e.g. "tcp" or "posix,cma,tcp"; empty = UCX's default.
  std::string tls;
  std::optional<int> ib_sl;             // UCX_IB_SL for KV traffic
  std::optional<int> ib_traffic_class;  // UCX_IB_TRAFFIC_CLASS (RoCE) for KV traffic
};

struct TransportCallbacks {
  // A peer connected to our listener.
  std::function<void(ConnId)> on_accept;
  // A control message arrived on a connection (raw kvproto bytes, copied).
  std::function<void(ConnId, std::vector<uint8_t>)> on_message;
  // A connection failed or was closed by the peer. Outstanding gets on it
  // complete with an error first.
  std::function<void(ConnId, absl::Status)> on_disconnect;
};

class UcxTransport {
 public:
  static absl::StatusOr<std::unique_ptr<UcxTransport>> start(const TransportOptions& options,
                                                             TransportCallbacks callbacks);
  // Closes every connection (outstanding gets complete with Cancelled or an
  // error before this returns) and stops the progress thread.
  ~UcxTransport();

  int port() const;
  // What a peer needs to read our region: put these in kvproto::Hello.
  uint64_t regionBase() const;
  uint64_t regionLength() const;
  const std::string& packedRkey() const;

  // Opens a connection; failures arrive as on_disconnect.
  ConnId connect(const std::string& host, int port);
  // Sends one control message (copied).
  void send(ConnId conn, std::vector<uint8_t> bytes);
  // The peer's region (from its Hello): needed before get() on this
  // connection. Gets outside [0, length) are refused without touching UCX,
  // so a bad offset can never make the peer read outside its region.
  void setRemoteRegion(ConnId conn, uint64_t base, uint64_t length, std::string packed_rkey);
  // Reads `length` bytes at the peer's region base + `remote_offset` into
  // `local` (which must stay valid until `done` runs). `done` runs exactly
  // once on the progress thread.
  GetId get(ConnId conn, void* local, uint64_t remote_offset, size_t length, std::function<void(absl::Status)> done);
  // Requests cancellation; the get's `done` still runs (Cancelled, or OK if
  // it completed first).
  void cancelGet(GetId id);
  void close(ConnId conn);

  // Counters for metrics (thread-safe).
  uint64_t bytesRead() const;
  int64_t getsInFlight() const;

  struct Impl;

 private:
  explicit UcxTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::transport
