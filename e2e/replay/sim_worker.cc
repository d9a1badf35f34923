#include "e2e/replay/sim_worker.h"

#include <algorithm>
#include <utility>

#include "e2e/replay/trace.h"
#include "src/common/block_hash.h"
#include "src/common/status.h"

namespace tandem::replay {
namespace {

constexpr uint64_t kEpoch = 1;  // simulated workers never restart

}  // namespace

SimWorker::SimWorker(std::string name, const WorkerModel& model)
    : name_(std::move(name)), model_(model), kv_(model.cache_blocks) {
  published_load_ = load();
}

routing::WorkerSnapshot SimWorker::snapshot() const {
  routing::WorkerSnapshot s;
  s.epoch = kEpoch;
  s.seq = seq_;
  s.worker = name_;
  s.role = routing::WorkerRole::kDecode;
  s.block_size = kTraceBlockTokens;
  s.hash_root = kBlockHashRoot;
  s.max_context_tokens = 0;  // no context limit in the model: capacity is the only bound
  s.load = load();
  return s;
}

routing::WorkerLoad SimWorker::load() const {
  return routing::WorkerLoad{.free_blocks = kv_.freeBlocks(),
                             .total_blocks = kv_.capacityBlocks(),
                             .running = running_,
                             .waiting = static_cast<int64_t>(waiting_.size()),
                             .waiting_prompt_tokens = waiting_prompt_tokens_,
                             .draining = false};
}

std::optional<routing::RejectReason> SimWorker::offer(Job job) {
  if (job.kv.total_blocks > kv_.capacityBlocks()) return routing::RejectReason::kCapacity;
  if (static_cast<int>(waiting_.size()) >= model_.max_waiting) return routing::RejectReason::kQueueFull;
  job.queued_prompt_tokens =
      std::max<int64_t>(0, job.prompt_tokens - kv_.prefixHits(job.kv.prompt) * kTraceBlockTokens);
  waiting_prompt_tokens_ += job.queued_prompt_tokens;
  waiting_.push_back(std::move(job));
  return std::nullopt;
}

std::optional<Admitted> SimWorker::startNext() {
  if (prefilling_ || waiting_.empty()) return std::nullopt;
  const Job& head = waiting_.front();
  const bool resident = head.kv.session && kv_.isResident(*head.kv.session);
  const std::optional<int64_t> hits = kv_.tryAdmit(head.kv);
  if (!hits) return std::nullopt;
  Admitted a{.job = std::move(waiting_.front()), .hit_blocks = *hits};
  waiting_.pop_front();
  waiting_prompt_tokens_ -= a.job.queued_prompt_tokens;
  const int64_t uncached = std::max<int64_t>(0, a.job.prompt_tokens - *hits * kTraceBlockTokens);
  a.direct = resident && uncached <= model_.direct_max_suffix_tokens;
  a.prefill_s = static_cast<double>(uncached) / model_.prefill_tokens_per_s;
  prefilling_ = true;
  ++running_;
  return a;
}

void SimWorker::prefillDone(const Job& job) {
  prefilling_ = false;
  kv_.publishComputed(job.kv);
}

void SimWorker::finish(const Job& job) {
  kv_.finish(job.kv);
  --running_;
}

absl::Status SimWorker::publish(routing::ClusterState& cluster) {
  std::vector<routing::WorkerDeltaBody> bodies = kv_.takeEvents();
  const routing::WorkerLoad now = load();
  if (!(now == published_load_)) {
    bodies.emplace_back(now);
    published_load_ = now;
  }
  for (routing::WorkerDeltaBody& body : bodies) {
    TANDEM_RETURN_IF_ERROR(cluster.applyDelta(name_, routing::WorkerDelta{kEpoch, ++seq_, std::move(body)}));
  }
  return absl::OkStatus();
}

}  // namespace tandem::replay
