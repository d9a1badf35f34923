#pragma once
// Layer announcements of leased prefills (P/D, prefill side): which of a
// prompt's KV blocks are final, and when, so a decode peer pulls each layer
// while the rest of the prompt still computes.
//
// A leased prefill (RequestSpec::lease, no output yet) reports its prompt
// blocks (ceil(prompt / block_size) of them, allocated at admission) before
// the model first writes them. After that, every prompt block is announced
// exactly once per layer, in order, as it becomes final:
//   - a chunk that is not the prompt's last: after the step, for every layer,
//     the blocks the chunk completed (full blocks of computed tokens);
//   - the prompt's last chunk: during the step, layer by layer as each layer
//     lands, every block not announced yet (the partial last block included).
// Sequence::blocks_announced is the announced prefix: [0, blocks_announced).
//
// Pure bookkeeping over sequences and chunks; the engine delivers the
// announcements to its layer observer. Not thread-safe: engine thread only.

#include <cstddef>
#include <optional>
#include <span>

#include "engine/sched/scheduler.h"
#include "engine/sched/sequence.h"
#include "src/common/ids.h"

namespace tandem::engine {

// Blocks [first_block, first_block + blocks.size()) of a request's reported
// block list hold final KV for one layer. `blocks` views the sequence's block
// table: valid until that sequence changes (the next step, or its finish).
struct LayerReady {
  RequestId id;
  size_t first_block = 0;
  std::span<const BlockId> blocks;
  // The checksum of each of `blocks` in this layer, of the bytes peers will
  // read (Engine::kvRegion; src/common/block_hash.h layerBlockChecksum):
  // filled by the engine for its layer observer, valid during the call.
  std::span<const uint64_t> checksums;
};

class LayerAnnouncer {
 public:
  explicit LayerAnnouncer(int block_size) : block_size_(block_size) {}

  // Whether `seq` announces its prompt KV: a leased prefill that has not
  // produced output yet.
  static bool announces(const Sequence& seq) { return seq.spec.lease.has_value() && seq.numOutputTokens() == 0; }
  // Its prompt's blocks: what is reported, and announced in all.
  size_t numPromptBlocks(const Sequence& seq) const;

  // Before the model runs `chunk` (seq.num_computed not advanced yet): for
  // the prompt's last chunk of an announcing sequence, the blocks announced
  // during the run, layer by layer. Nothing otherwise.
  std::optional<LayerReady> duringRun(const ScheduledChunk& chunk) const;
  // After the model ran a chunk of `seq` (seq.num_computed advanced), if its
  // blocks were reported: advances seq.blocks_announced and returns the
  // blocks to announce now for every layer, when the chunk completed some
  // and was not the prompt's last (whose blocks duringRun announced).
  // Call before the chunk's token is sampled.
  std::optional<LayerReady> afterRun(Sequence& seq) const;

 private:
  int block_size_;
};

}  // namespace tandem::engine
