// The pod loop's health decisions (e2e/kubelet/pod_health.h) as pure state:
// probe schedules and verdicts with Kubernetes' thresholds, and
// CrashLoopBackOff's delays.

#include "e2e/kubelet/pod_health.h"

#include <gtest/gtest.h>

#include <vector>

namespace tandem::kubelet {
namespace {

using std::chrono::milliseconds;
using std::chrono::minutes;
using std::chrono::seconds;

MonoTime at(Duration d) { return MonoTime(d); }

TEST(ProbeTrackerTest, ReadinessNeedsItsSuccessesInARowAndIsLostAfterItsFailures) {
  ProbeTracker p(ProbeKind::kReadiness,
                 {.initial_delay = seconds(5), .period = seconds(2), .success_threshold = 2, .failure_threshold = 3},
                 at(seconds(100)));
  EXPECT_FALSE(p.ready());
  EXPECT_EQ(p.nextProbe(), at(seconds(105)));  // not before the initial delay
  EXPECT_FALSE(p.record(true, at(seconds(105)), at(seconds(105))));
  EXPECT_EQ(p.nextProbe(), at(seconds(107)));
  EXPECT_TRUE(p.record(true, at(seconds(107)), at(seconds(107))));  // two in a row: ready
  EXPECT_TRUE(p.ready());
  EXPECT_FALSE(p.record(false, at(seconds(109)), at(seconds(109))));
  EXPECT_FALSE(p.record(false, at(seconds(111)), at(seconds(111))));
  EXPECT_FALSE(p.record(true, at(seconds(113)), at(seconds(113))));  // the run of failures is broken
  EXPECT_FALSE(p.record(false, at(seconds(115)), at(seconds(115))));
  EXPECT_FALSE(p.record(false, at(seconds(117)), at(seconds(117))));
  EXPECT_TRUE(p.ready());
  EXPECT_TRUE(p.record(false, at(seconds(119)), at(seconds(119))));  // three in a row: not ready
  EXPECT_FALSE(p.ready());
  EXPECT_FALSE(p.failed());  // readiness never restarts anything
}

TEST(ProbeTrackerTest, ALateAnswerIsAFailure) {
  ProbeTracker p(ProbeKind::kReadiness, {.timeout = seconds(1)}, at(seconds(0)));
  EXPECT_FALSE(p.record(true, at(seconds(0)), at(milliseconds(1001))));
  EXPECT_FALSE(p.ready());
  EXPECT_TRUE(p.record(true, at(seconds(10)), at(milliseconds(11000))));
  EXPECT_TRUE(p.ready());
}

TEST(ProbeTrackerTest, LivenessFailsAfterItsFailuresInARowOnly) {
  ProbeTracker p(ProbeKind::kLiveness, {.period = seconds(1), .failure_threshold = 3}, at(seconds(0)));
  EXPECT_FALSE(p.failed());
  EXPECT_EQ(p.nextProbe(), at(seconds(0)));
  p.record(false, at(seconds(0)), at(seconds(0)));
  p.record(false, at(seconds(1)), at(seconds(1)));
  p.record(true, at(seconds(2)), at(seconds(2)));
  p.record(false, at(seconds(3)), at(seconds(3)));
  EXPECT_FALSE(p.record(false, at(seconds(4)), at(seconds(4))));
  EXPECT_FALSE(p.failed());
  EXPECT_TRUE(p.record(false, at(seconds(5)), at(seconds(5))));
  EXPECT_TRUE(p.failed());
  // A probe that began late sets the next one from when it began.
  EXPECT_EQ(p.nextProbe(), at(seconds(6)));
  p.record(false, at(seconds(9)), at(seconds(9)));
  EXPECT_EQ(p.nextProbe(), at(seconds(10)));
}

TEST(ProbeTrackerTest, BadSpecsAreNamedAsTheApiServerWould) {
  auto msg = [](ProbeKind k, const ProbeSpec& s) { return std::string(validateProbe(k, s).message()); };
  EXPECT_TRUE(validateProbe(ProbeKind::kReadiness, {}).ok());
  EXPECT_EQ(msg(ProbeKind::kReadiness, {.initial_delay = seconds(-1)}),
            "readinessProbe.initialDelaySeconds: must not be negative");
  EXPECT_EQ(msg(ProbeKind::kLiveness, {.period = Duration(0)}), "livenessProbe.periodSeconds: must be positive");
  EXPECT_EQ(msg(ProbeKind::kReadiness, {.timeout = Duration(0)}), "readinessProbe.timeoutSeconds: must be positive");
  EXPECT_EQ(msg(ProbeKind::kReadiness, {.success_threshold = 0}), "readinessProbe.successThreshold: must be at least 1");
  EXPECT_EQ(msg(ProbeKind::kReadiness, {.failure_threshold = 0}), "readinessProbe.failureThreshold: must be at least 1");
  EXPECT_EQ(msg(ProbeKind::kLiveness, {.success_threshold = 2}), "livenessProbe.successThreshold: must be 1");
}

TEST(RestartBackoffTest, DoublesFromTenSecondsToFiveMinutesAndStartsOverAfterTenMinutesUp) {
  RestartBackoff b;
  MonoTime t = at(seconds(0));
  std::vector<Duration> delays;
  for (int i = 0; i < 7; ++i) delays.push_back(b.onExit(t, t + seconds(1)));
  EXPECT_EQ(delays, (std::vector<Duration>{seconds(10), seconds(20), seconds(40), seconds(80), seconds(160),
                                            seconds(300), seconds(300)}));
  EXPECT_EQ(b.restartCount(), 7);
  // Up for ten minutes before it exited: back to the start.
  EXPECT_EQ(b.onExit(t, t + minutes(10)), seconds(10));
  EXPECT_EQ(b.onExit(t, t + seconds(1)), seconds(20));
  EXPECT_EQ(b.restartCount(), 9);
}

}  // namespace
}  // namespace tandem::kubelet
