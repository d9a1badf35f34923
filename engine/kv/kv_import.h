#pragma once
// KV imports (P/D, decode side): a request whose prompt KV a prefill peer
// computes and this agent's transport writes into the request's own blocks
// (DESIGN.md §3 "owner writes").
//
// The states are Sequence::prompt_kv's. The scheduler admits an import
// request (kImport) like any other and then either computes it here
// (kDirect) or gives it all its prompt blocks, which the engine reports
// (RequestUpdate::kv_blocks) and a peer's KV fills (kImporting). While
// importing, the sequence computes nothing and is pinned: no deadline,
// preemption or plain cancel ends it, because someone else is writing into
// its blocks; a cancel is passed on to the importer (abortRequested), which
// stops its transfers and ends the request itself (Engine::abortImport).
// completeImport turns it into an ordinary decode (kImported).
//
// Pure transitions of one sequence; the engine applies them and delivers the
// updates. Not thread-safe: engine thread only.

#include <string>

#include "engine/sched/request.h"
#include "engine/sched/sequence.h"
#include "src/common/clock.h"
#include "src/common/status.h"

namespace tandem::engine {

// The prompt's KV has landed in seq's blocks: it continues as if it had
// computed the prompt (num_computed = the prompt; one draw of its sampler
// skipped when it samples, because the prefill side drew `first_token` from
// the same seeded stream). Call only if seq.importing(). Fails, changing
// nothing, when `first_token` is outside [0, vocab_size). The caller then
// commits the prompt's blocks and accepts `first_token` as its first output.
absl::Status completeImport(Sequence& seq, TokenId first_token, int vocab_size, MonoTime now);

// The importer gave up before writing anything into seq's blocks (its peer
// stalled before accepting): compute the prompt here after all. The blocks
// stay; the prompt is computed from num_computed (what admission reused)
// on, as for direct-to-D. Call only if seq.importing() and nothing was
// written into its blocks.
void computeImportLocally(Sequence& seq);

// The update that asks the importer of an importing sequence to stop (a
// cancel with `reason` came in while its blocks are being written).
RequestUpdate abortRequested(const Sequence& seq, FinishReason reason, std::string message);

// Whether the final update says the prompt's KV was imported (false when it
// was computed here, e.g. direct-to-D, or never arrived at the blocks).
bool kvImported(const Sequence& seq);

}  // namespace tandem::engine
