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

#include "agent/transport/kv_transport.h"
#include "src/common/status.h"

namespace tandem {
class Clock;
}

namespace tandem::transport {

class UcxRegion;

struct TransportOptions {
  std::string host = "127.0.0.1";  // listen address
  int port = 8200;                 // 0: any free port (see port())
  // Memory peers may read (the KV pool); registered once at start.
  std::span<std::byte> region;
  // Or memory UCX allocated (preferred, see UcxRegion): the transport then
  // uses the pool's UCX context and registration, and `region`, `tls` and
  // the QoS fields are those the pool was allocated with.
  std::shared_ptr<UcxRegion> pool;
  // UCX_TLS for this worker, e.g. "tcp" or "posix,cma,tcp"; empty = UCX's default.
  std::string tls;
  std::optional<int> ib_sl;             // UCX_IB_SL for KV traffic
  std::optional<int> ib_traffic_class;  // UCX_IB_TRAFFIC_CLASS (RoCE) for KV traffic
  // Shared memory: a get from a peer whose pool UCX mapped into this process
  // is a plain copy; one of at least kParallelCopyMinBytes is shared by the
  // progress thread and copy_threads - 1 helper threads (1: the progress
  // thread alone). Single-thread memcpy leaves memory bandwidth unused.
  int copy_threads = 2;
  // Time for the transport's own deadlines (how long shutdown waits for gets
  // and closes to complete). Not owned; default SystemClock::instance().
  const Clock* clock = nullptr;
};

// KV pool memory allocated and registered by UCX (ucp_mem_map with
// UCP_MEM_MAP_ALLOCATE). On one machine UCX's shared-memory transports
// (posix, sysv) can map memory *they* allocated into a peer process, so a
// get from such a region is a plain memcpy; memory from malloc can be read
// there only through tcp (UCX then emulates gets with active messages). The
// agent allocates the pool here, gives bytes() to the engine
// (EngineOptions::kv_memory) and starts the transport with it
// (TransportOptions::pool). UCX falls back to ordinary memory when no
// shared-memory method can allocate (e.g. a small /dev/shm): still correct,
// only slower on one machine.
class UcxRegion {
 public:
  // `options` gives the UCX transports (tls) and QoS settings of the context.
  static absl::StatusOr<std::shared_ptr<UcxRegion>> allocate(size_t bytes, const TransportOptions& options);
  // Memory allocated elsewhere (a KV pool in GPU memory), registered with
  // UCX so that peers' gets read it and this agent's gets write it in place:
  // no staging copy (EngineOptions::kv_direct). `memory` is CUDA device
  // memory (UCS_MEMORY_TYPE_CUDA) where `cuda`, which this UCX must support
  // (cudaMemorySupported), or the mapping is refused saying so; else host
  // memory (what the CUDA emulator's device memory is). `keep_alive` owns
  // the memory: it is released only after the registration is undone.
  static absl::StatusOr<std::shared_ptr<UcxRegion>> map(std::span<std::byte> memory, bool cuda,
                                                        std::shared_ptr<void> keep_alive,
                                                        const TransportOptions& options);
  // Whether a UCX context with `options` lists CUDA memory (see cudaMemory),
  // asked of a context made for the question. False if none can be made.
  static bool cudaMemorySupported(const TransportOptions& options);
  ~UcxRegion();
  std::span<std::byte> bytes() const;
  // Whether this UCX can read and write CUDA device memory (its context
  // lists the CUDA memory type: NVIDIA's UCX builds with cuda_copy/cuda_ipc;
  // Debian's has no CUDA transports). The agent registers a device KV pool
  // directly where it can (map) and stages it through host memory where it
  // cannot (EngineOptions::kv_staging), and says which at start-up.
  bool cudaMemory() const;
  // The region is CUDA device memory (map with `cuda`): the host neither
  // reads nor writes it, and gets into it are UCX's (never a host memcpy).
  bool cudaRegion() const;

  struct Impl;

 private:
  friend class UcxTransport;
  explicit UcxRegion(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class UcxTransport final : public KvTransport {
 public:
  static constexpr size_t kParallelCopyMinBytes = size_t{4} << 20;

  static absl::StatusOr<std::unique_ptr<UcxTransport>> start(const TransportOptions& options,
                                                             TransportCallbacks callbacks);
  // Closes every connection (outstanding gets complete with Cancelled or an
  // error before this returns; it waits up to 5 s on the options' clock for
  // UCX to complete them) and stops the progress thread: no callback runs
  // after it returns. Idempotent; the destructor calls it. After it,
  // commands (send, get, ...) are ignored and their callbacks never run.
  void shutdown() override;
  ~UcxTransport();

  int port() const override;
  // What a peer needs to read our region: put these in kvproto::Hello.
  uint64_t regionBase() const override;
  uint64_t regionLength() const;
  const std::string& packedRkey() const override;
  std::string peerAddress(ConnId conn) const override;

  // Opens a connection; failures arrive as on_disconnect.
  ConnId connect(const std::string& host, int port) override;
  // Sends one control message (copied).
  void send(ConnId conn, std::vector<uint8_t> bytes) override;
  // The peer's region (from its Hello): needed before get() on this
  // connection. Gets outside [0, length) are refused without touching UCX,
  // so a bad offset can never make the peer read outside its region.
  void setRemoteRegion(ConnId conn, uint64_t base, uint64_t length, std::string packed_rkey) override;
  // Reads `length` bytes at the peer's region base + `remote_offset` into
  // `local` (which must stay valid until `done` runs). `done` runs exactly
  // once on the progress thread.
  GetId get(ConnId conn, void* local, uint64_t remote_offset, size_t length, std::function<void(absl::Status)> done);
  // One logical get of several segments (e.g. every block of one layer):
  // one command and one `done`, which runs once after every part finished —
  // OK only if all of them succeeded. Segments that are adjacent both here
  // and in the peer's region are merged into one UCX get, so a request whose
  // blocks are contiguous on both sides moves a layer in one message. If any
  // segment is out of range nothing is read. Cancellation covers all parts.
  // (Segment: KvTransport::Segment.)
  GetId getv(ConnId conn, std::vector<Segment> segments, std::function<void(absl::Status)> done) override;
  // Requests cancellation; the get's `done` still runs (Cancelled, or OK if
  // it completed first).
  void cancelGet(GetId id) override;
  void close(ConnId conn) override;

  // Counters for metrics (thread-safe). getsInFlight counts logical gets
  // (one per get()/getv() call); ucxGetsIssued counts the UCX gets (or,
  // from a peer pool mapped here, the copies) they
  // became after merging.
  uint64_t bytesRead() const;
  int64_t getsInFlight() const;
  uint64_t ucxGetsIssued() const override;

  struct Impl;

 private:
  explicit UcxTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::transport
