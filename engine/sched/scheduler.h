#pragma once
// Continuous batching with chunked prefill (nano-vllm's schedule step,
// TensorRT-LLM's vocabulary). Each step:
//   1. running sequences that decode get their one token first;
//   2. partially prefilled sequences continue, a chunk at a time, within the
//      step's token budget;
//   3. waiting sequences are admitted in order while the budget lasts and
//      their *reservation* fits (DESIGN.md §3 "admission is a reservation").
// A sequence's reservation is ceil((prompt + expected output) / block_size)
// blocks; outstanding reservations of running sequences are subtracted from
// what a newcomer may take, so admitted work does not run out of blocks. If
// decode runs out anyway (output longer than the estimate), the most recently
// admitted sequence is preempted by recompute: its blocks are freed and it
// goes to the front of the waiting queue.
//
// Import requests (P/D decode, Sequence::prompt_kv == kImport) are admitted
// like any other, then either go direct-to-D (their session is resident and
// only a short suffix is new: computed here, kDirect) or get all their prompt
// blocks at once and wait, computing nothing, until the engine completes the
// import (kImporting). The decision is recorded in the sequence's prompt_kv
// and listed in the result; the request's spec is never rewritten.
//
// The scheduler decides and does block accounting; the engine runs the model
// and finishes requests. Not thread-safe: owned by the engine thread.

#include <deque>
#include <utility>
#include <vector>

#include "engine/kv/block_manager.h"
#include "engine/kv/session_store.h"
#include "engine/sched/sequence.h"

namespace tandem::engine {

struct SchedulerOptions {
  int block_size = 16;
  int max_num_batched_tokens = 512;  // token budget per step
  int max_num_seqs = 64;             // running sequences at most
  int max_model_len = 2048;
  bool enable_prefix_cache = true;
  // Keep at least this many blocks available by evicting resident sessions.
  int session_low_watermark_blocks = 0;
  // Sessions evicted per step at most, for the watermark, admission and
  // running requests' blocks together.
  int max_session_evictions_per_step = 4;
};

struct ScheduledChunk {
  Sequence* seq;
  int num_tokens;  // tokens [seq->num_computed, seq->num_computed + num_tokens)
};

// What one step will do. Copies must run before the model.
struct ScheduleResult {
  std::vector<ScheduledChunk> chunks;
  std::vector<std::pair<BlockId, BlockId>> block_copies;  // (src, dst): copy-on-write
  std::vector<Sequence*> preempted;                       // moved back to the front of waiting
  std::vector<Sequence*> admitted;
  // Admitted import requests, by how their prompt KV comes: a peer writes it
  // into their blocks from now on (kImporting: the engine reports the
  // blocks), or it is computed here (kDirect).
  std::vector<Sequence*> imports;
  std::vector<Sequence*> direct_to_d;
  int num_session_evictions = 0;
  int num_prefix_hit_tokens = 0;  // cached tokens of sequences admitted this step
  int num_prefix_query_tokens = 0;
};

class Scheduler {
 public:
  Scheduler(const SchedulerOptions& options, BlockManager& blocks, SessionStore& sessions);

  // Blocks a sequence would reserve (prompt + expected output, capped at the context).
  int reservationBlocks(int reserved_tokens) const;
  // Blocks `seq` must be able to hold to be admitted: its reservation, or
  // more once its tokens (prompt + output so far, after a preemption)
  // outgrew it. Above the pool's size it can never be admitted.
  int admissionBlocks(const Sequence& seq) const;

  void addWaiting(Sequence* seq) { waiting_.push_back(seq); }
  // Removes a sequence from the queues and releases its blocks (part of the
  // engine's single cleanup path). Safe for sequences in any state.
  void remove(Sequence* seq);
  // Hands the blocks of a finishing sequence to the caller instead of
  // releasing them (for session residency) and removes it from the queues.
  std::vector<BlockId> detachBlocks(Sequence* seq);

  ScheduleResult schedule();
  // After the model ran: commits the hashes of blocks that became full and
  // computed, making them shareable through the prefix cache.
  void commitComputedBlocks(Sequence* seq);

  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const std::vector<Sequence*>& running() const { return running_; }
  // Reserved but not yet allocated blocks of all running sequences.
  int outstandingReservation() const;

 private:
  struct ReusePlan {
    int common_tokens = 0;  // tokens whose KV is reused
    bool from_session = false;
    int reuse_blocks = 0;     // leading blocks kept
    int blocks_from_lru = 0;  // reused cached blocks that are unreferenced now (they stop being available)
    bool needs_copy = false;  // the last reused block is partial and not writable
    // Blocks that committing the plan makes available again: on the session
    // path, the session's blocks past the reused prefix that only it holds,
    // and a copy-on-write source whose last reference the copy drops.
    int blocks_returned = 0;
  };
  // `imports`: the prompt's KV is to come from a prefill agent (nothing is reused).
  ReusePlan planReuse(const Sequence& seq, bool imports) const;
  // Whether an import request should compute its prompt here instead: its
  // session is resident and at most direct_max_suffix_tokens are new.
  bool directToD(const Sequence& seq) const;
  bool tryAdmit(Sequence* seq, ScheduleResult* result, int* session_evictions);
  // Commits `plan`: takes the reused blocks (from the session or the prefix
  // cache, with a copy-on-write of a partial last block), sets the
  // reservation and moves seq to running. Call only when the plan fits.
  void admit(Sequence* seq, const ReusePlan& plan, int reserved_blocks, ScheduleResult* result);
  // Makes sure seq has blocks for `num_tokens` tokens: evicts resident
  // sessions (within the step's limit, counted in *session_evictions), then
  // preempts others (or seq itself). Returns false when seq cannot run this
  // step: it was preempted, or it waits for later steps' session evictions.
  bool ensureBlocks(Sequence* seq, int num_tokens, ScheduleResult* result, int* session_evictions);
  void preempt(Sequence* victim, ScheduleResult* result);

  SchedulerOptions options_;
  BlockManager& blocks_;
  SessionStore& sessions_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // admission order; the back is the first preemption victim
};

}  // namespace tandem::engine
