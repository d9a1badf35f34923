#pragma once
// The engine's record of one request while it lives. Owned by the Engine;
// the Scheduler holds raw pointers in its queues.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/model/tokenizer.h"
#include "engine/sched/request.h"
#include "engine/sched/sampler.h"
#include "src/common/block_hash.h"
#include "src/common/clock.h"
#include "src/common/ids.h"

namespace tandem::engine {

enum class SeqState : uint8_t { kWaiting, kRunning, kFinished };

// Where a sequence's prompt KV comes from (RequestSpec::import_kv asks for an
// import; the scheduler decides at admission). The spec keeps what the caller
// asked for; this is what happens.
//   kCompute                                   no import asked: computed here
//   kImport --admission--> kDirect             direct-to-D: computed here after all
//   kImport --admission--> kImporting          blocks allocated and reported; a peer writes them
//   kImporting --completeImport--> kImported   the KV arrived: an ordinary decode from here on
//   kImporting --computeImportLocally--> kDirect  the importer gave up before writing: computed here
// An importing sequence ends only through the importer (abortImport).
enum class PromptKv : uint8_t { kCompute, kImport, kDirect, kImporting, kImported };

struct Sequence {
  // `root`: the engine's block-hash root (EngineOptions::block_hash_root).
  Sequence(RequestId id_in, RequestSpec spec_in, int block_size, BlockHash root = kBlockHashRoot)
      : id(id_in), spec(std::move(spec_in)), chain(block_size, root) {}

  RequestId id;
  RequestSpec spec;  // spec.prompt is moved into `tokens`; otherwise as the caller gave it
  SeqState state = SeqState::kWaiting;
  PromptKv prompt_kv = spec.import_kv ? PromptKv::kImport : PromptKv::kCompute;

  // Prompt then generated tokens. KV exists for tokens[0, num_computed);
  // the step computes tokens[num_computed, ...).
  std::vector<TokenId> tokens;
  int num_prompt_tokens = 0;
  int num_computed = 0;

  // Block table: position p lives in blocks[p / block_size]. Logical order
  // comes only from here, never from block ids.
  std::vector<BlockId> blocks;
  // Hashes of the full blocks of `tokens` (a block's hash is known as soon as
  // its tokens are; it is committed to the cache only once its KV is computed).
  BlockHashChain chain;
  int num_committed_blocks = 0;  // leading blocks already committed

  // Import (prompt_kv == kImporting): blocks are allocated and reported;
  // nothing is computed until completeImport().
  bool importing() const { return prompt_kv == PromptKv::kImporting; }
  // Its prompt blocks were sent to the caller (RequestUpdate::kv_blocks): an
  // import's destination, or a leased prefill's source.
  bool kv_blocks_reported = false;
  // Leased prefill (RequestSpec::lease): its prompt blocks are allocated and
  // reported at admission, and blocks [0, blocks_announced) are announced to
  // the layer observer as final. Once reported, a peer may be reading them:
  // such a sequence is never preempted (pinned()).
  int blocks_announced = 0;
  bool pinned() const { return importing() || (spec.lease.has_value() && kv_blocks_reported); }

  // Admission reservation, in blocks: prompt + expected output.
  int reserved_blocks = 0;
  int reserved_tokens = 0;

  // Trace.
  int num_cached_tokens = 0;  // at first admission
  bool admitted_once = false;
  int num_preemptions = 0;
  int kv_blocks_peak = 0;
  MonoTime arrival;
  std::optional<MonoTime> first_scheduled, first_token;

  // Sampling and output text.
  SamplerRng rng;
  UpdateCallback on_update;
  std::vector<TokenId> pending_tokens;          // sampled, not yet reported
  std::string text;                             // decoded output so far (stop strings cut)
  size_t text_emitted = 0;                      // bytes of `text` already reported
  std::unique_ptr<IncrementalDecoder> decoder;  // created with the first output token

  int numOutputTokens() const { return static_cast<int>(tokens.size()) - num_prompt_tokens; }
  int numUncomputed() const { return static_cast<int>(tokens.size()) - num_computed; }
};

}  // namespace tandem::engine
