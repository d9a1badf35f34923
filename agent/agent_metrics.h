#pragma once
// The agent's Prometheus metrics (DESIGN.md §5 names), all labelled with
// `pool` and `role`. Request metrics are observed when a request finishes;
// engine gauges after every engine step. Thread-safe (metrics are atomics).

#include <string>

#include "engine/engine.h"
#include "src/metrics/metrics.h"

namespace tandem::agent {

class AgentMetrics {
 public:
  AgentMetrics(metrics::Registry& registry, const std::string& pool, const std::string& role);

  // Loop thread, after each step.
  void onStep(const engine::StepStats& stats);
  // The engine's tensor-parallel group: this many ranks (1: none).
  void setTensorParallelRanks(int ranks) { tensor_parallel_ranks_.set(ranks); }
  // A finished request (any reason).
  void onFinish(const engine::RequestUpdate& update, const std::string& path);

  metrics::Registry& registry() { return registry_; }

 private:
  metrics::Registry& registry_;
  metrics::Labels labels_;
  metrics::Histogram& ttft_;
  metrics::Histogram& tpot_;
  metrics::Histogram& e2e_;
  metrics::Histogram& queue_;
  metrics::Family<metrics::Counter>& requests_;
  metrics::Family<metrics::Counter>& path_;
  metrics::Counter& prompt_tokens_;
  metrics::Counter& generation_tokens_;
  metrics::Counter& prefix_hit_tokens_;
  metrics::Counter& prefix_query_tokens_;
  metrics::Counter& preemptions_;
  metrics::Counter& session_evictions_;
  metrics::Counter& prefill_tokens_;
  metrics::Counter& busy_seconds_;
  metrics::Family<metrics::Counter>& kv_staged_bytes_;
  metrics::Counter& kv_staging_seconds_;
  metrics::Gauge& tensor_parallel_ranks_;
  metrics::Counter& tensor_parallel_wait_seconds_;
  metrics::Family<metrics::Counter>& cuda_graph_steps_;
  metrics::Gauge& kv_blocks_capacity_;
  metrics::Gauge& kv_blocks_free_;
  metrics::Gauge& running_;
  metrics::Gauge& waiting_;
  metrics::Gauge& prefill_queue_tokens_;
  metrics::Gauge& sessions_resident_;
  metrics::Gauge& kv_blocks_sessions_;
  metrics::Gauge& vllm_waiting_;
  metrics::Gauge& vllm_running_;
  metrics::Gauge& vllm_kv_usage_;
};

}  // namespace tandem::agent
