#pragma once
// What a caller hands the engine, and the typed outcomes it gets back.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "src/common/clock.h"
#include "src/common/ids.h"

namespace tandem::engine {

// Why a request ended. Callers switch on this, never on message text.
enum class FinishReason : uint8_t {
  kEos,        // the model produced end-of-sequence
  kLength,     // max_tokens reached, or the model's context is full
  kStop,       // a stop string appeared (it is cut from the text)
  kCancelled,  // the caller cancelled (e.g. client disconnect)
  kTimeout,    // the request's deadline passed
  kPreempted,  // preempted more often than max_preemptions allows
  kRejected,   // never admitted; see RejectReason
  kError,      // a bug or backend failure; see the message
};
std::string_view finishReasonName(FinishReason r);

// Why a request was refused at the door.
enum class RejectReason : uint8_t {
  kNone,
  kInvalid,        // bad parameters or token ids (a 400)
  kPromptTooLong,  // prompt + 1 exceeds the model's context (a 400)
  kCapacity,       // its reservation can never fit in this engine's KV pool
  kQueueFull,      // the waiting queue is full: back off and retry (a 429)
  kDraining,       // the engine is shutting down (a 503)
};
std::string_view rejectReasonName(RejectReason r);

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // 1 = off
  std::optional<uint64_t> seed;  // same seed + same prompt + same params => same output
  int max_tokens = 16;
  std::vector<std::string> stop;  // stop strings; the text is cut before the first match
  bool ignore_eos = false;
};

// P/D disaggregation (DESIGN.md §2): a prefill agent computes a prompt and
// keeps its KV pinned under a lease for the decode agent to read.
struct LeaseSpec {
  uint64_t id = 0;    // chosen by the caller, unique among live leases
  MonoTime expires;   // the KV is released at this time unless released earlier
};

struct RequestSpec {
  std::vector<TokenId> prompt;
  SamplingParams sampling;
  std::optional<SessionId> session;  // keep KV resident under this id when done
  int session_priority = 0;          // higher survives eviction longer
  std::optional<MonoTime> deadline;  // finish with kTimeout after this
  // Prefill role: when the request finishes normally, its prompt KV stays
  // pinned under this lease (Engine::releaseLease, or expiry). Before the
  // last prompt chunk runs, an update carries the prompt's blocks
  // (RequestUpdate::kv_blocks), and the engine's layer observer reports each
  // layer of them as it is written.
  std::optional<LeaseSpec> lease;
  // Decode role: the prompt's KV comes from elsewhere. The engine admits the
  // request (reservation as usual), allocates blocks for the whole prompt,
  // reports them (RequestUpdate::kv_blocks) and computes nothing until
  // Engine::completeImport(). While importing, the request ends only through
  // Engine::abortImport() by the importer — never by deadline, preemption or
  // a plain cancel() (which is passed on to the importer as
  // RequestUpdate::import_abort_requested) — because someone else is writing
  // into its blocks.
  bool import_kv = false;
  // Direct-to-D: an import request whose session is resident here with at
  // most this many prompt tokens beyond the resident prefix is computed
  // locally instead (no prefill agent, no transfer). 0 = always import.
  int direct_max_suffix_tokens = 0;
};

// Progress of one request, delivered on the engine thread. `finished`
// updates come exactly once per request, last.
struct RequestUpdate {
  RequestId id;
  std::vector<TokenId> new_tokens;  // tokens sampled since the previous update
  std::string text_delta;           // complete UTF-8 text since the previous update
  bool finished = false;
  FinishReason finish_reason = FinishReason::kEos;
  RejectReason reject_reason = RejectReason::kNone;
  std::string message;  // human-readable detail for rejected / error

  // Filled on the finished update (the per-request trace).
  int num_prompt_tokens = 0;
  int num_cached_tokens = 0;   // prompt tokens served from the prefix cache or a resident session
  int num_output_tokens = 0;
  int num_reserved_tokens = 0; // the admission reservation: prompt + expected output
  // Leased prefill / import: the blocks holding (or to receive) the
  // prompt's KV, in logical order. Sent once, in a non-final update.
  std::vector<BlockId> kv_blocks;
  // Import: someone called cancel() while the KV is being imported. The
  // importer must stop its transfers and then call Engine::abortImport.
  bool import_abort_requested = false;
  // Final update of an import_kv request: whether its prompt KV was
  // imported (false: computed here, e.g. direct-to-D).
  bool kv_imported = false;

  int kv_blocks_peak = 0;
  int num_preemptions = 0;
  std::optional<MonoTime> arrival, first_scheduled, first_token, finished_at;
};

using UpdateCallback = std::function<void(const RequestUpdate&)>;

}  // namespace tandem::engine
