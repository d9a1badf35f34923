#include "engine/backend/cuda/nccl_group.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <vector>

#include <absl/strings/str_cat.h>

#include "engine/backend/cuda/cuda_device.h"
#include "src/common/status.h"

namespace tandem::engine {
namespace {

absl::Status ncclStatus(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", ncclGetErrorString(r)));
}

}  // namespace

struct NcclGroup::Impl {
  std::shared_ptr<gpu::Device> device;
  cudaStream_t stream = nullptr;
  ncclComm_t comm = nullptr;
  ~Impl() {
    if (comm != nullptr) ncclCommDestroy(comm);
  }
};

NcclGroup::NcclGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NcclGroup::~NcclGroup() = default;

absl::StatusOr<std::unique_ptr<NcclGroup>> NcclGroup::join(const RendezvousOptions& options,
                                                           std::shared_ptr<gpu::Device> device) {
  TANDEM_RETURN_IF_ERROR(validateRendezvous(options));
  auto impl = std::make_unique<Impl>();
  impl->stream = static_cast<cudaStream_t>(gpu::cudaStreamOf(*device));
  if (impl->stream == nullptr) return absl::InvalidArgumentError("NcclGroup: not a device makeCudaDevice made");
  impl->device = std::move(device);
  TANDEM_RETURN_IF_ERROR(gpu::cudaMakeCurrent(*impl->device));
  ncclUniqueId id;
  if (options.rank == 0) {
    TANDEM_RETURN_IF_ERROR(ncclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    std::vector<std::byte> bytes(sizeof(id.internal));
    std::memcpy(bytes.data(), id.internal, bytes.size());
    TANDEM_RETURN_IF_ERROR(serveGroupId(options, bytes));
  } else {
    TANDEM_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, fetchGroupId(options));
    if (bytes.size() != sizeof(id.internal)) {
      return absl::FailedPreconditionError(
          absl::StrCat("NcclGroup: rank 0's group id has ", bytes.size(), " bytes, NCCL's has ", sizeof(id.internal)));
    }
    std::memcpy(id.internal, bytes.data(), bytes.size());
  }
  // The communicator lives on the calling thread's current device: this one.
  TANDEM_RETURN_IF_ERROR(gpu::cudaMakeCurrent(*impl->device));
  TANDEM_RETURN_IF_ERROR(ncclStatus(ncclCommInitRank(&impl->comm, options.world, id, options.rank), "ncclCommInitRank"));
  return std::unique_ptr<NcclGroup>(new NcclGroup(std::move(impl)));
}

AllReducePartials NcclGroup::partials() {
  return [this](float* partial, int64_t n) {
    if (!status_.ok() || n <= 0) return;
    status_ = ncclStatus(ncclAllReduce(partial, partial, static_cast<size_t>(n), ncclFloat, ncclSum, impl_->comm,
                                       impl_->stream),
                         "ncclAllReduce");
    if (!status_.ok() && impl_->comm != nullptr) {
      // The other ranks would wait in this collective for good: the
      // communicator is aborted, so theirs fail too.
      ncclCommAbort(impl_->comm);
      impl_->comm = nullptr;
    }
  };
}

}  // namespace tandem::engine
