#pragma once
// Fault injection for chaos tests: which faults are on (FaultOptions, set at
// start or at run time through the control API below), the draw per
// request, and the answers the slow fault holds back.
//
// Control API (not part of Kubernetes; served under /tandem/):
//   GET  /tandem/faults   the FaultOptions in force, as JSON
//   PUT  /tandem/faults   replace them: {"conflictRate":0.5,"errorRate":0,"slowRate":0,
//                         "slowDelayMs":0,"watchDropAfterMs":0}; open watches then end
//                         within watchDropAfterMs
//   POST /tandem/compact  drop the watch history: older resourceVersions get 410
//
// A slow answer is not a sleeping thread: the answer waits in DelayedReplies
// until the Router's timer thread sees the clock reach its time.
//
// Not thread-safe: runs under the Router's mutex.

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "e2e/apiserver/api_server.h"
#include "src/common/clock.h"
#include "src/http/server.h"

namespace tandem::apiserver {

class Store;
class WatchHub;

class FaultInjector {
 public:
  FaultInjector(FaultOptions options, uint64_t seed) : options_(options), rng_(seed) {}

  const FaultOptions& options() const { return options_; }
  void set(const FaultOptions& options) { options_ = options; }
  // Throws the failure this request draws, if any: 500 InternalError (any
  // request) or, for PUT and PATCH, 409 Conflict naming the object.
  void maybeFail(const std::string& method, const std::string& resource, const std::string& group,
                 const std::string& name);
  // How long to hold this answer back: slowDelay when the request draws the
  // slow fault, else zero. Watches are never slowed.
  Duration delayFor(bool watch);

 private:
  bool draw(double rate);

  FaultOptions options_;
  std::mt19937_64 rng_;
};

// Answers held back by the slow fault, in order of when they are due.
class DelayedReplies {
 public:
  using Reply = std::pair<std::shared_ptr<http::Responder>, http::Response>;

  void add(MonoTime due, std::shared_ptr<http::Responder> responder, http::Response response);
  // When the next one is due; MonoTime::max() when none waits.
  MonoTime nextDeadline() const;
  // Removes and returns the replies due at `now` (every one for
  // MonoTime::max()). Respond outside the Router's mutex.
  std::vector<Reply> takeDue(MonoTime now);

 private:
  std::multimap<MonoTime, Reply> byDue_;
};

// The control API above. `now`: when a changed watchDropAfter counts from.
http::Response faultControl(const http::Request& req, FaultInjector& faults, WatchHub& watches, Store& store,
                            MonoTime now);

}  // namespace tandem::apiserver
