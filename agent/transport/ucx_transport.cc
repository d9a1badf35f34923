#include "agent/transport/ucx_transport.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/prctl.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <ucp/api/ucp.h>

#include "src/common/log.h"
#include "src/common/strings.h"

namespace tandem::transport {
namespace {

constexpr unsigned kControlAmId = 1;
constexpr std::chrono::nanoseconds kGetPollInterval{20'000};
constexpr std::chrono::nanoseconds kGetSpin{50'000};

// Copies a list of byte ranges with the calling thread and `helpers` more
// threads, each taking an equal share of the bytes (4 KiB aligned).
class ParallelCopier {
 public:
  struct Range {
    std::byte* dst;
    const std::byte* src;
    size_t length;
  };

  explicit ParallelCopier(int helpers) {
    for (int i = 0; i < helpers; ++i) threads_.emplace_back([this, i] { run(i + 1); });
  }
  ~ParallelCopier() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  ParallelCopier(const ParallelCopier&) = delete;
  ParallelCopier& operator=(const ParallelCopier&) = delete;

  // Returns once every byte is copied.
  void copy(const std::vector<Range>& ranges, size_t total) {
    const int shares = static_cast<int>(threads_.size()) + 1;
    {
      std::lock_guard lock(mu_);
      job_ = &ranges;
      total_ = total;
      pending_ = static_cast<int>(threads_.size());
      ++generation_;
    }
    work_cv_.notify_all();
    copyShare(ranges, total, 0, shares);
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  // Bytes [total * share / shares, total * (share + 1) / shares) of the
  // ranges laid end to end, boundaries rounded down to 4 KiB.
  static void copyShare(const std::vector<Range>& ranges, size_t total, int share, int shares) {
    auto boundary = [&](int k) { return k == shares ? total : (total / static_cast<size_t>(shares) * static_cast<size_t>(k)) & ~size_t{4095}; };
    const size_t begin = boundary(share);
    const size_t end = boundary(share + 1);
    size_t pos = 0;
    for (const Range& r : ranges) {
      const size_t r_begin = pos;
      pos += r.length;
      if (pos <= begin) continue;
      if (r_begin >= end) break;
      const size_t a = std::max(begin, r_begin);
      const size_t b = std::min(end, pos);
      std::memcpy(r.dst + (a - r_begin), r.src + (a - r_begin), b - a);
    }
  }

  void run(int share) {
    uint64_t seen = 0;
    std::unique_lock lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      const std::vector<Range>* job = job_;
      const size_t total = total_;
      const int shares = static_cast<int>(threads_.size()) + 1;
      lock.unlock();
      copyShare(*job, total, share, shares);
      lock.lock();
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  const std::vector<Range>* job_ = nullptr;  // guarded by mu_
  size_t total_ = 0;                         // guarded by mu_
  int pending_ = 0;                          // helpers still copying; guarded by mu_
  uint64_t generation_ = 0;                  // guarded by mu_
  bool stop_ = false;                        // guarded by mu_
  std::vector<std::thread> threads_;
};

absl::Status ucsError(std::string_view what, ucs_status_t s) {
  return absl::UnavailableError(strCat(what, ": ", ucs_status_string(s)));
}

// A UCP context with the transports and QoS settings of `o`.
absl::StatusOr<ucp_context_h> createContext(const TransportOptions& o) {
  // Our endpoints ask for peer error handling, and UCX 1.13 leaves its
  // shared-memory transports out of such endpoints unless they detect peer
  // failure by keepalive: without this a "posix" pull silently runs over
  // tcp. (Not overridden when the operator set it.)
  // (Only when shared memory may be used: UCX warns about unused settings.)
  const bool may_use_shm = o.tls.empty() || o.tls.find("posix") != std::string::npos ||
                           o.tls.find("sysv") != std::string::npos || o.tls.find("sm") != std::string::npos ||
                           o.tls.find("mm") != std::string::npos || o.tls.find("all") != std::string::npos;
  if (may_use_shm) setenv("UCX_MM_ERROR_HANDLING", "y", /*overwrite=*/0);
  // A shared-memory peer that died is noticed only by UCX's keepalive (its
  // memory stays mapped, so gets from it still succeed): check every
  // second, not every 20 s (UCX's default), so D fails over promptly.
  setenv("UCX_KEEPALIVE_INTERVAL", "1s", /*overwrite=*/0);
  // A restarted agent must be able to listen on its port again at once,
  // while connections of its previous life linger in TIME_WAIT.
  setenv("UCX_TCP_CM_REUSEADDR", "y", /*overwrite=*/0);
  // QoS of KV traffic on InfiniBand / RoCE: UCX reads these from the environment.
  if (o.ib_sl) setenv("UCX_IB_SL", std::to_string(*o.ib_sl).c_str(), 1);
  if (o.ib_traffic_class) setenv("UCX_IB_TRAFFIC_CLASS", std::to_string(*o.ib_traffic_class).c_str(), 1);
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return ucsError("ucp_config_read", s);
  if (!o.tls.empty()) {
    s = ucp_config_modify(config, "TLS", o.tls.c_str());
    if (s != UCS_OK) {
      ucp_config_release(config);
      return absl::InvalidArgumentError(strCat("UCX transports \"", o.tls, "\": ", ucs_status_string(s)));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  ucp_context_h ctx = nullptr;
  s = ucp_init(&params, config, &ctx);
  ucp_config_release(config);
  if (s != UCS_OK) return ucsError("ucp_init", s);
  return ctx;
}

}  // namespace

struct UcxRegion::Impl {
  ucp_context_h ctx = nullptr;
  ucp_mem_h memh = nullptr;
  std::span<std::byte> bytes;
  ~Impl() {
    if (memh) ucp_mem_unmap(ctx, memh);
    if (ctx) ucp_cleanup(ctx);
  }
};

UcxRegion::UcxRegion(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
UcxRegion::~UcxRegion() = default;
std::span<std::byte> UcxRegion::bytes() const { return impl_->bytes; }

absl::StatusOr<std::shared_ptr<UcxRegion>> UcxRegion::allocate(size_t bytes, const TransportOptions& options) {
  if (bytes == 0) return absl::InvalidArgumentError("UCX region: size must be positive");
  auto impl = std::make_unique<Impl>();
  TANDEM_ASSIGN_OR_RETURN(impl->ctx, createContext(options));
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.address = nullptr;
  mp.length = bytes;
  mp.flags = UCP_MEM_MAP_ALLOCATE;
  ucs_status_t s = ucp_mem_map(impl->ctx, &mp, &impl->memh);
  if (s != UCS_OK) return ucsError(strCat("allocating a KV region of ", bytes, " bytes with UCX"), s);
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  s = ucp_mem_query(impl->memh, &attr);
  if (s != UCS_OK) return ucsError("ucp_mem_query", s);
  if (attr.length < bytes) {
    return absl::InternalError(strCat("UCX allocated ", attr.length, " bytes for a region of ", bytes));
  }
  impl->bytes = {static_cast<std::byte*>(attr.address), bytes};
  return std::shared_ptr<UcxRegion>(new UcxRegion(std::move(impl)));
}

struct UcxTransport::Impl {
  Logger log{"transport"};
  TransportCallbacks cb;
  std::shared_ptr<UcxRegion> pool;  // when set, owns ctx and memh
  ucp_context_h ctx = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_listener_h listener = nullptr;
  ucp_mem_h memh = nullptr;
  uint64_t region_base = 0;
  uint64_t region_length = 0;
  std::string packed_rkey;
  int port = 0;
  int ucx_fd = -1, wake_fd = -1, epoll_fd = -1;

  std::mutex mu;
  std::deque<std::function<void()>> commands;  // guarded by mu
  bool stop = false;                           // guarded by mu
  std::thread thread;
  std::mutex join_mu;                          // one shutdown() joins
  std::unique_ptr<ParallelCopier> copier;      // shared-memory copies (progress thread only)

  std::atomic<uint64_t> next_conn{1}, next_get{1};
  std::atomic<uint64_t> bytes_read{0};
  std::atomic<int64_t> inflight{0};
  std::atomic<uint64_t> ucx_gets{0};

  // Progress-thread state.
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
  std::unordered_map<ConnId, Conn> conns;
  std::unordered_map<ucp_ep_h, ConnId> by_ep;
  // One logical get: one or more UCX gets (merged segments).
  struct Get {
    ConnId conn;
    std::vector<void*> requests;    // per part; nullptr once that part completed
    size_t pending = 0;             // parts not completed yet
    ucs_status_t status = UCS_OK;   // the first failure of any part
    size_t length = 0;
    bool cancel_requested = false;
    std::function<void(absl::Status)> done;
  };
  std::unordered_map<GetId, Get> gets;
  std::unordered_set<void*> closing;  // ep close requests in flight
  // Rkeys of dropped connections whose gets have not all completed yet
  // (cancelling a get does not complete it at once): destroyed after them.
  struct Orphan {
    std::vector<ucp_rkey_h> rkeys;
    std::unordered_set<GetId> gets;
  };
  std::unordered_map<ConnId, Orphan> orphans;

  void post(std::function<void()> fn) {
    {
      std::lock_guard lock(mu);
      commands.push_back(std::move(fn));
    }
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd, &one, sizeof(one));
  }

  // --- UCX callbacks (progress thread) ---
  static void onConnRequest(ucp_conn_request_h req, void* arg) { static_cast<Impl*>(arg)->accept(req); }
  static void onEpError(void* arg, ucp_ep_h ep, ucs_status_t status) { static_cast<Impl*>(arg)->epFailed(ep, status); }
  static ucs_status_t onAm(void* arg, const void*, size_t, void* data, size_t length, const ucp_am_recv_param_t* param) {
    return static_cast<Impl*>(arg)->received(data, length, param);
  }
  // user_data of a UCX get: which part of which get it is (a map lookup,
  // not a scan, per completion).
  struct GetTag {
    Impl* impl;
    GetId id;
    size_t part;
  };
  static void onGetDone(void* request, ucs_status_t status, void* user_data) {
    std::unique_ptr<GetTag> tag(static_cast<GetTag*>(user_data));
    tag->impl->partDone(tag->id, tag->part, status);
    ucp_request_free(request);
  }
  static void onSendDone(void* request, ucs_status_t status, void* user_data) {
    delete static_cast<std::vector<uint8_t>*>(user_data);
    ucp_request_free(request);
    (void)status;  // a failed send is followed by the endpoint's error callback
  }
  struct FlushTag {
    Impl* impl;
    ConnId conn;
  };
  static void onFlushDone(void* request, ucs_status_t, void* user_data) {
    std::unique_ptr<FlushTag> tag(static_cast<FlushTag*>(user_data));
    tag->impl->connReady(tag->conn);
    ucp_request_free(request);
  }
  static void onCloseDone(void* request, ucs_status_t, void* user_data) {
    static_cast<Impl*>(user_data)->closing.erase(request);
    ucp_request_free(request);
  }

  ucp_ep_params_t epParams() {
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = onEpError;
    p.err_handler.arg = this;
    return p;
  }

  void accept(ucp_conn_request_h req) {
    ucp_ep_params_t p = epParams();
    p.field_mask |= UCP_EP_PARAM_FIELD_CONN_REQUEST;
    p.conn_request = req;
    ucp_ep_h ep = nullptr;
    ucs_status_t s = ucp_ep_create(worker, &p, &ep);
    if (s != UCS_OK) {
      log.warn("cannot accept a connection", {{"error", ucs_status_string(s)}});
      return;
    }
    ConnId id = next_conn.fetch_add(1);
    conns[id].ep = ep;
    by_ep[ep] = id;
    awaitWireup(id, ep);
    if (cb.on_accept) cb.on_accept(id);
  }

  // Marks the connection ready once a flush of its endpoint completes.
  void awaitWireup(ConnId id, ucp_ep_h ep) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = onFlushDone;
    auto* tag = new FlushTag{this, id};
    p.user_data = tag;
    ucs_status_ptr_t r = ucp_ep_flush_nbx(ep, &p);
    if (r == nullptr || UCS_PTR_IS_ERR(r)) {
      delete tag;
      connReady(id);  // done at once; on error the endpoint's error callback follows
    }
  }

  void connReady(ConnId id) {
    auto c = conns.find(id);
    if (c == conns.end() || c->second.ready) return;
    c->second.ready = true;
    if (c->second.rkey_at_ready) {
      std::string packed = std::move(*c->second.rkey_at_ready);
      c->second.rkey_at_ready.reset();
      unpackRkey(id, c->second, packed);
    }
    std::vector<std::vector<uint8_t>> queued = std::move(c->second.queued);
    for (auto& m : queued) doSend(id, std::move(m));
  }

  void epFailed(ucp_ep_h ep, ucs_status_t status) {
    auto it = by_ep.find(ep);
    if (it == by_ep.end()) return;
    ConnId id = it->second;
    // UCX completes the endpoint's outstanding requests with an error; the
    // connection itself is done.
    dropConn(id, absl::UnavailableError(strCat("connection ", id, " failed: ", ucs_status_string(status))));
  }

  ucs_status_t received(void* data, size_t length, const ucp_am_recv_param_t* param) {
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
      log.warn("dropped a control message sent by rendezvous (peers must send eagerly)");
      return UCS_OK;
    }
    ConnId id = 0;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) {
      if (auto it = by_ep.find(param->reply_ep); it != by_ep.end()) id = it->second;
    }
    if (id == 0) {
      log.warn("dropped a control message from an unknown endpoint");
      return UCS_OK;
    }
    const auto* bytes = static_cast<const uint8_t*>(data);
    if (cb.on_message) cb.on_message(id, std::vector<uint8_t>(bytes, bytes + length));
    return UCS_OK;
  }

  void partDone(GetId id, size_t part, ucs_status_t status) {
    auto it = gets.find(id);
    if (it == gets.end()) return;
    Get& g = it->second;
    g.requests[part] = nullptr;
    if (status != UCS_OK && g.status == UCS_OK) g.status = status;
    if (--g.pending == 0) finishGet(it);
  }

  void finishGet(std::unordered_map<GetId, Get>::iterator it) {
    Get g = std::move(it->second);
    const ucs_status_t status = g.status;
    GetId id = it->first;
    gets.erase(it);
    if (auto c = conns.find(g.conn); c != conns.end()) {
      c->second.gets.erase(id);
      if (c->second.gets.empty()) destroyRetiredRkeys(c->second);
    } else if (auto o = orphans.find(g.conn); o != orphans.end()) {
      o->second.gets.erase(id);
      if (o->second.gets.empty()) {
        for (ucp_rkey_h k : o->second.rkeys) ucp_rkey_destroy(k);
        orphans.erase(o);
      }
    }
    inflight.fetch_sub(1);
    absl::Status result;
    if (status == UCS_OK) {
      bytes_read.fetch_add(g.length);
    } else if (status == UCS_ERR_CANCELED) {
      result = absl::CancelledError(strCat("get ", id, " cancelled"));
    } else {
      result = absl::UnavailableError(strCat("get ", id, " failed: ", ucs_status_string(status)));
    }
    if (g.done) g.done(result);
  }

  // --- commands (progress thread) ---
  void doConnect(ConnId id, std::string host, int to_port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(to_port));
    if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
      if (cb.on_disconnect) cb.on_disconnect(id, absl::InvalidArgumentError(strCat("bad peer address \"", host, "\"")));
      return;
    }
    ucp_ep_params_t p = epParams();
    p.field_mask |= UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
    p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    p.sockaddr.addrlen = sizeof(addr);
    ucp_ep_h ep = nullptr;
    ucs_status_t s = ucp_ep_create(worker, &p, &ep);
    if (s != UCS_OK) {
      if (cb.on_disconnect) cb.on_disconnect(id, ucsError(strCat("connect to ", host, ":", to_port), s));
      return;
    }
    conns[id].ep = ep;
    by_ep[ep] = id;
    awaitWireup(id, ep);
  }

  void doSend(ConnId id, std::vector<uint8_t> bytes) {
    auto c = conns.find(id);
    if (c == conns.end()) return;  // closed: the caller learnt through on_disconnect
    if (!c->second.ready) {
      c->second.queued.push_back(std::move(bytes));
      return;
    }
    auto* buf = new std::vector<uint8_t>(std::move(bytes));
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    p.cb.send = onSendDone;
    p.user_data = buf;
    ucs_status_ptr_t r = ucp_am_send_nbx(c->second.ep, kControlAmId, nullptr, 0, buf->data(), buf->size(), &p);
    if (r == nullptr) {
      delete buf;
    } else if (UCS_PTR_IS_ERR(r)) {
      delete buf;
      log.warn("send failed", {{"conn", id}, {"error", ucs_status_string(UCS_PTR_STATUS(r))}});
    }
  }

  // Replaces the connection's rkey by one unpacked from `packed` (none if
  // that fails). An rkey gets may still be using is destroyed after them.
  bool unpackRkey(ConnId id, Conn& conn, const std::string& packed) {
    ucp_rkey_h fresh = nullptr;
    ucs_status_t s = ucp_ep_rkey_unpack(conn.ep, packed.data(), &fresh);
    if (s != UCS_OK) {
      log.warn("cannot unpack the peer's rkey", {{"conn", id}, {"error", ucs_status_string(s)}});
      return false;
    }
    if (conn.rkey != nullptr) retireRkey(conn, conn.rkey);
    conn.rkey = fresh;
    return true;
  }

  // Destroys `k` now, or once the connection's gets (which may use it) are done.
  static void retireRkey(Conn& conn, ucp_rkey_h k) {
    if (conn.gets.empty()) {
      ucp_rkey_destroy(k);
    } else {
      conn.retired_rkeys.push_back(k);
    }
  }

  static void destroyRetiredRkeys(Conn& conn) {
    for (ucp_rkey_h k : conn.retired_rkeys) ucp_rkey_destroy(k);
    conn.retired_rkeys.clear();
  }

  void doSetRemote(ConnId id, uint64_t base, uint64_t length, std::string rkey) {
    auto c = conns.find(id);
    if (c == conns.end()) return;
    Conn& conn = c->second;
    // Unpacked now so that gets work at once, and again after the wire-up
    // (see rkey_at_ready).
    if (!unpackRkey(id, conn, rkey)) {
      // Gets must not go on with the region of an earlier Hello.
      if (conn.rkey != nullptr) retireRkey(conn, conn.rkey);
      conn.rkey = nullptr;
      return;
    }
    conn.remote_base = base;
    conn.remote_length = length;
    if (!conn.ready) conn.rkey_at_ready = std::move(rkey);
  }

  void doGet(GetId id, ConnId conn_id, std::vector<Segment> segments, std::function<void(absl::Status)> done) {
    // Ends a get that issues no UCX get (refused, empty, or copied here).
    auto finish = [&](absl::Status s) {
      inflight.fetch_sub(1);
      done(std::move(s));
    };
    auto c = conns.find(conn_id);
    if (c == conns.end()) return finish(absl::UnavailableError(strCat("get on closed connection ", conn_id)));
    Conn& conn = c->second;
    if (conn.rkey == nullptr) return finish(absl::FailedPreconditionError(strCat("connection ", conn_id, " has no remote region yet")));
    // Check every segment before reading anything; merge neighbours.
    std::vector<Segment> parts;
    size_t total = 0;
    for (const Segment& s : segments) {
      if (s.remote_offset > conn.remote_length || s.length > conn.remote_length - s.remote_offset) {
        return finish(absl::OutOfRangeError(strCat("get of ", s.length, " bytes at offset ", s.remote_offset,
                                                 " is outside the peer's region of ", conn.remote_length, " bytes")));
      }
      if (s.length == 0) continue;
      total += s.length;
      if (!parts.empty()) {
        Segment& last = parts.back();
        if (static_cast<std::byte*>(last.local) + last.length == s.local && last.remote_offset + last.length == s.remote_offset) {
          last.length += s.length;
          continue;
        }
      }
      parts.push_back(s);
    }
    if (parts.empty()) return finish(absl::OkStatus());
    if (copyDirectly(conn, parts, total)) {
      ucx_gets.fetch_add(parts.size());
      bytes_read.fetch_add(total);
      return finish(absl::OkStatus());
    }
    Get& g = gets[id];  // a reference into a node-based map: stays valid as other gets come and go
    g.conn = conn_id;
    g.length = total;
    g.done = std::move(done);
    g.requests.assign(parts.size(), nullptr);
    g.pending = parts.size();
    conn.gets.insert(id);
    ucx_gets.fetch_add(parts.size());
    for (size_t i = 0; i < parts.size(); ++i) {
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      p.cb.send = onGetDone;
      auto* tag = new GetTag{this, id, i};
      p.user_data = tag;
      ucs_status_ptr_t r = ucp_get_nbx(conn.ep, parts[i].local, parts[i].length, conn.remote_base + parts[i].remote_offset,
                                       conn.rkey, &p);
      if (r == nullptr || UCS_PTR_IS_ERR(r)) {
        delete tag;  // completed (or failed) at once: the callback will not run
        --g.pending;
        if (r != nullptr && g.status == UCS_OK) g.status = UCS_PTR_STATUS(r);
      } else {
        g.requests[i] = r;
      }
    }
    // Callbacks run only from ucp_worker_progress, never inside ucp_get_nbx.
    if (g.pending == 0) finishGet(gets.find(id));
  }

  // If the peer's pool is mapped into this process (shared memory), copies
  // the parts from it and returns true: what UCX's own get would do, by
  // the progress thread alone, but large gets are shared with helper
  // threads. False (nothing read) when UCX cannot map every part.
  bool copyDirectly(const Conn& conn, const std::vector<Segment>& parts, size_t total) {
    std::vector<ParallelCopier::Range> ranges;
    ranges.reserve(parts.size());
    for (const Segment& part : parts) {
      void* src = nullptr;
      if (ucp_rkey_ptr(conn.rkey, conn.remote_base + part.remote_offset, &src) != UCS_OK) return false;
      ranges.push_back({static_cast<std::byte*>(part.local), static_cast<const std::byte*>(src), part.length});
    }
    if (copier && total >= UcxTransport::kParallelCopyMinBytes) {
      copier->copy(ranges, total);
    } else {
      for (const ParallelCopier::Range& r : ranges) std::memcpy(r.dst, r.src, r.length);
    }
    return true;
  }

  // Asks UCX to cancel every part still in flight. A part's callback may
  // run inside ucp_request_cancel, so the get is looked up again each time.
  void cancelParts(GetId id) {
    for (size_t i = 0;; ++i) {
      auto it = gets.find(id);
      if (it == gets.end() || i >= it->second.requests.size()) return;
      if (void* r = it->second.requests[i]) ucp_request_cancel(worker, r);
    }
  }

  void doCancelGet(GetId id) {
    auto it = gets.find(id);
    if (it == gets.end() || it->second.cancel_requested) return;
    it->second.cancel_requested = true;
    cancelParts(id);
  }

  void dropConn(ConnId id, absl::Status why) {
    auto c = conns.find(id);
    if (c == conns.end()) return;
    Conn conn = std::move(c->second);
    conns.erase(c);
    by_ep.erase(conn.ep);
    // Cancel what is still in flight; completions arrive through onGetDone.
    for (GetId g : conn.gets) cancelParts(g);
    if (conn.rkey) conn.retired_rkeys.push_back(conn.rkey);
    conn.rkey = nullptr;
    // A cancelled part may have completed inside cancelParts.
    for (auto g = conn.gets.begin(); g != conn.gets.end();) g = gets.contains(*g) ? std::next(g) : conn.gets.erase(g);
    if (conn.gets.empty()) {
      destroyRetiredRkeys(conn);
    } else {
      orphans[id] = Orphan{std::move(conn.retired_rkeys), std::move(conn.gets)};
    }
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    p.cb.send = onCloseDone;
    p.user_data = this;
    ucs_status_ptr_t r = ucp_ep_close_nbx(conn.ep, &p);
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) closing.insert(r);
    if (!why.ok() && cb.on_disconnect) cb.on_disconnect(id, why);
  }

  void run() {
    epoll_event ev[4];
    // Progress has found nothing since then (while gets are in flight); zero: it found something.
    std::chrono::steady_clock::time_point idle_since{};
    prctl(PR_SET_TIMERSLACK, 1000UL);  // sleep-polls wake on time (default slack: 50 us)
    for (;;) {
      std::deque<std::function<void()>> batch;
      bool stopping;
      {
        std::lock_guard lock(mu);
        batch.swap(commands);
        stopping = stop;
      }
      for (auto& fn : batch) fn();
      if (stopping) break;
      if (ucp_worker_progress(worker) != 0) {
        idle_since = {};
        continue;
      }
      // While gets are in flight, keep polling UCX: the completion of a
      // shared-memory get raises no wakeup event, so sleeping until one
      // would stall the pull by tens of ms. Poll back to back for up to
      // kGetSpin after the last progress, then sleep kGetPollInterval
      // between polls (new commands wake the thread), leaving the core to
      // the engine.
      if (!gets.empty()) {
        const auto now = std::chrono::steady_clock::now();
        if (idle_since == std::chrono::steady_clock::time_point{}) idle_since = now;
        if (now - idle_since < kGetSpin) continue;
        pollfd pfd{.fd = wake_fd, .events = POLLIN, .revents = 0};
        const timespec interval{.tv_sec = 0, .tv_nsec = kGetPollInterval.count()};
        if (ppoll(&pfd, 1, &interval, nullptr) > 0) {
          uint64_t v;
          [[maybe_unused]] ssize_t r = read(wake_fd, &v, sizeof(v));
        }
        continue;
      }
      ucs_status_t s = ucp_worker_arm(worker);
      if (s == UCS_ERR_BUSY) continue;
      // Wake up now and then even when idle: UCX's keepalive runs from
      // progress calls.
      int n = epoll_wait(epoll_fd, ev, 4, conns.empty() ? 100 : 10);
      for (int i = 0; i < n; ++i) {
        if (ev[i].data.fd == wake_fd) {
          uint64_t v;
          [[maybe_unused]] ssize_t r = read(wake_fd, &v, sizeof(v));
        }
      }
    }
    // Shutdown: close every connection, then progress until all gets and
    // closes completed (bounded: a peer that vanished cannot hold us forever).
    std::vector<ConnId> ids;
    for (const auto& [id, c] : conns) ids.push_back(id);
    for (ConnId id : ids) dropConn(id, absl::OkStatus());
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while ((!gets.empty() || !closing.empty()) && std::chrono::steady_clock::now() < deadline) ucp_worker_progress(worker);
    for (auto it = gets.begin(); it != gets.end();) {
      auto next = std::next(it);
      it->second.status = UCS_ERR_CANCELED;
      finishGet(it);
      it = next;
    }
  }

  ~Impl() {
    if (listener) ucp_listener_destroy(listener);
    if (memh && !pool) ucp_mem_unmap(ctx, memh);
    if (worker) ucp_worker_destroy(worker);
    if (ctx && !pool) ucp_cleanup(ctx);
    if (wake_fd >= 0) ::close(wake_fd);
    if (epoll_fd >= 0) ::close(epoll_fd);
  }
};

absl::StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::start(const TransportOptions& o, TransportCallbacks callbacks) {
  if (o.copy_threads < 1 || o.copy_threads > 64) {
    return absl::InvalidArgumentError(strCat("transport: copy_threads must be in [1, 64], got ", o.copy_threads));
  }
  auto impl = std::make_unique<Impl>();
  impl->cb = std::move(callbacks);
  if (o.copy_threads > 1) impl->copier = std::make_unique<ParallelCopier>(o.copy_threads - 1);
  ucs_status_t s = UCS_OK;
  if (o.pool) {
    impl->pool = o.pool;
    impl->ctx = o.pool->impl_->ctx;
    impl->memh = o.pool->impl_->memh;
  } else {
    TANDEM_ASSIGN_OR_RETURN(impl->ctx, createContext(o));
  }

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the progress thread touches the worker
  s = ucp_worker_create(impl->ctx, &wp, &impl->worker);
  if (s != UCS_OK) return ucsError("ucp_worker_create", s);

  ucp_am_handler_param_t am{};
  am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  am.id = kControlAmId;
  am.cb = Impl::onAm;
  am.arg = impl.get();
  s = ucp_worker_set_am_recv_handler(impl->worker, &am);
  if (s != UCS_OK) return ucsError("ucp_worker_set_am_recv_handler", s);

  // The region peers read: registered once, for the life of the transport.
  std::span<std::byte> region = o.pool ? o.pool->bytes() : o.region;
  if (!o.pool && !region.empty()) {
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = region.data();
    mp.length = region.size();
    s = ucp_mem_map(impl->ctx, &mp, &impl->memh);
    if (s != UCS_OK) return ucsError("ucp_mem_map of the KV region", s);
  }
  if (impl->memh != nullptr) {
    void* rkey = nullptr;
    size_t rkey_size = 0;
    s = ucp_rkey_pack(impl->ctx, impl->memh, &rkey, &rkey_size);
    if (s != UCS_OK) return ucsError("ucp_rkey_pack", s);
    impl->packed_rkey.assign(static_cast<const char*>(rkey), rkey_size);
    ucp_rkey_buffer_release(rkey);
    impl->region_base = reinterpret_cast<uint64_t>(region.data());
    impl->region_length = region.size();
  }

  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(o.port));
  if (inet_pton(AF_INET, o.host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(strCat("transport listen address \"", o.host, "\" is not an IPv4 address"));
  }
  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
  lp.sockaddr.addrlen = sizeof(addr);
  lp.conn_handler.cb = Impl::onConnRequest;
  lp.conn_handler.arg = impl.get();
  s = ucp_listener_create(impl->worker, &lp, &impl->listener);
  if (s != UCS_OK) return ucsError(strCat("listen on ", o.host, ":", o.port), s);
  ucp_listener_attr_t la{};
  la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  s = ucp_listener_query(impl->listener, &la);
  if (s != UCS_OK) return ucsError("ucp_listener_query", s);
  impl->port = ntohs(reinterpret_cast<const sockaddr_in*>(&la.sockaddr)->sin_port);

  s = ucp_worker_get_efd(impl->worker, &impl->ucx_fd);
  if (s != UCS_OK) return ucsError("ucp_worker_get_efd", s);
  impl->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  impl->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  if (impl->wake_fd < 0 || impl->epoll_fd < 0) return absl::InternalError("eventfd/epoll_create1 failed");
  for (int fd : {impl->ucx_fd, impl->wake_fd}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    epoll_ctl(impl->epoll_fd, EPOLL_CTL_ADD, fd, &ev);
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->run(); });
  return std::unique_ptr<UcxTransport>(new UcxTransport(std::move(impl)));
}

UcxTransport::UcxTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

void UcxTransport::shutdown() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->post([] {});
  std::lock_guard lock(impl_->join_mu);
  if (impl_->thread.joinable()) impl_->thread.join();
}

UcxTransport::~UcxTransport() { shutdown(); }

int UcxTransport::port() const { return impl_->port; }
uint64_t UcxTransport::regionBase() const { return impl_->region_base; }
uint64_t UcxTransport::regionLength() const { return impl_->region_length; }
const std::string& UcxTransport::packedRkey() const { return impl_->packed_rkey; }

ConnId UcxTransport::connect(const std::string& host, int port) {
  ConnId id = impl_->next_conn.fetch_add(1);
  impl_->post([impl = impl_.get(), id, host, port] { impl->doConnect(id, host, port); });
  return id;
}

void UcxTransport::send(ConnId conn, std::vector<uint8_t> bytes) {
  impl_->post([impl = impl_.get(), conn, b = std::move(bytes)]() mutable { impl->doSend(conn, std::move(b)); });
}

void UcxTransport::setRemoteRegion(ConnId conn, uint64_t base, uint64_t length, std::string packed_rkey) {
  impl_->post([impl = impl_.get(), conn, base, length, k = std::move(packed_rkey)]() mutable {
    impl->doSetRemote(conn, base, length, std::move(k));
  });
}

GetId UcxTransport::get(ConnId conn, void* local, uint64_t remote_offset, size_t length,
                        std::function<void(absl::Status)> done) {
  return getv(conn, {Segment{.local = local, .remote_offset = remote_offset, .length = length}}, std::move(done));
}

GetId UcxTransport::getv(ConnId conn, std::vector<Segment> segments, std::function<void(absl::Status)> done) {
  GetId id = impl_->next_get.fetch_add(1);
  impl_->inflight.fetch_add(1);
  impl_->post([impl = impl_.get(), id, conn, s = std::move(segments), d = std::move(done)]() mutable {
    impl->doGet(id, conn, std::move(s), std::move(d));
  });
  return id;
}

void UcxTransport::cancelGet(GetId id) {
  impl_->post([impl = impl_.get(), id] { impl->doCancelGet(id); });
}

void UcxTransport::close(ConnId conn) {
  impl_->post([impl = impl_.get(), conn] { impl->dropConn(conn, absl::OkStatus()); });
}

uint64_t UcxTransport::bytesRead() const { return impl_->bytes_read.load(); }
int64_t UcxTransport::getsInFlight() const { return impl_->inflight.load(); }
uint64_t UcxTransport::ucxGetsIssued() const { return impl_->ucx_gets.load(); }

}  // namespace tandem::transport
