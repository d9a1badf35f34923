#include "agent/agent_metrics.h"

#include <chrono>

namespace tandem::agent {
namespace {

using metrics::buildCounter;
using metrics::buildGauge;
using metrics::buildHistogram;

double seconds(Duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

AgentMetrics::AgentMetrics(metrics::Registry& r, const std::string& pool, const std::string& role)
    : registry_(r),
      labels_{{"pool", pool}, {"role", role}},
      ttft_(buildHistogram().name("tandem_request_ttft_seconds").help("Time from arrival to the first output token.")
                .labels(labels_).buckets(metrics::exponentialBuckets(0.001, 2, 18)).registerOn(r).add({})),
      tpot_(buildHistogram().name("tandem_request_tpot_seconds").help("Mean time per output token after the first.")
                .labels(labels_).buckets(metrics::exponentialBuckets(0.0005, 2, 14)).registerOn(r).add({})),
      e2e_(buildHistogram().name("tandem_request_e2e_seconds").help("Time from arrival to the end of the request.")
               .labels(labels_).buckets(metrics::exponentialBuckets(0.005, 2, 18)).registerOn(r).add({})),
      queue_(buildHistogram().name("tandem_request_queue_seconds").help("Time from arrival to first being scheduled.")
                 .labels(labels_).buckets(metrics::exponentialBuckets(0.0005, 2, 18)).registerOn(r).add({})),
      requests_(buildCounter().name("tandem_requests_total").help("Finished requests by finish reason.").labels(labels_).registerOn(r)),
      path_(buildCounter().name("tandem_request_path_total").help("Requests by serving path (direct: computed here, disagg: prefilled by a P agent).")
                .labels(labels_).registerOn(r)),
      prompt_tokens_(buildCounter().name("tandem_prompt_tokens_total").help("Prompt tokens of finished requests.").labels(labels_).registerOn(r).add({})),
      generation_tokens_(buildCounter().name("tandem_generation_tokens_total").help("Generated tokens of finished requests.").labels(labels_).registerOn(r).add({})),
      prefix_hit_tokens_(buildCounter().name("tandem_prefix_cache_hit_tokens_total").help("Prompt tokens served from the prefix cache or a resident session, at admission.").labels(labels_).registerOn(r).add({})),
      prefix_query_tokens_(buildCounter().name("tandem_prefix_cache_query_tokens_total").help("Prompt tokens looked up in the prefix cache, at admission. Hit rate = hit / query.").labels(labels_).registerOn(r).add({})),
      preemptions_(buildCounter().name("tandem_preemptions_total").help("Sequences preempted by recompute.").labels(labels_).registerOn(r).add({})),
      session_evictions_(buildCounter().name("tandem_kv_session_evictions_total").help("Resident sessions evicted to free KV blocks (watermark, admission, running sequences' growth).").labels(labels_).registerOn(r).add({})),
      prefill_tokens_(buildCounter().name("tandem_engine_prefill_tokens_total").help("Prompt tokens the engine computed (cache hits not counted).").labels(labels_).registerOn(r).add({})),
      busy_seconds_(buildCounter().name("tandem_engine_busy_seconds_total").help("Time the engine spent in steps that computed something. Prefill capacity = rate(prefill tokens) / rate(busy seconds).").labels(labels_).registerOn(r).add({})),
      kv_staged_bytes_(buildCounter().name("tandem_kv_staged_bytes_total").help("KV bytes copied between the KV pool and the P/D transport's host staging copy: a pool in device memory, or every rank's of a tensor-parallel group (to_host: announced prefill layers; to_device: completed imports). Zero on a one-process host pool.").labels(labels_).registerOn(r)),
      kv_staging_seconds_(buildCounter().name("tandem_kv_staging_seconds_total").help("Time the engine thread spent on those staging copies (no step runs meanwhile).").labels(labels_).registerOn(r).add({})),
      tensor_parallel_ranks_(buildGauge().name("tandem_tensor_parallel_ranks").help("Processes the model is split across (--tensor-parallel; 1: none).").labels(labels_).registerOn(r).add({})),
      tensor_parallel_wait_seconds_(buildCounter().name("tandem_tensor_parallel_wait_seconds_total").help("Time rank 0 waited for the other tensor-parallel ranks (their partial sums, step ends and staged KV): the links' cost and the slowest rank's lag.").labels(labels_).registerOn(r).add({})),
      cuda_graph_steps_(buildCounter().name("tandem_cuda_graph_steps_total").help("Decode steps the CUDA backend ran as CUDA graphs (docs/cuda.md): outcome=captured (a new graph, then run), replayed, or left (a launch differed from the graph's, so the step ran launch by launch). Zero on the CPU backend.").labels(labels_).registerOn(r)),
      kv_blocks_capacity_(buildGauge().name("tandem_kv_blocks_capacity").help("KV blocks in the pool.").labels(labels_).registerOn(r).add({})),
      kv_blocks_free_(buildGauge().name("tandem_kv_blocks_free").help("KV blocks available now (free or cached-unreferenced).").labels(labels_).registerOn(r).add({})),
      running_(buildGauge().name("tandem_requests_running").help("Sequences admitted and running.").labels(labels_).registerOn(r).add({})),
      waiting_(buildGauge().name("tandem_requests_waiting").help("Sequences waiting for admission.").labels(labels_).registerOn(r).add({})),
      prefill_queue_tokens_(buildGauge().name("tandem_prefill_queue_tokens").help("Prompt tokens not yet computed (waiting and prefilling).").labels(labels_).registerOn(r).add({})),
      sessions_resident_(buildGauge().name("tandem_sessions_resident").help("Sessions whose KV is resident.").labels(labels_).registerOn(r).add({})),
      kv_blocks_sessions_(buildGauge().name("tandem_kv_blocks_sessions").help("KV blocks only resident sessions hold (what evicting them all would free): the working set beyond running sequences.").labels(labels_).registerOn(r).add({})),
      vllm_waiting_(buildGauge().name("vllm:num_requests_waiting").help("Requests waiting (Gateway API Inference Extension name).").labels(labels_).registerOn(r).add({})),
      vllm_running_(buildGauge().name("vllm:num_requests_running").help("Requests running (Gateway API Inference Extension name).").labels(labels_).registerOn(r).add({})),
      vllm_kv_usage_(buildGauge().name("vllm:kv_cache_usage_perc").help("Fraction of KV blocks in use, 0..1 (Gateway API Inference Extension name).").labels(labels_).registerOn(r).add({})) {
  // Every finish reason and path appears from the start, so rate() works from the first scrape.
  for (auto reason : {engine::FinishReason::kEos, engine::FinishReason::kLength, engine::FinishReason::kStop,
                      engine::FinishReason::kCancelled, engine::FinishReason::kTimeout, engine::FinishReason::kPreempted,
                      engine::FinishReason::kRejected, engine::FinishReason::kError}) {
    requests_.add({{"finish_reason", std::string(engine::finishReasonName(reason))}});
  }
  for (const char* p : {"direct", "disagg", "fallback"}) path_.add({{"path", p}});
  for (const char* d : {"to_host", "to_device"}) kv_staged_bytes_.add({{"direction", d}});
  for (const char* o : {"captured", "replayed", "left"}) cuda_graph_steps_.add({{"outcome", o}});
}

void AgentMetrics::onStep(const engine::StepStats& s) {
  kv_blocks_capacity_.set(s.num_total_blocks);
  kv_blocks_free_.set(s.num_free_blocks);
  running_.set(s.num_running);
  waiting_.set(s.num_waiting);
  prefill_queue_tokens_.set(s.queue_tokens);
  sessions_resident_.set(s.num_sessions_resident);
  kv_blocks_sessions_.set(s.num_session_blocks);
  vllm_waiting_.set(s.num_waiting);
  vllm_running_.set(s.num_running);
  vllm_kv_usage_.set(s.num_total_blocks == 0 ? 0.0 : 1.0 - static_cast<double>(s.num_free_blocks) / s.num_total_blocks);
  prefix_hit_tokens_.increment(s.prefix_hit_tokens);
  prefix_query_tokens_.increment(s.prefix_query_tokens);
  preemptions_.increment(s.num_preemptions);
  session_evictions_.increment(s.num_session_evictions);
  prefill_tokens_.increment(s.num_prefill_tokens);
  if (s.kv_staged_to_host_bytes > 0) {
    kv_staged_bytes_.add({{"direction", "to_host"}}).increment(static_cast<double>(s.kv_staged_to_host_bytes));
  }
  if (s.kv_staged_to_device_bytes > 0) {
    kv_staged_bytes_.add({{"direction", "to_device"}}).increment(static_cast<double>(s.kv_staged_to_device_bytes));
  }
  kv_staging_seconds_.increment(std::chrono::duration<double>(s.kv_staging_time).count());
  tensor_parallel_wait_seconds_.increment(std::chrono::duration<double>(s.tensor_parallel_wait_time).count());
  if (s.graph_steps_captured > 0) cuda_graph_steps_.add({{"outcome", "captured"}}).increment(s.graph_steps_captured);
  if (s.graph_steps_replayed > 0) cuda_graph_steps_.add({{"outcome", "replayed"}}).increment(s.graph_steps_replayed);
  if (s.graph_steps_left > 0) cuda_graph_steps_.add({{"outcome", "left"}}).increment(s.graph_steps_left);
  if (s.num_scheduled_tokens > 0) {
    busy_seconds_.increment(std::chrono::duration<double>(s.schedule_time + s.model_time + s.postprocess_time).count());
  }
}

void AgentMetrics::onFinish(const engine::RequestUpdate& u, const std::string& path) {
  requests_.add({{"finish_reason", std::string(engine::finishReasonName(u.finish_reason))}}).increment();
  if (u.finish_reason == engine::FinishReason::kRejected) return;
  path_.add({{"path", path}}).increment();
  prompt_tokens_.increment(u.num_prompt_tokens);
  generation_tokens_.increment(u.num_output_tokens);
  if (u.arrival && u.first_scheduled) queue_.observe(seconds(*u.first_scheduled - *u.arrival));
  if (u.arrival && u.first_token) ttft_.observe(seconds(*u.first_token - *u.arrival));
  if (u.first_token && u.finished_at && u.num_output_tokens > 1) {
    tpot_.observe(seconds(*u.finished_at - *u.first_token) / (u.num_output_tokens - 1));
  }
  if (u.arrival && u.finished_at) e2e_.observe(seconds(*u.finished_at - *u.arrival));
}

}  // namespace tandem::agent
