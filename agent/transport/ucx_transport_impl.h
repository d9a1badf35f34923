#pragma once
// Internals of UcxTransport and UcxRegion (not part of their API; included
// only by the transport's own .cc files). One Impl holds the state; each
// piece that acts on it lives in its own file:
//
//   ucx_context.cc      the UCX context and the UCX-allocated pool (UcxRegion)
//   ucx_worker.cc       the worker, its progress thread and command queue, shutdown
//   ucx_connections.cc  the listener, endpoints, the connection handshake, control messages
//   ucx_memory.cc       registration of our region; the peers' rkeys
//   ucx_gets.cc         gets: checks, merging, issue, completion, cancellation
//   parallel_copier.cc  the helper threads of large shared-memory copies
//   ucx_transport.cc    the public API: start(), commands, counters
//
// Threading. The progress thread owns the UCP worker and every field marked
// "progress thread": only it reads or writes them (UCX callbacks run on it,
// from ucp_worker_progress), so they need no lock. Other threads only post
// commands (under `mu`) and read the atomic counters. Fields set in start()
// before the progress thread exists are read-only afterwards.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <ucp/api/ucp.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "agent/transport/parallel_copier.h"
#include "agent/transport/ucx_transport.h"
#include "src/common/clock.h"
#include "src/common/log.h"

namespace tandem::transport {

// An error status naming what failed and UCX's reason.
absl::Status ucsError(std::string_view what, ucs_status_t s);
// A UCP context with the transports and QoS settings of `o` (ucx_context.cc).
absl::StatusOr<ucp_context_h> createContext(const TransportOptions& o);

struct UcxRegion::Impl {
  ucp_context_h ctx = nullptr;
  ucp_mem_h memh = nullptr;
  std::span<std::byte> bytes;
  bool cuda = false;                 // CUDA device memory (map)
  std::shared_ptr<void> keep_alive;  // the mapped memory's owner: released after the unmap (declared last)
  ~Impl();
};

struct UcxTransport::Impl {
  using Segment = UcxTransport::Segment;

  // One connection (progress thread).
  struct Conn {
    ucp_ep_h ep = nullptr;
    ucp_rkey_h rkey = nullptr;
    uint64_t remote_base = 0;
    uint64_t remote_length = 0;
    std::unordered_set<GetId> gets;
    // Control messages wait until the endpoint's wire-up finished (a flush
    // completes then). UCX 1.13 can pick a protocol for the lane being
    // replaced while an endpoint moves from tcp to shared memory, and the
    // message is lost ("Invalid am_short_iov length").
    bool ready = false;
    bool close_when_ready = false;  // close() came before the wire-up finished
    std::vector<std::vector<uint8_t>> queued;
    // The peer's packed rkey if it was set before the wire-up finished: it
    // is unpacked again then. UCX 1.13 unpacks only the parts of an rkey
    // for transports the endpoint reaches at that moment, which before
    // wire-up is tcp alone; a get through such an rkey is emulated with
    // active messages (the peer's progress thread copies each 8 KiB into
    // a shared-memory FIFO and we copy it out) instead of one memcpy from
    // the peer's mapped pool, at half the speed and with the peer's CPU.
    std::optional<std::string> rkey_at_ready;
    // Rkeys replaced while gets used them; destroyed once no get is left.
    std::vector<ucp_rkey_h> retired_rkeys;
  };

  // One logical get: one or more UCX gets (merged segments). Progress thread.
  struct Get {
    ConnId conn = 0;
    std::vector<void*> requests;   // per part; nullptr once that part completed
    size_t pending = 0;            // parts not completed yet
    ucs_status_t status = UCS_OK;  // the first failure of any part
    size_t length = 0;
    bool cancel_requested = false;
    std::function<void(absl::Status)> done;
  };
  using GetMap = std::unordered_map<GetId, Get>;

  // Rkeys of a dropped connection whose gets have not all completed yet
  // (cancelling a get does not complete it at once): destroyed after them.
  struct Orphan {
    std::vector<ucp_rkey_h> rkeys;
    std::unordered_set<GetId> gets;
  };

  Impl(const Clock& clock, TransportCallbacks callbacks);
  ~Impl();

  // --- set up by start() before the progress thread runs; read-only after ---
  Logger log{"transport"};
  const Clock& clock;  // not owned
  const TransportCallbacks cb;
  std::shared_ptr<UcxRegion> pool;  // when set, owns ctx and memh
  // Our region is GPU memory (UcxRegion::cudaRegion): gets into it are
  // UCX's, told the memory type, never a host copy (copyDirectly).
  bool local_cuda = false;
  ucp_context_h ctx = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_listener_h listener = nullptr;
  ucp_mem_h memh = nullptr;
  uint64_t region_base = 0;
  uint64_t region_length = 0;
  std::string packed_rkey;
  int port = 0;
  int ucx_fd = -1, wake_fd = -1, epoll_fd = -1;
  std::unique_ptr<ParallelCopier> copier;  // shared-memory copies; used by the progress thread only

  // --- shared with the callers' threads ---
  absl::Mutex mu;
  std::deque<std::function<void()>> commands ABSL_GUARDED_BY(mu);
  bool stop ABSL_GUARDED_BY(mu) = false;
  absl::Mutex join_mu;  // one shutdown() joins
  std::thread thread ABSL_GUARDED_BY(join_mu);
  std::atomic<uint64_t> next_conn{1}, next_get{1};
  std::atomic<uint64_t> bytes_read{0};
  std::atomic<int64_t> inflight{0};
  std::atomic<uint64_t> ucx_gets{0};
  // Each open connection's peer address (peerAddress()); written by the
  // progress thread, read by callers.
  mutable absl::Mutex addr_mu;
  std::unordered_map<ConnId, std::string> peer_addrs ABSL_GUARDED_BY(addr_mu);

  // --- progress thread ---
  std::unordered_map<ConnId, Conn> conns;
  std::unordered_map<ucp_ep_h, ConnId> by_ep;
  GetMap gets;
  std::unordered_set<void*> closing;  // ep close requests in flight
  bool worker_busy = false;           // a flush at shutdown did not finish (flushWorker)
  std::unordered_map<ConnId, Orphan> orphans;

  // ucx_worker.cc: the worker and its thread.
  absl::Status createWorker(ucs_status_t* raw);  // *raw: what UCX said
  absl::Status setupWakeup();
  void startThread() ABSL_LOCKS_EXCLUDED(join_mu);
  // Queues `fn` for the progress thread and wakes it. Any thread.
  void post(std::function<void()> fn) ABSL_LOCKS_EXCLUDED(mu);
  void requestStop() ABSL_LOCKS_EXCLUDED(mu);
  void join() ABSL_LOCKS_EXCLUDED(join_mu);
  void run();
  bool runCommands() ABSL_LOCKS_EXCLUDED(mu);
  // Fruitless progress calls since the last progress, while gets are in
  // flight (the spin's; counted while it lasts).
  struct IdleGetPolls {
    int polls = 0;
    MonoTime since;  // when the first of them ran
  };
  void pollForGets(IdleGetPolls& idle);
  void waitForEvents();
  void drainWakeFd();
  void drain();
  void flushWorker(MonoTime deadline);

  // ucx_connections.cc: endpoints and their handshake.
  absl::Status listen(const std::string& host, int port);
  ucp_ep_params_t epParams();
  void accept(ucp_conn_request_h req);
  void doConnect(ConnId id, const std::string& host, int to_port);
  void awaitWireup(ConnId id, ucp_ep_h ep);
  void connReady(ConnId id);
  void epFailed(ucp_ep_h ep, ucs_status_t status);
  ucs_status_t received(void* data, size_t length, const ucp_am_recv_param_t* param);
  void doSend(ConnId id, std::vector<uint8_t> bytes);
  // `flush`: what was sent on it goes out first (a close() this side asked
  // for, after a last message); otherwise the endpoint closes at once.
  void dropConn(ConnId id, absl::Status why, bool flush = false);
  // close(): as dropConn(flush), once the endpoint's wire-up finished (what
  // waits for it is sent first).
  void closeConn(ConnId id);
  void closeEndpoint(ucp_ep_h ep);
  void flushThenClose(ucp_ep_h ep);

  // ucx_memory.cc: our region and the peers' rkeys.
  absl::Status registerRegion(std::span<std::byte> region, bool map_here);
  bool unpackRkey(ConnId id, Conn& conn, const std::string& packed);
  static void retireRkey(Conn& conn, ucp_rkey_h k);
  static void destroyRetiredRkeys(Conn& conn);
  void doSetRemote(ConnId id, uint64_t base, uint64_t length, std::string rkey);

  // ucx_gets.cc: gets.
  void doGet(GetId id, ConnId conn_id, std::vector<Segment> segments, std::function<void(absl::Status)> done);
  void issueGet(GetId id, ConnId conn_id, Conn& conn, const std::vector<Segment>& parts, size_t total,
                std::function<void(absl::Status)> done);
  bool copyDirectly(const Conn& conn, const std::vector<Segment>& parts, size_t total);
  void partDone(GetId id, size_t part, ucs_status_t status);
  void finishGet(GetMap::iterator it);
  void forgetGet(ConnId conn_id, GetId id);
  void cancelParts(GetId id);
  void doCancelGet(GetId id);
};

}  // namespace tandem::transport
