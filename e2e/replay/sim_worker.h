#pragma once
// One simulated decode worker: a KV pool (worker_kv.h), a FIFO queue of
// requests waiting for admission, one prefill at a time, and decoding
// requests that run side by side. Time is the replay's simulated time; this
// class only changes state when the replay loop (replay.h) tells it an event
// happened.
//
//   offer()       D's door: refuse (typed) or queue the request
//   startNext()   if no prefill runs and the queue's head fits its KV
//                 reservation now, admit it and start its prefill
//   prefillDone() its prompt was computed: it decodes from now on
//   finish()      its answer is complete: its KV stays resident or cached
//
// What the worker holds and its load are published as worker-state deltas
// (worker_state.h) into the router's ClusterState, the same ingestion path
// the router role uses for the /internal/v1/events stream. Not thread-safe.

#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "e2e/replay/worker_kv.h"
#include "src/routing/cluster_state.h"
#include "src/routing/decision.h"
#include "src/routing/reject_reason.h"
#include "src/routing/router_config.h"

namespace tandem::replay {

// The simulated hardware, the same for every policy in a run.
struct WorkerModel {
  int64_t cache_blocks = 0;             // KV pool per worker, in 512-token blocks
  double prefill_tokens_per_s = 10000;  // uncached prompt tokens a worker computes per second
  double decode_tokens_per_s = 50;      // tokens per second of one decoding request
  int max_waiting = 256;                // queued requests beyond this are refused (queue_full)
  // A turn whose session is resident here and whose uncached suffix is at
  // most this many tokens is computed here directly (direct-to-D), as the
  // engine's scheduler decides (engine/sched/scheduler.h); by default the
  // threshold the tandem policy uses to choose that path.
  int64_t direct_max_suffix_tokens = routing::RouterConfig{}.direct_max_suffix_tokens;
};

// A request at a worker.
struct Job {
  size_t request = 0;  // index in the trace
  routing::Decision decision;
  double arrival_s = 0;
  KvRequest kv;
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  int64_t queued_prompt_tokens = 0;  // uncached prompt tokens when it was queued
};

// What startNext() admitted.
struct Admitted {
  Job job;
  int64_t hit_blocks = 0;  // prompt blocks found here
  bool direct = false;     // its session was resident here and the suffix short
  double prefill_s = 0;    // how long computing its uncached tokens takes
};

class SimWorker {
 public:
  SimWorker(std::string name, const WorkerModel& model);

  const std::string& name() const { return name_; }
  // The worker as a new subscriber first sees it.
  routing::WorkerSnapshot snapshot() const;

  // nullopt: queued. kCapacity: its reservation can never fit this worker's
  // pool; kQueueFull: max_waiting requests are queued already.
  std::optional<routing::RejectReason> offer(Job job);
  std::optional<Admitted> startNext();
  void prefillDone(const Job& job);
  void finish(const Job& job);

  // Applies what changed since the last call to `cluster`, as deltas with
  // consecutive sequence numbers. An error means the replay is broken.
  absl::Status publish(routing::ClusterState& cluster);

 private:
  routing::WorkerLoad load() const;

  std::string name_;
  WorkerModel model_;
  WorkerKv kv_;
  std::deque<Job> waiting_;
  int64_t waiting_prompt_tokens_ = 0;
  bool prefilling_ = false;
  int64_t running_ = 0;  // admitted and not finished (prefill or decode)
  uint64_t seq_ = 0;
  routing::WorkerLoad published_load_;
};

}  // namespace tandem::replay
