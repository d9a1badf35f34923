#pragma once
// Leader election on a coordination.k8s.io/v1 Lease, with client-go's
// semantics and defaults.
//
// Lease spec: holderIdentity, leaseDurationSeconds, acquireTime, renewTime
// (metav1.MicroTime), leaseTransitions.
//
// One attempt (tryAcquireOrRenew):
//  1. GET the lease; 404 → create it holding it ourselves (409 = lost the race).
//  2. When the record differs from the one we saw last, remember it and the
//     *local* time we saw it (observedTime). Clocks of other candidates are
//     never compared with ours.
//  3. Someone else holds it and observedTime + leaseDuration has not passed →
//     not ours.
//  4. Else PUT the record with the resourceVersion we read (optimistic
//     concurrency; 409 = someone else wrote first): renewTime = now; when
//     taking over, acquireTime = now and leaseTransitions + 1.
//
// A leader counts itself leader only until lastRenew + renewDeadline, where
// lastRenew is the local time *before* the successful renewal was sent.
// Another candidate can take over no earlier than its observation of that
// renewal (which is later) + leaseDuration; since renewDeadline <
// leaseDuration there are never two leaders on one clock.
// stop() releases the lease (empty holder, leaseDurationSeconds 1) so a
// successor takes over at once.
//
// Driving it: run() loops tick() every retryPeriod on a thread; tests call
// tick() themselves with a FakeClock.
//
// Thread-safety: tick() and run() from one thread; isLeader(), leader() and
// stop() from any thread.

#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "src/common/clock.h"
#include "src/k8s/client.h"

namespace tandem::k8s {

struct LeaderElectionOptions {
  std::string leaseNamespace;
  std::string leaseName;
  std::string identity;  // unique per candidate, e.g. the pod name
  Duration leaseDuration = std::chrono::seconds(15);
  Duration renewDeadline = std::chrono::seconds(10);
  Duration retryPeriod = std::chrono::seconds(2);
  const Clock* clock = nullptr;  // not owned; default SystemClock::instance()
  // Called on the electing thread when leadership starts / ends.
  std::function<void()> onStartedLeading;
  std::function<void()> onStoppedLeading;
  // Called when the observed holder changes (may be "").
  std::function<void(const std::string& identity)> onNewLeader;
  bool releaseOnStop = true;
};

class LeaderElector {
 public:
  // InvalidArgument unless leaseDuration > renewDeadline > retryPeriod > 0
  // and name, namespace and identity are set. `client` must outlive it.
  static absl::StatusOr<std::unique_ptr<LeaderElector>> create(Client& client, LeaderElectionOptions options);
  ~LeaderElector();

  // One acquire-or-renew attempt, and the leadership bookkeeping around it.
  // Returns the attempt's error (a lost race is not an error).
  absl::Status tick();
  // Blocks: tick() every retryPeriod until stop(); releases if leader.
  void run();
  // Ends run(), releasing the lease if we hold it. Idempotent.
  void stop();
  // Gives up leadership now (writes an empty holder if we hold the lease).
  absl::Status release();

  // True while leader and within renewDeadline of the last renewal.
  bool isLeader() const;
  // The holder we last observed.
  std::string leader() const;
  const std::string& identity() const { return options_.identity; }

 private:
  LeaderElector(Client& client, LeaderElectionOptions options);
  // True if we hold the lease after this attempt.
  absl::StatusOr<bool> tryAcquireOrRenew();
  nlohmann::json spec(const std::string& acquireTime, int64_t transitions) const;
  void setLeading(bool leading, MonoTime renewedAt);

  Client& client_;
  const LeaderElectionOptions options_;
  const Clock& clock_;
  absl::Notification stopping_;

  mutable absl::Mutex mu_;
  bool leading_ ABSL_GUARDED_BY(mu_) = false;
  MonoTime lastRenew_ ABSL_GUARDED_BY(mu_);
  std::string observedHolder_ ABSL_GUARDED_BY(mu_);
  // Electing thread only:
  nlohmann::json observedSpec_;
  MonoTime observedTime_;
  bool released_ = false;
};

}  // namespace tandem::k8s
