// The decode transfer's state machine as pure code: events in, actions out,
// no engine, transport or clock. Checks the invariants of pd_transfer.h after
// the interesting steps, above all that the request's blocks are released
// (kEndImport) only once every pull completed or was cancelled.

#include "agent/pd_transfer.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace tandem::agent {
namespace {

using kvproto::FailureReason;
using Kind = TransferAction::Kind;

constexpr int kLayers = 2;
constexpr uint32_t kPeerBlocks = 64;

MonoTime at(int ms) { return MonoTime(std::chrono::milliseconds(ms)); }

std::vector<Kind> kinds(const TransferActions& actions) {
  std::vector<Kind> out;
  for (const auto& a : actions) out.push_back(a.kind);
  return out;
}

int count(const TransferActions& actions, Kind kind) {
  return static_cast<int>(std::count_if(actions.begin(), actions.end(), [&](const auto& a) { return a.kind == kind; }));
}

// Drives one transfer of a two-block prompt through its states.
class TransferTest : public ::testing::Test {
 protected:
  DecodeTransfer tr{kLayers, /*verify=*/true};
  TransferActions out;

  TransferActions take() { return std::exchange(out, {}); }

  void admit() {
    tr.admitted({BlockId(3), BlockId(4)}, at(0), at(1000), out);
    tr.peerReady(kPeerBlocks, at(0), out);
  }
  void accept() { tr.accepted({10, 11}, at(900), at(1), out); }
  // Announces `layer` (both blocks) and returns the pull it issued.
  PullId announce(uint16_t layer) {
    tr.layerReady({.layer = layer, .first_block = 0, .checksums = {7, 8}}, at(2), out);
    EXPECT_EQ(out.back().kind, Kind::kIssuePull);
    return out.back().pull;
  }
  void pulled(PullId p, std::vector<uint64_t> checksums = {7, 8}) {
    tr.pullDone(p, absl::OkStatus(), checksums, at(3), out);
  }
};

TEST_F(TransferTest, HappyPathRequestsPullsAndCompletes) {
  EXPECT_EQ(tr.state(), TransferState::kQueued);
  admit();
  EXPECT_EQ(kinds(take()), std::vector<Kind>{Kind::kSendPrefillRequest});
  EXPECT_EQ(tr.state(), TransferState::kRequested);
  accept();
  EXPECT_EQ(tr.state(), TransferState::kPulling);
  const PullId p0 = announce(0);
  const PullId p1 = announce(1);
  EXPECT_NE(p0, p1);
  tr.prefillDone(42, at(3), out);
  pulled(p0);
  EXPECT_EQ(count(out, Kind::kCompleteImport), 0) << "a pull is still outstanding";
  pulled(p1);
  EXPECT_EQ(tr.state(), TransferState::kComplete);
  const TransferActions last = take();
  ASSERT_GE(last.size(), 2u);
  EXPECT_EQ(last[last.size() - 2].kind, Kind::kSendRelease);
  EXPECT_EQ(last.back().kind, Kind::kCompleteImport);
  EXPECT_EQ(last.back().first_token, 42u);
  ASSERT_TRUE(tr.timings());
  EXPECT_EQ(tr.kvDoneAt(), at(3));
}

TEST_F(TransferTest, AnnouncementsBeforeAcceptanceWaitForIt) {
  admit();
  take();
  tr.layerReady({.layer = 1, .first_block = 1, .checksums = {5}}, at(1), out);
  EXPECT_EQ(count(take(), Kind::kIssuePull), 0);
  accept();
  const TransferActions a = take();
  ASSERT_EQ(count(a, Kind::kIssuePull), 1);
  EXPECT_EQ(a.back().layer, 1u);
  EXPECT_EQ(a.back().first, 1u);
  EXPECT_EQ(a.back().count, 1u);
}

TEST_F(TransferTest, AnnouncementsBeforePeersHelloWaitForIt) {
  tr.admitted({BlockId(3), BlockId(4)}, at(0), at(1000), out);
  accept();
  tr.layerReady({.layer = 0, .first_block = 0, .checksums = {7, 8}}, at(1), out);
  EXPECT_EQ(count(take(), Kind::kIssuePull), 0);
  tr.peerReady(kPeerBlocks, at(2), out);
  EXPECT_EQ(count(take(), Kind::kIssuePull), 1);
}

TEST_F(TransferTest, ABlockAnnouncedTwiceFailsTheTransfer) {
  admit();
  accept();
  const PullId p = announce(0);
  take();
  tr.layerReady({.layer = 0, .first_block = 1, .checksums = {8}}, at(2), out);
  EXPECT_EQ(tr.failure(), FailureReason::kTransferFailed);
  const TransferActions a = take();
  EXPECT_EQ(count(a, Kind::kCancelPull), 1);
  EXPECT_EQ(count(a, Kind::kSendAbort), 1);
  EXPECT_EQ(count(a, Kind::kEndImport), 0) << "the first pull is outstanding";
  tr.pullDone(p, absl::CancelledError(), {}, at(3), out);
  EXPECT_EQ(kinds(take()), std::vector<Kind>{Kind::kEndImport});
  EXPECT_EQ(tr.state(), TransferState::kEnded);
}

TEST_F(TransferTest, AnAnnouncementOutsideTheAcceptedBlocksFails) {
  admit();
  accept();
  tr.layerReady({.layer = 0, .first_block = 1, .checksums = {1, 2}}, at(2), out);
  EXPECT_EQ(tr.failure(), FailureReason::kTransferFailed);
  EXPECT_EQ(tr.state(), TransferState::kEnded);
}

TEST_F(TransferTest, AcceptanceWithAnotherBlockCountFails) {
  admit();
  tr.accepted({10, 11, 12}, at(900), at(1), out);
  EXPECT_EQ(tr.failure(), FailureReason::kTransferFailed);
  EXPECT_EQ(count(take(), Kind::kEndImport), 1);
}

TEST_F(TransferTest, ChecksumMismatchFails) {
  admit();
  accept();
  const PullId p0 = announce(0);
  pulled(p0, {7, 9});
  EXPECT_EQ(tr.failure(), FailureReason::kChecksumMismatch);
  EXPECT_EQ(tr.state(), TransferState::kEnded);
  EXPECT_NE(tr.failureMessage().find("layer 0 block 1"), std::string::npos) << tr.failureMessage();
}

TEST_F(TransferTest, UnverifiedTransfersNeedNoChecksums) {
  DecodeTransfer t{1, /*verify=*/false};
  t.admitted({BlockId(1)}, at(0), at(1000), out);
  t.peerReady(kPeerBlocks, at(0), out);
  t.accepted({5}, at(900), at(1), out);
  t.layerReady({.layer = 0, .first_block = 0, .checksums = {123}}, at(2), out);
  const PullId p = out.back().pull;
  t.prefillDone(1, at(2), out);
  t.pullDone(p, absl::OkStatus(), {}, at(3), out);
  EXPECT_EQ(t.state(), TransferState::kComplete);
}

TEST_F(TransferTest, AFailedPullFailsTheTransfer) {
  admit();
  accept();
  const PullId p0 = announce(0);
  tr.pullDone(p0, absl::UnavailableError("peer gone"), {}, at(3), out);
  EXPECT_EQ(tr.failure(), FailureReason::kTransferFailed);
  EXPECT_EQ(tr.state(), TransferState::kEnded);
}

TEST_F(TransferTest, DeadlineTickFailsWithPrefillTimeout) {
  admit();
  EXPECT_EQ(tr.nextDeadline(), at(1000));
  tr.tick(at(999), out);
  EXPECT_FALSE(tr.failure());
  tr.tick(at(1000), out);
  EXPECT_EQ(tr.failure(), FailureReason::kPrefillTimeout);
  EXPECT_EQ(tr.nextDeadline(), std::nullopt);
}

// The owner's work-proportional deadline once P accepted: it only ever
// moves the deadline forward, and missing it is a prefill timeout whose end
// (kEndImport) still waits for the pull in flight.
TEST_F(TransferTest, ATightenedDeadlineIsKeptAndNeverLoosened) {
  admit();
  tr.accepted({10, 11}, at(5000), at(1), out);  // lease margin far away
  tr.tightenDeadline(at(400));
  EXPECT_EQ(tr.nextDeadline(), at(400));
  tr.tightenDeadline(at(800));  // later: ignored
  EXPECT_EQ(tr.nextDeadline(), at(400));
  const PullId p0 = announce(0);
  take();
  tr.tick(at(399), out);
  EXPECT_FALSE(tr.failure());
  tr.tick(at(400), out);
  EXPECT_EQ(tr.failure(), FailureReason::kPrefillTimeout);
  EXPECT_EQ(count(out, Kind::kEndImport), 0);  // the pull is still outstanding
  EXPECT_EQ(count(out, Kind::kCancelPull), 1);
  take();
  tr.pullDone(p0, absl::CancelledError("cancelled"), {}, at(401), out);
  EXPECT_EQ(count(out, Kind::kEndImport), 1);
  EXPECT_EQ(tr.state(), TransferState::kEnded);
  tr.tightenDeadline(at(100));  // over: nothing pending any more
  EXPECT_EQ(tr.nextDeadline(), std::nullopt);
}

// A pull into device memory is checked on the engine thread after its get
// completed (pullLanded, then pullDone with the get's time): once every
// block landed and P sent PrefillDone, a deadline passing while the checks
// wait fails nothing; before that it still does.
TEST_F(TransferTest, DeadlinesDoNotFailATransferWhoseBlocksLandedAndAwaitTheirChecks) {
  admit();
  accept();  // lease margin at 900, deadline 1000
  const PullId p0 = announce(0);
  const PullId p1 = announce(1);
  tr.prefillDone(42, at(3), out);
  tr.pullLanded(p0);
  EXPECT_EQ(tr.nextDeadline(), at(900)) << "p1 has not landed: the deadlines still apply";
  tr.pullLanded(p1);
  EXPECT_EQ(tr.nextDeadline(), std::nullopt);
  tr.tick(at(1500), out);
  EXPECT_FALSE(tr.failure()) << tr.failureMessage();
  tr.pullDone(p0, absl::OkStatus(), std::vector<uint64_t>{7, 8}, at(800), out);
  tr.pullDone(p1, absl::OkStatus(), std::vector<uint64_t>{7, 8}, at(850), out);
  EXPECT_EQ(tr.state(), TransferState::kComplete);

  // Landed without PrefillDone: P has not delivered, and the deadline fails it.
  DecodeTransfer late{kLayers, true};
  TransferActions o;
  late.admitted({BlockId(3), BlockId(4)}, at(0), at(1000), o);
  late.peerReady(kPeerBlocks, at(0), o);
  late.accepted({10, 11}, at(5000), at(1), o);
  for (uint16_t layer = 0; layer < kLayers; ++layer) {
    late.layerReady({.layer = layer, .first_block = 0, .checksums = {7, 8}}, at(2), o);
    late.pullLanded(o.back().pull);
  }
  late.tick(at(1000), o);
  EXPECT_EQ(late.failure(), FailureReason::kPrefillTimeout);
}

TEST_F(TransferTest, LeaseMarginIsTheDeadlineOnceEarlier) {
  admit();
  accept();
  EXPECT_EQ(tr.nextDeadline(), at(900));
  tr.tick(at(900), out);
  EXPECT_EQ(tr.failure(), FailureReason::kLeaseExpired);
}

TEST_F(TransferTest, APullThatCompletesAfterTheLeaseIsNotTrusted) {
  admit();
  accept();
  const PullId p0 = announce(0);
  tr.pullDone(p0, absl::OkStatus(), std::vector<uint64_t>{7, 8}, at(901), out);
  EXPECT_EQ(tr.failure(), FailureReason::kLeaseExpired);
}

TEST_F(TransferTest, AnAnnouncementAtTheLeaseEndFails) {
  admit();
  accept();
  tr.layerReady({.layer = 0, .first_block = 0, .checksums = {7, 8}}, at(900), out);
  EXPECT_EQ(tr.failure(), FailureReason::kLeaseExpired);
  EXPECT_EQ(count(out, Kind::kIssuePull), 0);
}

TEST_F(TransferTest, PeersAbortEndsWithoutTellingThePeer) {
  admit();
  take();
  tr.fail(FailureReason::kCapacity, "no room", /*tell_peer=*/false, out);
  EXPECT_EQ(kinds(take()), (std::vector<Kind>{Kind::kReportFailure, Kind::kEndImport}));
}

TEST_F(TransferTest, PeerUnhealthyIsNotSentToTheDeadPeer) {
  admit();
  take();
  tr.fail(FailureReason::kPeerUnhealthy, "disconnected", /*tell_peer=*/true, out);
  EXPECT_EQ(count(take(), Kind::kSendAbort), 0);
}

TEST_F(TransferTest, AFailureIsReportedOnce) {
  admit();
  accept();
  const PullId p = announce(0);
  take();
  tr.fail(FailureReason::kCancelled, "client", true, out);
  tr.fail(FailureReason::kPrefillTimeout, "late", true, out);
  tr.tick(at(5000), out);
  EXPECT_EQ(count(out, Kind::kReportFailure), 1);
  EXPECT_EQ(tr.failure(), FailureReason::kCancelled);
  EXPECT_EQ(count(out, Kind::kEndImport), 0);
  tr.pullDone(p, absl::CancelledError(), {}, at(6), out);
  EXPECT_EQ(count(out, Kind::kEndImport), 1);
}

TEST_F(TransferTest, MessagesAfterTheEndDoNothing) {
  admit();
  tr.fail(FailureReason::kCancelled, "client", true, out);
  take();
  accept();
  tr.layerReady({.layer = 0, .first_block = 0, .checksums = {7, 8}}, at(2), out);
  tr.prefillDone(1, at(2), out);
  tr.tick(at(5000), out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(tr.state(), TransferState::kEnded);
}

TEST_F(TransferTest, FailedWhileQueuedEndsAgainOnceAdmitted) {
  tr.fail(FailureReason::kCancelled, "client", true, out);
  EXPECT_EQ(kinds(take()), (std::vector<Kind>{Kind::kReportFailure, Kind::kEndImport})) << "P never heard of it";
  tr.admitted({BlockId(1)}, at(0), at(100), out);
  EXPECT_EQ(kinds(take()), std::vector<Kind>{Kind::kEndImport});
}

TEST_F(TransferTest, CompletedTransfersIgnoreLaterFailures) {
  admit();
  accept();
  const PullId p0 = announce(0);
  const PullId p1 = announce(1);
  tr.prefillDone(1, at(2), out);
  pulled(p0);
  pulled(p1);
  take();
  tr.fail(FailureReason::kCancelled, "client", true, out);
  tr.tick(at(5000), out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(tr.state(), TransferState::kComplete);
}

// A cancel (local abort) in every state, with pulls outstanding where the
// state allows: the failure is reported once, every outstanding pull is
// cancelled, P is told if it was asked, and kEndImport comes exactly once,
// only after the last outstanding pull completed.
TEST(TransferCancelTest, CancelInEveryStateEndsOnlyAfterEveryPull) {
  struct Case {
    const char* name;
    int pulls_outstanding;  // pulls issued before the cancel (state kPulling)
    int steps;              // 0 queued, 1 requested, 2 accepted, 3 with pulls
  };
  for (const Case& c : {Case{"queued", 0, 0}, Case{"requested", 0, 1}, Case{"accepted", 0, 2}, Case{"one pull", 1, 3},
                        Case{"two pulls", 2, 3}}) {
    SCOPED_TRACE(c.name);
    DecodeTransfer tr{kLayers, true};
    TransferActions out;
    std::vector<PullId> pulls;
    if (c.steps >= 1) {
      tr.admitted({BlockId(3), BlockId(4)}, at(0), at(1000), out);
      tr.peerReady(kPeerBlocks, at(0), out);
    }
    if (c.steps >= 2) tr.accepted({10, 11}, at(900), at(1), out);
    for (int i = 0; i < c.pulls_outstanding; ++i) {
      tr.layerReady({.layer = static_cast<uint16_t>(i), .first_block = 0, .checksums = {7, 8}}, at(2), out);
      pulls.push_back(out.back().pull);
    }
    out.clear();
    tr.fail(FailureReason::kCancelled, "client went away", true, out);
    EXPECT_EQ(count(out, Kind::kReportFailure), 1);
    EXPECT_EQ(count(out, Kind::kCancelPull), c.pulls_outstanding);
    EXPECT_EQ(count(out, Kind::kSendAbort), c.steps >= 1 ? 1 : 0);
    int ends = count(out, Kind::kEndImport);
    for (PullId p : pulls) {
      EXPECT_EQ(ends, 0) << "blocks released with a pull outstanding";
      out.clear();
      tr.pullDone(p, absl::CancelledError(), {}, at(3), out);
      ends += count(out, Kind::kEndImport);
    }
    EXPECT_EQ(ends, 1);
    EXPECT_EQ(tr.state(), TransferState::kEnded);
    EXPECT_EQ(tr.numOutstanding(), 0u);
  }
}

// A pull that completed successfully after the cancel still counts as done
// (its data is discarded); the end waits for it all the same.
TEST_F(TransferTest, APullThatSucceedsAfterTheCancelStillGatesTheEnd) {
  admit();
  accept();
  const PullId p0 = announce(0);
  const PullId p1 = announce(1);
  take();
  tr.fail(FailureReason::kCancelled, "client", true, out);
  pulled(p1);
  EXPECT_EQ(count(out, Kind::kEndImport), 0);
  EXPECT_EQ(count(out, Kind::kCompleteImport), 0);
  pulled(p0);
  EXPECT_EQ(count(out, Kind::kEndImport), 1);
}

TEST_F(TransferTest, PhaseTimingsSplitHiddenAndExposedTransfer) {
  tr.admitted({BlockId(3)}, at(0), at(1000), out);
  tr.peerReady(kPeerBlocks, at(0), out);
  tr.accepted({10}, at(900), at(1), out);
  tr.layerReady({.layer = 0, .first_block = 0, .checksums = {7}}, at(10), out);
  const PullId p0 = out.back().pull;
  tr.pullDone(p0, absl::OkStatus(), std::vector<uint64_t>{7}, at(20), out);
  tr.layerReady({.layer = 1, .first_block = 0, .checksums = {8}}, at(30), out);
  const PullId p1 = out.back().pull;
  tr.prefillDone(1, at(30), out);
  tr.pullDone(p1, absl::OkStatus(), std::vector<uint64_t>{8}, at(45), out);
  ASSERT_EQ(tr.state(), TransferState::kComplete);
  const PdTimings t = *tr.timings();
  EXPECT_DOUBLE_EQ(t.prefill_ms, 30);          // asked at 0, last announcement at 30
  EXPECT_DOUBLE_EQ(t.transfer_ms, 25);         // [10, 20] and [30, 45]
  EXPECT_DOUBLE_EQ(t.transfer_hidden_ms, 10);  // only [10, 20] is before P's last announcement
}

}  // namespace
}  // namespace tandem::agent
