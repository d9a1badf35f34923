#pragma once
// The decode side of one disaggregated request's KV transfer, as an explicit
// state machine (DESIGN.md §3, docs/pd.md "Failures"). Pure code: no lock,
// clock, engine or transport. DecodeService feeds it events (with the time
// they happened) and carries out the actions it returns, in order.
//
//   kQueued ──admitted──▶ kRequested ──accepted──▶ kPulling ──all KV in, first token──▶ kComplete
//      │                      │                       │
//      └─────────────── fail: local abort, deadline, P's Abort, disconnect, bad message ─┐
//                                                                                        ▼
//                                kDraining (pulls outstanding) ──last pull done──▶ kEnded
//
// Invariants (each has a test in tests/agent/pd_transfer_test.cc):
//  * A pull is issued only in kPulling, for blocks P accepted and announced,
//    and each (layer, block) is announced and pulled at most once.
//  * kEndImport (the action that lets the engine free D's blocks) is emitted
//    only when no pull is outstanding: a failing transfer cancels its pulls
//    and waits until every one of them completed ("a reader frees blocks
//    only after all its outstanding gets completed or were cancelled").
//  * kComplete and kEnded are final. The one event after kEnded that acts is
//    `admitted`: a transfer failed while still queued in the engine ends its
//    import again once the engine gave it an id (the first end may have come
//    too early to reach it).
//  * A failure is reported once; later failures of the same transfer only
//    re-check whether it can end.
//
// Not thread-safe: the owner serialises events (DecodeService: under its mutex).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "agent/pd_timings.h"
#include "src/common/clock.h"
#include "src/common/ids.h"
#include "src/common/status.h"
#include "src/kvproto/kvproto.h"

namespace tandem::agent {

enum class TransferState {
  kQueued,     // submitted; the engine has not given it blocks yet
  kRequested,  // PrefillRequest sent; waiting for PrefillAccepted
  kPulling,    // accepted: announced layers are pulled as they come
  kComplete,   // all KV in and P's first token: the engine continues (final)
  kDraining,   // failed; waiting for outstanding pulls to complete
  kEnded,      // failed and the engine told to end the request (final)
};
std::string_view transferStateName(TransferState s);

// Names one logical get (a block range of one layer) within a transfer.
using PullId = uint32_t;

struct TransferAction {
  enum class Kind {
    kSendPrefillRequest,  // ask P to prefill the prompt
    kIssuePull,           // pull `layer`, request blocks [first, first + count): one logical get
    kCancelPull,          // ask the transport to cancel pull `pull` (its completion still comes)
    kReportFailure,       // count and log `reason` / `message`; feeds the peer's health
    kSendAbort,           // tell P the transfer is over (`reason`, `message`)
    kSendRelease,         // tell P it may unpin the KV
    kCompleteImport,      // the engine continues the request from `first_token`
    kEndImport,           // the engine ends the request (its blocks are freed)
  };
  Kind kind;
  PullId pull = 0;
  uint32_t layer = 0;
  size_t first = 0;
  size_t count = 0;
  kvproto::FailureReason reason = kvproto::FailureReason::kTransferFailed;
  std::string message;
  uint32_t first_token = 0;
};
using TransferActions = std::vector<TransferAction>;

class DecodeTransfer {
 public:
  // `verify`: check each pulled block's checksum against P's announcement.
  DecodeTransfer(int num_layers, bool verify) : num_layers_(num_layers), verify_(verify) {}

  TransferState state() const { return state_; }

  // --- events; each appends the actions to carry out to `out`.
  // The engine admitted the import and gave it `blocks`; P must deliver by `deadline`.
  void admitted(std::vector<BlockId> blocks, MonoTime now, MonoTime deadline, TransferActions& out);
  // P's Hello arrived (or was known at admission): its pool has `num_blocks` blocks.
  void peerReady(uint32_t num_blocks, MonoTime now, TransferActions& out);
  // PrefillAccepted: P's blocks for the prompt, read none after `lease_deadline`.
  void accepted(std::vector<uint32_t> p_blocks, MonoTime lease_deadline, MonoTime now, TransferActions& out);
  void layerReady(kvproto::LayerReady layer, MonoTime now, TransferActions& out);
  // A pull completed (or failed, or was cancelled). `checksums`: those of
  // the pulled blocks in order, when verifying and `status` is OK.
  void pullDone(PullId pull, const absl::Status& status, std::span<const uint64_t> checksums, MonoTime now,
                TransferActions& out);
  // A pull's get completed and its checksums are still to be computed (a
  // pull into device memory, checked on the engine thread); pullDone
  // follows with the get's completion time. The deadlines no longer wait
  // on it: once every layer block has landed and P sent PrefillDone, tick()
  // leaves the transfer to its checks.
  void pullLanded(PullId pull);
  void prefillDone(uint32_t first_token, MonoTime now, TransferActions& out);
  // Abort from any cause. `tell_peer`: send P an Abort (not when P ended it,
  // never asked for it, or the connection is gone).
  void fail(kvproto::FailureReason reason, std::string_view message, bool tell_peer, TransferActions& out);
  // A deadline for the rest of the transfer (the owner's work-proportional
  // one, once P accepted): only ever brings the deadline forward.
  void tightenDeadline(MonoTime deadline);
  // The watchdog: fails the transfer if its deadline or lease margin passed.
  void tick(MonoTime now, TransferActions& out);

  // --- what the owner reads
  // When tick() must next run (nullopt: no deadline pending).
  std::optional<MonoTime> nextDeadline() const;
  bool verifying() const { return verify_; }
  const std::vector<BlockId>& dBlocks() const { return d_blocks_; }
  const std::vector<uint32_t>& pBlocks() const { return p_blocks_; }
  uint32_t peerBlocks() const { return peer_blocks_.value_or(0); }
  MonoTime started() const { return started_; }
  size_t numLayerBlocks() const { return d_blocks_.size() * static_cast<size_t>(num_layers_); }
  std::optional<kvproto::FailureReason> failure() const { return failure_; }
  // "kv transfer failed (reason): detail", once failed.
  const std::string& failureMessage() const { return failure_message_; }
  // Once complete: the TTFT phases but first_step_ms; and when the KV was all in.
  const std::optional<PdTimings>& timings() const { return timings_; }
  std::optional<MonoTime> kvDoneAt() const { return kv_done_at_; }
  size_t numOutstanding() const { return outstanding_.size(); }

 private:
  struct Pull {
    uint32_t layer = 0;
    size_t first = 0;
    size_t count = 0;
    MonoTime issued;
    bool landed = false;  // pullLanded: only its check is pending
  };
  void startLayer(const kvproto::LayerReady& l, MonoTime now, TransferActions& out);
  bool checkAnnouncement(const kvproto::LayerReady& l, MonoTime now, TransferActions& out);
  void drainEarlyLayers(MonoTime now, TransferActions& out);
  void verifyPull(const Pull& pull, std::span<const uint64_t> checksums, TransferActions& out);
  void maybeComplete(MonoTime now, TransferActions& out);
  void maybeEnd(TransferActions& out);
  // Nothing is left on the wire: every layer block landed (checked or not)
  // and P sent PrefillDone.
  bool onlyChecksPending() const;
  PdTimings phaseTimings() const;

  int num_layers_;  // not const: a transfer moved to another peer is replaced by a fresh one
  bool verify_;
  TransferState state_ = TransferState::kQueued;
  std::vector<BlockId> d_blocks_;
  std::vector<uint32_t> p_blocks_;
  std::optional<uint32_t> peer_blocks_;     // P's pool size, from its Hello
  std::vector<uint64_t> checksums_;         // [layer * blocks + block], as announced
  std::vector<uint8_t> requested_;          // [layer * blocks + block]: its pull was issued
  std::vector<std::optional<Pull>> pulls_;  // by PullId; reset once done
  std::vector<PullId> outstanding_;
  size_t layer_blocks_done_ = 0;  // pulled and verified
  size_t layer_blocks_landed_ = 0;  // pulled, their check pending (pullLanded)
  std::optional<uint32_t> first_token_;
  std::optional<kvproto::FailureReason> failure_;
  std::string failure_message_;
  MonoTime started_;
  std::optional<MonoTime> deadline_;
  std::optional<MonoTime> lease_deadline_;
  // Layer announcements that overtook PrefillAccepted or P's Hello: UCX may
  // deliver messages out of order while an endpoint switches lanes (e.g.
  // from tcp to shared memory after wire-up). Bounded by the layer blocks.
  std::vector<kvproto::LayerReady> early_layers_;
  // Phase times (PdTimings).
  std::optional<MonoTime> last_layer_at_;                  // the latest layer announcement arrived
  std::vector<std::pair<MonoTime, MonoTime>> pull_times_;  // [issued, completed] of finished pulls
  std::optional<MonoTime> kv_done_at_;
  std::optional<PdTimings> timings_;
};

}  // namespace tandem::agent
