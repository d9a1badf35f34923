// The public API of UcxTransport: start() assembles the pieces (context,
// worker, region, listener, wakeup, progress thread); every command is
// posted to the progress thread (see ucx_transport_impl.h for the map).

#include "agent/transport/ucx_transport.h"

#include <chrono>
#include <thread>

#include "agent/transport/ucx_transport_impl.h"
#include "src/common/log.h"
#include "src/common/strings.h"

namespace tandem::transport {

absl::StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::start(const TransportOptions& o,
                                                                  TransportCallbacks callbacks) {
  if (o.copy_threads < 1 || o.copy_threads > 64) {
    return absl::InvalidArgumentError(strCat("transport: copy_threads must be in [1, 64], got ", o.copy_threads));
  }
  auto impl = std::make_unique<Impl>(o.clock ? *o.clock : SystemClock::instance(), std::move(callbacks));
  if (o.copy_threads > 1) impl->copier = std::make_unique<ParallelCopier>(o.copy_threads - 1);
  if (o.pool) {
    impl->pool = o.pool;
    impl->ctx = o.pool->impl_->ctx;
    impl->memh = o.pool->impl_->memh;
    impl->local_cuda = o.pool->cudaRegion();
  }
  // A network interface that goes away between UCX listing the devices
  // (ucp_init) and opening them (ucp_worker_create) fails the worker with
  // UCS_ERR_NO_DEVICE. On a node where interfaces come and go (pods' veths)
  // that is transient: list the devices again and retry.
  constexpr int kWorkerAttempts = 5;
  for (int attempt = 1;; ++attempt) {
    if (!o.pool) {
      TANDEM_ASSIGN_OR_RETURN(impl->ctx, createContext(o));
    }
    ucs_status_t raw = UCS_OK;
    absl::Status s = impl->createWorker(&raw);
    if (s.ok()) break;
    if (raw != UCS_ERR_NO_DEVICE || attempt == kWorkerAttempts) return s;
    Logger("transport").warn("a network device went away while UCX opened it; trying again",
                             {{"attempt", attempt}, {"error", std::string(s.message())}});
    if (!o.pool) {
      ucp_cleanup(impl->ctx);
      impl->ctx = nullptr;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50 * attempt));
  }
  TANDEM_RETURN_IF_ERROR(impl->registerRegion(o.pool ? o.pool->bytes() : o.region, /*map_here=*/!o.pool));
  TANDEM_RETURN_IF_ERROR(impl->listen(o.host, o.port));
  TANDEM_RETURN_IF_ERROR(impl->setupWakeup());
  impl->startThread();
  return std::unique_ptr<UcxTransport>(new UcxTransport(std::move(impl)));
}

UcxTransport::UcxTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

void UcxTransport::shutdown() {
  impl_->requestStop();
  impl_->join();
}

UcxTransport::~UcxTransport() { shutdown(); }

int UcxTransport::port() const { return impl_->port; }
uint64_t UcxTransport::regionBase() const { return impl_->region_base; }
uint64_t UcxTransport::regionLength() const { return impl_->region_length; }
const std::string& UcxTransport::packedRkey() const { return impl_->packed_rkey; }

std::string UcxTransport::peerAddress(ConnId conn) const {
  absl::MutexLock lock(&impl_->addr_mu);
  auto it = impl_->peer_addrs.find(conn);
  return it == impl_->peer_addrs.end() ? std::string() : it->second;
}

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
  impl_->post([impl = impl_.get(), conn] { impl->closeConn(conn); });
}

uint64_t UcxTransport::bytesRead() const { return impl_->bytes_read.load(); }
int64_t UcxTransport::getsInFlight() const { return impl_->inflight.load(); }
uint64_t UcxTransport::ucxGetsIssued() const { return impl_->ucx_gets.load(); }

}  // namespace tandem::transport
