#include "e2e/replay/baseline_policies.h"

namespace tandem::replay {

using routing::ClusterState;
using routing::Decision;
using routing::RouteRequest;
using routing::RouteResult;
using routing::WorkerView;

std::vector<const WorkerView*> BaselinePolicy::decodeWorkers(const ClusterState& cluster) {
  std::vector<const WorkerView*> out;
  for (uint32_t s = 0; s < cluster.slotEnd(); ++s) {
    const WorkerView* w = cluster.worker(routing::WorkerSlot(s));
    if (w != nullptr && w->canDecode() && w->healthy && !w->load.draining) out.push_back(w);
  }
  return out;
}

int64_t BaselinePolicy::outstanding(const WorkerView& w) const {
  const uint32_t slot = w.ref.slot.value();
  return slot < outstanding_.size() ? outstanding_[slot] : 0;
}

Decision BaselinePolicy::decide(const WorkerView& w, const RouteRequest& request) {
  Decision d;
  d.decode = w.name;
  d.decode_ref = w.ref;
  d.path = routing::RoutePath::kDirect;  // no P named: the decode worker computes the prompt
  d.reason = routing::DecisionReason::kBaseline;
  const int64_t bs = w.block_size > 0 ? w.block_size : 1;
  d.reserve_blocks = (request.prompt_tokens + request.expected_output_tokens + bs - 1) / bs;
  d.prefill_tokens = request.prompt_tokens;
  return d;
}

const WorkerView* BaselinePolicy::leastLoaded(const std::vector<const WorkerView*>& workers) const {
  const WorkerView* best = nullptr;
  for (const WorkerView* w : workers) {
    if (best == nullptr || outstanding(*w) < outstanding(*best)) best = w;
  }
  return best;
}

void BaselinePolicy::onAssigned(const RouteRequest&, const Decision& d) {
  const uint32_t slot = d.decode_ref.slot.value();
  if (slot >= outstanding_.size()) outstanding_.resize(slot + 1, 0);
  ++outstanding_[slot];
}

void BaselinePolicy::onFinished(const RouteRequest&, const Decision& d) { --outstanding_[d.decode_ref.slot.value()]; }

void BaselinePolicy::onRejected(const RouteRequest&, const Decision& d, routing::RejectReason) {
  --outstanding_[d.decode_ref.slot.value()];
}

RouteResult RoundRobinPolicy::route(const RouteRequest& request, const ClusterState& cluster,
                                    const routing::InFlight&) {
  const std::vector<const WorkerView*> workers = decodeWorkers(cluster);
  if (workers.empty()) return routing::NoWorker{routing::NoWorkerReason::kNoDecodeWorker};
  return decide(*workers[next_++ % workers.size()], request);
}

RouteResult LeastLoadPolicy::route(const RouteRequest& request, const ClusterState& cluster, const routing::InFlight&) {
  const std::vector<const WorkerView*> workers = decodeWorkers(cluster);
  if (workers.empty()) return routing::NoWorker{routing::NoWorkerReason::kNoDecodeWorker};
  return decide(*leastLoaded(workers), request);
}

}  // namespace tandem::replay
