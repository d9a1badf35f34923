#pragma once
// Server::Impl: what every HTTP library behind server.h shares. The listener
// (listener.h) brings requests in as Wires; the core tracks them, answers
// what server.h promises before a handler runs, calls the handler, enforces
// deadlines and keepalives on the injected clock, and runs shutdown.
// Internal to src/http.
//
// Locking: mu_ guards the tables below. Nothing calls a Wire, a handler or a
// CallContext callback while holding it, and an Exchange is never destroyed
// under it (its last reference may hold the last reference to a Wire).

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "src/common/clock.h"
#include "src/common/log.h"
#include "src/http/listener.h"
#include "src/http/server.h"
#include "src/http/timer_queue.h"

namespace tandem::http {

class Exchange;

// "2.5s": durations in log lines and error messages.
std::string formatSeconds(Duration d);

class Server::Impl : public std::enable_shared_from_this<Server::Impl> {
 public:
  // `options.clock` must be set (Server::start fills in the default).
  Impl(ServerOptions options, Routes routes);
  ~Impl();

  // Opens the listener of options().implementation; the server is live after it.
  absl::Status open();
  void shutdown(Duration grace);

  int port() const { return port_; }
  const ServerOptions& options() const { return options_; }
  bool draining() const;
  size_t numInFlight() const;

  // A request whose headers arrived (the listener's sink).
  void onRequest(std::shared_ptr<Wire> wire);
  // Sends a complete response if nobody answered yet; false otherwise.
  bool answer(const std::shared_ptr<Exchange>& ex, const Response& response);
  bool answerError(const std::shared_ptr<Exchange>& ex, int status, std::string_view message);
  // Opens an event stream (a handler's Response::sse, or a deferred call
  // answered with one); false when the call was answered already
  // (deadline, shutdown): the stream never starts.
  bool openStream(const std::shared_ptr<Exchange>& ex, const Response& response);

 private:
  void onBody(const std::shared_ptr<Exchange>& ex, BodyRead read);
  void dispatch(const std::shared_ptr<Exchange>& ex, std::string body);
  Response callHandler(const Handler& handler, Request& request);
  void deliver(const std::shared_ptr<Exchange>& ex, Response response);
  void sendReply(const std::shared_ptr<Exchange>& ex, const Response& response);
  // The Wire finished the response (ok) or failed.
  void onSent(const std::shared_ptr<Exchange>& ex, bool ok);
  void finish(Exchange& ex);

  bool enterHandler();
  void leaveHandler();

  void scheduleDeadline(const std::shared_ptr<Exchange>& ex);
  void onDeadline(const std::shared_ptr<Exchange>& ex);
  void scheduleKeepalive(const std::shared_ptr<Exchange>& ex, MonoTime when);
  void onKeepalive(const std::shared_ptr<Exchange>& ex);

  // Shutdown's steps (shutdown.cc).
  void waitIdle(MonoTime deadline);
  void cancelRemaining();

  const ServerOptions options_;
  const Clock& clock_;
  const Routes routes_;
  const Logger log_{"http"};
  TimerQueue timers_;
  std::unique_ptr<Listener> listener_;
  int port_ = 0;

  mutable absl::Mutex mu_;
  absl::CondVar changed_;                       // inFlight_ shrank
  bool draining_ ABSL_GUARDED_BY(mu_) = false;  // new requests get 503
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;   // no more handler calls
  bool shutdownDone_ ABSL_GUARDED_BY(mu_) = false;
  int numRunningHandlers_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t nextId_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::weak_ptr<Exchange>> inFlight_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::http
