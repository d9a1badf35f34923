#include "agent/pd_transfer.h"

#include <algorithm>

#include "src/common/strings.h"

namespace tandem::agent {

using kvproto::FailureReason;
using Kind = TransferAction::Kind;

std::string_view transferStateName(TransferState s) {
  switch (s) {
    case TransferState::kQueued:
      return "queued";
    case TransferState::kRequested:
      return "requested";
    case TransferState::kPulling:
      return "pulling";
    case TransferState::kComplete:
      return "complete";
    case TransferState::kDraining:
      return "draining";
    case TransferState::kEnded:
      return "ended";
  }
  return "unknown";
}

void DecodeTransfer::admitted(std::vector<BlockId> blocks, MonoTime now, MonoTime deadline, TransferActions& out) {
  if (state_ == TransferState::kEnded) {
    // Failed while queued: the end posted then may have come too early to
    // reach the request (it only ends an importing one); end it again.
    out.push_back({.kind = Kind::kEndImport, .reason = *failure_, .message = failure_message_});
    return;
  }
  if (state_ != TransferState::kQueued) return;
  d_blocks_ = std::move(blocks);
  checksums_.assign(numLayerBlocks(), 0);
  requested_.assign(numLayerBlocks(), 0);
  started_ = now;
  deadline_ = deadline;
  state_ = TransferState::kRequested;
  out.push_back({.kind = Kind::kSendPrefillRequest});
}

void DecodeTransfer::peerReady(uint32_t num_blocks, MonoTime now, TransferActions& out) {
  peer_blocks_ = num_blocks;
  drainEarlyLayers(now, out);
}

void DecodeTransfer::accepted(std::vector<uint32_t> p_blocks, MonoTime lease_deadline, MonoTime now,
                              TransferActions& out) {
  if (state_ == TransferState::kPulling)
    return fail(FailureReason::kTransferFailed, "the prefill peer accepted the request twice", true, out);
  if (state_ != TransferState::kRequested) return;  // over already (or never asked: the owner filters those)
  p_blocks_ = std::move(p_blocks);
  // Never read P's blocks after its lease ends, whatever our own deadline says.
  if (!lease_deadline_ || lease_deadline < *lease_deadline_) lease_deadline_ = lease_deadline;
  state_ = TransferState::kPulling;
  if (p_blocks_.size() != d_blocks_.size()) {
    return fail(FailureReason::kTransferFailed,
                strCat("prefill holds ", p_blocks_.size(), " blocks, this request has ", d_blocks_.size()), true, out);
  }
  drainEarlyLayers(now, out);
}

void DecodeTransfer::layerReady(kvproto::LayerReady l, MonoTime now, TransferActions& out) {
  if (state_ != TransferState::kQueued && state_ != TransferState::kRequested && state_ != TransferState::kPulling)
    return;
  last_layer_at_ = now;
  if (state_ == TransferState::kPulling && peer_blocks_) return startLayer(l, now, out);
  // Every announcement names at least one block of one layer.
  if (early_layers_.size() >= static_cast<size_t>(num_layers_) * std::max<size_t>(d_blocks_.size(), 1)) {
    return fail(FailureReason::kTransferFailed,
                "more layer announcements than layer blocks before the request was accepted", true, out);
  }
  early_layers_.push_back(std::move(l));
}

void DecodeTransfer::drainEarlyLayers(MonoTime now, TransferActions& out) {
  if (state_ != TransferState::kPulling || !peer_blocks_) return;
  std::vector<kvproto::LayerReady> early = std::move(early_layers_);
  early_layers_.clear();
  for (const kvproto::LayerReady& l : early) {
    if (state_ != TransferState::kPulling) return;
    startLayer(l, now, out);
  }
}

// False (and the transfer failed) if the announcement contradicts what P accepted.
bool DecodeTransfer::checkAnnouncement(const kvproto::LayerReady& l, MonoTime now, TransferActions& out) {
  const size_t n = d_blocks_.size();
  const uint64_t end = static_cast<uint64_t>(l.first_block) + l.checksums.size();
  if (end > n || l.layer >= num_layers_) {
    fail(FailureReason::kTransferFailed,
         strCat("layer announcement (layer ", l.layer, ", blocks [", l.first_block, ", ", end, ")) does not match the ",
                n, " accepted blocks"),
         true, out);
    return false;
  }
  if (lease_deadline_ && now >= *lease_deadline_) {
    fail(FailureReason::kLeaseExpired, "a layer was announced too close to the end of the prefill peer's lease", true,
         out);
    return false;
  }
  for (size_t i = l.first_block; i < end; ++i) {
    // PrefillAccepted may have arrived before P's Hello, unchecked then.
    if (p_blocks_[i] >= *peer_blocks_) {
      fail(FailureReason::kTransferFailed,
           strCat("accepted block ", i, " is block ", p_blocks_[i], ", outside the prefill peer's ", *peer_blocks_),
           true, out);
      return false;
    }
    if (requested_[l.layer * n + i]) {
      fail(FailureReason::kTransferFailed, strCat("layer ", l.layer, " block ", i, " was announced twice"), true, out);
      return false;
    }
  }
  return true;
}

void DecodeTransfer::startLayer(const kvproto::LayerReady& l, MonoTime now, TransferActions& out) {
  if (!checkAnnouncement(l, now, out) || l.checksums.empty()) return;
  const size_t n = d_blocks_.size();
  for (size_t i = 0; i < l.checksums.size(); ++i) {
    requested_[l.layer * n + l.first_block + i] = 1;
    checksums_[l.layer * n + l.first_block + i] = l.checksums[i];
  }
  const auto id = static_cast<PullId>(pulls_.size());
  pulls_.push_back(Pull{.layer = l.layer, .first = l.first_block, .count = l.checksums.size(), .issued = now});
  outstanding_.push_back(id);
  out.push_back(
      {.kind = Kind::kIssuePull, .pull = id, .layer = l.layer, .first = l.first_block, .count = l.checksums.size()});
}

void DecodeTransfer::pullDone(PullId id, const absl::Status& status, std::span<const uint64_t> checksums, MonoTime now,
                              TransferActions& out) {
  auto it = std::find(outstanding_.begin(), outstanding_.end(), id);
  if (it == outstanding_.end()) return;  // not one of ours, or reported twice: the transport's contract says never
  outstanding_.erase(it);
  const Pull pull = *pulls_[id];
  pulls_[id].reset();
  if (pull.landed) layer_blocks_landed_ -= pull.count;
  if (state_ != TransferState::kPulling) return maybeEnd(out);  // its last pull may just have completed
  if (!status.ok()) return fail(FailureReason::kTransferFailed, toStd(status.message()), true, out);
  if (lease_deadline_ && now > *lease_deadline_) {
    // The read may have overlapped P unpinning the blocks: not trusted.
    return fail(FailureReason::kLeaseExpired,
                "a layer pull finished after the prefill peer's lease (with margin) ended", true, out);
  }
  layer_blocks_done_ += pull.count;
  pull_times_.emplace_back(pull.issued, now);
  verifyPull(pull, checksums, out);
  maybeComplete(now, out);
}

void DecodeTransfer::verifyPull(const Pull& pull, std::span<const uint64_t> checksums, TransferActions& out) {
  if (!verify_) return;
  if (checksums.size() != pull.count) {
    return fail(FailureReason::kChecksumMismatch, strCat("layer ", pull.layer, ": no checksums for the pulled blocks"),
                true, out);
  }
  const size_t n = d_blocks_.size();
  for (size_t i = 0; i < pull.count; ++i) {
    if (checksums[i] != checksums_[pull.layer * n + pull.first + i]) {
      return fail(FailureReason::kChecksumMismatch,
                  strCat("layer ", pull.layer, " block ", pull.first + i, " checksum differs"), true, out);
    }
  }
}

void DecodeTransfer::prefillDone(uint32_t first_token, MonoTime now, TransferActions& out) {
  if (state_ != TransferState::kRequested && state_ != TransferState::kPulling) return;
  first_token_ = first_token;
  maybeComplete(now, out);
}

void DecodeTransfer::maybeComplete(MonoTime now, TransferActions& out) {
  if (state_ != TransferState::kPulling || !first_token_ || layer_blocks_done_ < numLayerBlocks() ||
      !outstanding_.empty())
    return;
  state_ = TransferState::kComplete;
  kv_done_at_ = now;
  timings_ = phaseTimings();
  out.push_back({.kind = Kind::kSendRelease});
  out.push_back({.kind = Kind::kCompleteImport, .first_token = *first_token_});
}

void DecodeTransfer::fail(FailureReason reason, std::string_view message, bool tell_peer, TransferActions& out) {
  if (state_ == TransferState::kDraining || state_ == TransferState::kEnded) return maybeEnd(out);
  if (state_ == TransferState::kComplete) return;
  const bool asked_peer = state_ != TransferState::kQueued;
  failure_ = reason;
  failure_message_ = strCat("kv transfer failed (", kvproto::failureReasonName(reason), "): ", message);
  state_ = TransferState::kDraining;
  out.push_back({.kind = Kind::kReportFailure, .reason = reason, .message = std::string(message)});
  for (PullId id : outstanding_) out.push_back({.kind = Kind::kCancelPull, .pull = id});
  if (tell_peer && asked_peer && reason != FailureReason::kPeerUnhealthy) {
    out.push_back({.kind = Kind::kSendAbort, .reason = reason, .message = std::string(message)});
  }
  maybeEnd(out);
}

// The only way a failed import ends: after its last pull completed.
void DecodeTransfer::maybeEnd(TransferActions& out) {
  if (state_ != TransferState::kDraining || !outstanding_.empty()) return;
  state_ = TransferState::kEnded;
  out.push_back({.kind = Kind::kEndImport, .reason = *failure_, .message = failure_message_});
}

void DecodeTransfer::tightenDeadline(MonoTime deadline) {
  if (state_ != TransferState::kRequested && state_ != TransferState::kPulling) return;
  if (!deadline_ || deadline < *deadline_) deadline_ = deadline;
}

void DecodeTransfer::pullLanded(PullId id) {
  if (id >= pulls_.size() || !pulls_[id] || pulls_[id]->landed) return;
  pulls_[id]->landed = true;
  layer_blocks_landed_ += pulls_[id]->count;
}

bool DecodeTransfer::onlyChecksPending() const {
  return state_ == TransferState::kPulling && first_token_ &&
         layer_blocks_done_ + layer_blocks_landed_ >= numLayerBlocks();
}

void DecodeTransfer::tick(MonoTime now, TransferActions& out) {
  if (state_ != TransferState::kRequested && state_ != TransferState::kPulling) return;
  if (onlyChecksPending()) return;  // what they judge already arrived in time
  if (deadline_ && *deadline_ <= now) {
    fail(FailureReason::kPrefillTimeout, "the prefill peer did not deliver the KV in time", true, out);
  } else if (lease_deadline_ && *lease_deadline_ <= now) {
    fail(FailureReason::kLeaseExpired, "the prefill peer's lease on the KV ran out before the pull finished", true,
         out);
  }
}

std::optional<MonoTime> DecodeTransfer::nextDeadline() const {
  if (state_ != TransferState::kRequested && state_ != TransferState::kPulling) return std::nullopt;
  if (onlyChecksPending()) return std::nullopt;
  if (deadline_ && lease_deadline_) return std::min(*deadline_, *lease_deadline_);
  return deadline_ ? deadline_ : lease_deadline_;
}

// The TTFT phases but first_step_ms: the union of the pulls' intervals, and
// its part before P's last announcement (overlapped with P's compute).
PdTimings DecodeTransfer::phaseTimings() const {
  auto ms = [](Duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  PdTimings t;
  const MonoTime p_done = last_layer_at_.value_or(started_);
  t.prefill_ms = ms(p_done - started_);
  std::vector<std::pair<MonoTime, MonoTime>> pulls = pull_times_;
  std::sort(pulls.begin(), pulls.end());
  std::optional<std::pair<MonoTime, MonoTime>> run;
  auto add = [&](MonoTime a, MonoTime b) {
    t.transfer_ms += ms(b - a);
    if (a < p_done) t.transfer_hidden_ms += ms(std::min(b, p_done) - a);
  };
  for (const auto& [a, b] : pulls) {
    if (run && a <= run->second) {
      run->second = std::max(run->second, b);
    } else {
      if (run) add(run->first, run->second);
      run = {a, b};
    }
  }
  if (run) add(run->first, run->second);
  return t;
}

}  // namespace tandem::agent
