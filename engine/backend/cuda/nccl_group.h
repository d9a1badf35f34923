#pragma once
// One rank's place in a tensor-parallel group across processes (one per GPU
// in a pod): the group id comes from rank 0 over the pod's local socket
// (engine/model/rank_rendezvous.h), NCCL wires the ranks, and partials()
// is the model's all-reduce (LlamaModel's AllReducePartials) on the
// device's stream. Built only with TANDEM_ENABLE_CUDA; this header names no
// CUDA or NCCL type.
//
// NCCL reads its network settings from the environment the operator gives
// the pod (NCCL_IB_SL, NCCL_IB_TC: docs/operator.md), so the group's
// collective traffic keeps its own InfiniBand service level / RoCE traffic
// class, apart from the KV transfers'.
//
// Determinism: NCCL's sum is in NCCL's order (ring or tree, by size), not
// the in-process all-reduce's rank order: a GPU group's logits match TP=1
// to rounding, as the CPU's do, but not the CPU group's bits.
//
// This project's machines have no GPU: this compiles and links (`./tandem
// check cuda`) and has never run.

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend/cuda/device.h"
#include "engine/model/llama.h"
#include "engine/model/rank_rendezvous.h"

namespace tandem::engine {

class NcclGroup {
 public:
  // Joins the group: rank 0 makes the id and serves it until every rank has
  // it, the others fetch it; then NCCL's communicator on `device` (a CUDA
  // device, gpu::makeCudaDevice). Errors name the rendezvous or NCCL call.
  static absl::StatusOr<std::unique_ptr<NcclGroup>> join(const RendezvousOptions& options,
                                                         std::shared_ptr<gpu::Device> device);
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  // The sum of every rank's partial, in place, on the device's stream. A
  // failed all-reduce is kept (status()), the communicator aborted (so the
  // other ranks' collectives fail rather than wait), and the later ones do
  // nothing. NCCL gives every rank the same sum in practice (its ring and
  // tree reductions), which AllReducePartials asks for; NCCL does not
  // document it as a guarantee.
  AllReducePartials partials();
  const absl::Status& status() const { return status_; }

 private:
  struct Impl;
  explicit NcclGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  absl::Status status_;
};

}  // namespace tandem::engine
