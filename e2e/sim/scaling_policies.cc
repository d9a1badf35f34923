#include "e2e/sim/scaling_policies.h"

#include <algorithm>
#include <cmath>

#include "src/common/strings.h"

namespace tandem::sim {
namespace {

class StaticPolicy final : public ScalingPolicy {
 public:
  explicit StaticPolicy(PoolSize size) : size_(size) {}
  std::string name() const override { return strCat("static:", size_.prefill, ":", size_.decode); }
  PoolSize initial() const override { return size_; }
  PoolSize decide(const planner::Signals&) override { return size_; }

 private:
  PoolSize size_;
};

class IntervalPolicy final : public ScalingPolicy {
 public:
  explicit IntervalPolicy(const IntervalOptions& o) : o_(o), size_(o.initial) {}
  std::string name() const override { return "interval"; }
  PoolSize initial() const override { return o_.initial; }

  PoolSize decide(const planner::Signals& s) override {
    const EngineModel& e = o_.profile;
    // Prefill: the profiled TTFT of the mean prompt against the observed
    // one, applied as a factor on the demand (at least 1: never scale on
    // a lucky interval).
    double p_corr = 1;
    if (s.ttft_p95_s && s.mean_uncached_prompt_tokens > 0) {
      const double expected = e.prefill_overhead_s + s.mean_uncached_prompt_tokens / e.prefill_tokens_per_s;
      p_corr = std::clamp(*s.ttft_p95_s / expected, 1.0, 4.0);
    }
    const double p = s.uncached_prompt_tokens_per_s * p_corr / e.prefill_tokens_per_s;
    // Decode: tokens/s one replica produces at the largest batch the
    // profile allows — the batch whose TPOT is the target, or the sequences
    // its KV holds at the observed context length (a profiler measures
    // throughput at the workload's context, where KV bounds the batch),
    // whichever is smaller — at that batch's TPOT, scaled by observed ÷
    // profiled TPOT. (The KV per sequence is read from D's reservations,
    // which include requests still waiting for prefill: under a prefill
    // backlog it reads high.)
    double corr = 1;
    if (s.tpot_p95_s && !s.decode.empty() && s.decode_running > 0) {
      const double batch = s.decode_running / static_cast<double>(s.decode.size());
      corr = std::clamp(*s.tpot_p95_s / (e.tpot_base_s + e.tpot_per_seq_s * batch), 1.0, 4.0);
    }
    auto tpot = [&](double batch) { return corr * (e.tpot_base_s + e.tpot_per_seq_s * batch); };
    double batch = std::max(1.0, (o_.slo.tpot_s / corr - e.tpot_base_s) / e.tpot_per_seq_s);
    if (s.decode_running > 0 && s.decode_kv_used_ratio > 0 && s.decode_kv_total_blocks > 0) {
      const double blocks_per_sequence = s.decode_kv_used_ratio * s.decode_kv_total_blocks / s.decode_running;
      batch = std::clamp(static_cast<double>(e.kv_blocks) / blocks_per_sequence, 1.0, batch);
    }
    const double per_replica = batch / tpot(batch);
    const double d = s.generation_tokens_per_s / per_replica;
    size_.prefill = std::max(1, static_cast<int32_t>(std::ceil(p - 1e-9)));
    size_.decode = std::max(1, static_cast<int32_t>(std::ceil(d - 1e-9)));
    // Over the budget: both shrink in proportion.
    const int64_t gpus = int64_t{size_.prefill} * e.gpus_per_prefill + int64_t{size_.decode} * e.gpus_per_decode;
    if (o_.gpu_budget > 0 && gpus > o_.gpu_budget) {
      const double f = static_cast<double>(o_.gpu_budget) / static_cast<double>(gpus);
      size_.prefill = std::max(1, static_cast<int32_t>(std::floor(size_.prefill * f)));
      size_.decode = std::max(1, static_cast<int32_t>(std::floor(size_.decode * f)));
    }
    return size_;
  }

 private:
  IntervalOptions o_;
  PoolSize size_;
};

class TandemScaling final : public ScalingPolicy {
 public:
  explicit TandemScaling(const TandemOptions& o) : o_(o) {}
  std::string name() const override { return "tandem"; }
  PoolSize initial() const override { return o_.initial; }
  PoolSize decide(const planner::Signals& s) override {
    const planner::Decision d = planner::decide(o_.config, s, state_);
    why_ = strCat("prefill ", planner::reasonName(d.prefill.reason), ": ", d.prefill.message, " | decode ",
                  planner::reasonName(d.decode.reason), ": ", d.decode.message);
    return PoolSize{d.prefill.desired, d.decode.desired};
  }
  std::string why() const override { return why_; }
  double checkEvery() const override { return o_.config.scale_up_check_s; }
  std::optional<PoolSize> check(const planner::Signals& s) override {
    const planner::Decision d = planner::checkScaleUp(o_.config, s, state_);
    if (!d.acted()) return std::nullopt;
    why_ = strCat("prefill ", planner::reasonName(d.prefill.reason), ": ", d.prefill.message, " | decode ",
                  planner::reasonName(d.decode.reason), ": ", d.decode.message);
    return PoolSize{d.prefill.desired, d.decode.desired};
  }

 private:
  TandemOptions o_;
  planner::PlannerState state_;
  std::string why_;
};

}  // namespace

std::unique_ptr<ScalingPolicy> staticPolicy(PoolSize size) { return std::make_unique<StaticPolicy>(size); }
std::unique_ptr<ScalingPolicy> intervalPolicy(const IntervalOptions& options) {
  return std::make_unique<IntervalPolicy>(options);
}
std::unique_ptr<ScalingPolicy> tandemPolicy(const TandemOptions& options) {
  return std::make_unique<TandemScaling>(options);
}

}  // namespace tandem::sim
