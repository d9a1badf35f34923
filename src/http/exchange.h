#pragma once
// One request/response exchange, from the request's headers until the
// response (or stream) has been written or failed: the "exactly one
// responder" state machine. Internal to src/http.
//
//   kPending ──claim(kAnswered)──▶ kAnswered     a complete response went to the Wire
//       │
//       └────claim(kStreaming)─▶ kStreaming ──closeStream()──▶ (stream closed)
//
// Whoever claims first answers: the handler (through a Responder), the
// deadline (504), shutdown (503), an early error (413, 503). Every other
// claimer gets false and sends nothing. Thread-safe.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "src/common/clock.h"
#include "src/http/server.h"
#include "src/http/timer_queue.h"
#include "src/http/wire.h"

namespace tandem::http {

class Exchange {
 public:
  enum class State {
    kPending,    // nothing sent yet: whoever claims it answers
    kAnswered,   // a complete response was handed to the Wire
    kStreaming,  // an event stream is open (or was; see streamClosed_)
  };

  Exchange(std::shared_ptr<Server::Impl> server, std::shared_ptr<Wire> wire, uint64_t id, MonoTime deadline,
           const Clock& clock);

  const std::shared_ptr<Server::Impl> server;  // outlives every exchange
  const std::shared_ptr<Wire> wire;
  const uint64_t id;  // 0: not tracked (rejected while draining)
  const std::shared_ptr<CallContext> context;
  // This exchange's deadline in the server's timer queue (0: none); guarded
  // by the server's mutex. Cancelled when the exchange finishes, so finished
  // exchanges do not linger in the queue until their deadline.
  TimerQueue::Id deadlineTimer = 0;

  // Moves kPending -> `next`; true for exactly one caller.
  bool claim(State next);
  bool pending() const;
  bool streamOpen() const;

  // Writes bytes to the open stream (one chunk, pushed now). False once the
  // stream is closed or the call cancelled.
  bool write(std::string_view bytes);
  size_t numUnsentBytes() const { return wire->numUnsentBytes(); }
  // Ends the stream: the Wire sends what is queued, then the last chunk.
  void closeStream();
  // When an idle stream should next get a keepalive; nullopt once closed.
  std::optional<MonoTime> keepaliveDue(Duration interval) const;

 private:
  const Clock& clock_;
  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kPending;
  bool streamClosed_ ABSL_GUARDED_BY(mu_) = false;
  MonoTime lastWrite_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::http
