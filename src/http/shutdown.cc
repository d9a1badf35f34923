// Server::Impl::shutdown: drain, grace, cancel, close (the sequence server.h
// promises). Waits run on the injected clock, so a test drives the grace
// period with a FakeClock.

#include <vector>

#include "src/common/strings.h"
#include "src/http/error.h"
#include "src/http/exchange.h"
#include "src/http/server_core.h"

namespace tandem::http {

namespace {

// After the grace period, how long shutdown waits for the 503s and final
// chunks it forced to be written before closing the listener (which then
// closes whatever is left).
constexpr Duration kForcedFlushWait = std::chrono::seconds(2);

}  // namespace

void Server::Impl::shutdown(Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (draining_) {
      // Another caller runs the shutdown; wait for it.
      mu_.Await(absl::Condition(&shutdownDone_));
      return;
    }
    draining_ = true;
  }
  log_.info("shutting down", {{"port", port_}, {"in_flight", numInFlight()}, {"grace", formatSeconds(grace)}});

  // 1. Let calls in flight and open streams finish on their own.
  waitIdle(clock_.now() + grace);
  {
    // 2. No handler starts from now on; wait for the ones running (they are
    // meant to be short). After this nothing can open a new stream.
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    auto handlersDone = [this]() {
      mu_.AssertReaderHeld();
      return numRunningHandlers_ == 0;
    };
    mu_.Await(absl::Condition(&handlersDone));
  }
  // 3. Cancel what is left: close streams, answer the unanswered with 503.
  cancelRemaining();
  waitIdle(clock_.now() + kForcedFlushWait);

  // 4. Close the listener (it closes the connections still open), then the timers.
  if (listener_) listener_->close();
  timers_.stop();
  {
    absl::MutexLock lock(&mu_);
    shutdownDone_ = true;
  }
  log_.info("shut down", {{"port", port_}});
}

void Server::Impl::waitIdle(MonoTime deadline) {
  absl::MutexLock lock(&mu_);
  while (!inFlight_.empty()) {
    if (clock_.waitUntil(changed_, mu_, deadline)) break;
  }
}

void Server::Impl::cancelRemaining() {
  std::vector<std::shared_ptr<Exchange>> rest;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, weak] : inFlight_) {
      if (auto ex = weak.lock()) rest.push_back(std::move(ex));
    }
  }
  if (!rest.empty()) {
    log_.warn("cancelling calls still running at the end of the grace period", {{"count", rest.size()}});
  }
  for (const auto& ex : rest) {
    if (ex->claim(Exchange::State::kAnswered)) {
      ex->context->cancel(CancelReason::kShutdown);
      sendReply(ex, Response::error(503, kUnavailableError, "server shut down before the call finished")
                        .setHeader("Connection", "close"));
    } else if (ex->streamOpen()) {
      ex->context->cancel(CancelReason::kShutdown);
      ex->closeStream();
    }
  }
}

}  // namespace tandem::http
