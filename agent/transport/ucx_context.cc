// The UCX context (transports, QoS, the environment UCX reads) and the KV
// pool UCX allocates (UcxRegion).

#include <cstdlib>
#include <string>

#include "agent/transport/ucx_transport_impl.h"
#include "src/common/strings.h"

namespace tandem::transport {
namespace {

// Whether UCX may pick a shared-memory transport under UCX_TLS = `tls`.
bool mayUseSharedMemory(const std::string& tls) {
  if (tls.empty()) return true;
  for (const char* name : {"posix", "sysv", "sm", "mm", "all"}) {
    if (tls.find(name) != std::string::npos) return true;
  }
  return false;
}

// Settings UCX reads from the environment. An operator's own value wins,
// except the QoS fields, which the options state explicitly.
void setUcxEnvironment(const TransportOptions& o) {
  // Our endpoints ask for peer error handling, and UCX 1.13 leaves its
  // shared-memory transports out of such endpoints unless they detect peer
  // failure by keepalive: without this a "posix" pull silently runs over
  // tcp. (Only when shared memory may be used: UCX warns about unused settings.)
  if (mayUseSharedMemory(o.tls)) setenv("UCX_MM_ERROR_HANDLING", "y", /*overwrite=*/0);
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
}

}  // namespace

absl::Status ucsError(std::string_view what, ucs_status_t s) {
  return absl::UnavailableError(strCat(what, ": ", ucs_status_string(s)));
}

absl::StatusOr<ucp_context_h> createContext(const TransportOptions& o) {
  setUcxEnvironment(o);
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

UcxRegion::Impl::~Impl() {
  if (memh) ucp_mem_unmap(ctx, memh);
  if (ctx) ucp_cleanup(ctx);
}

UcxRegion::UcxRegion(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
UcxRegion::~UcxRegion() = default;
std::span<std::byte> UcxRegion::bytes() const { return impl_->bytes; }

namespace {
bool listsCudaMemory(ucp_context_h ctx) {
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(ctx, &attr) != UCS_OK) return false;
  return (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
}
}  // namespace

bool UcxRegion::cudaMemory() const { return listsCudaMemory(impl_->ctx); }
bool UcxRegion::cudaRegion() const { return impl_->cuda; }

bool UcxRegion::cudaMemorySupported(const TransportOptions& options) {
  absl::StatusOr<ucp_context_h> ctx = createContext(options);
  if (!ctx.ok()) return false;
  const bool cuda = listsCudaMemory(*ctx);
  ucp_cleanup(*ctx);
  return cuda;
}

absl::StatusOr<std::shared_ptr<UcxRegion>> UcxRegion::map(std::span<std::byte> memory, bool cuda,
                                                          std::shared_ptr<void> keep_alive,
                                                          const TransportOptions& options) {
  if (memory.empty()) return absl::InvalidArgumentError("UCX region: size must be positive");
  auto impl = std::make_unique<Impl>();
  impl->keep_alive = std::move(keep_alive);
  impl->cuda = cuda;
  TANDEM_ASSIGN_OR_RETURN(impl->ctx, createContext(options));
  if (cuda && !listsCudaMemory(impl->ctx)) {
    return absl::FailedPreconditionError(
        "this UCX cannot register GPU memory (its context lists no CUDA memory type: a UCX built without "
        "cuda_copy/cuda_ipc, such as Debian's); stage the KV pool through host memory instead");
  }
  ucp_mem_map_params_t mp{};
  mp.field_mask =
      UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
  mp.address = memory.data();
  mp.length = memory.size();
  mp.memory_type = cuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
  ucs_status_t s = ucp_mem_map(impl->ctx, &mp, &impl->memh);
  if (s != UCS_OK) {
    return ucsError(
        strCat("registering the KV pool (", memory.size(), " bytes of ", cuda ? "GPU" : "host", " memory) with UCX"),
        s);
  }
  impl->bytes = memory;
  return std::shared_ptr<UcxRegion>(new UcxRegion(std::move(impl)));
}

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

}  // namespace tandem::transport
