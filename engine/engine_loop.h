#pragma once
// The engine's owning thread. Other threads (HTTP handlers) submit and cancel
// requests through a queue; the loop applies them between steps and steps
// while there is work. When there is none, or a step changed nothing (every
// live request waits for an import or for blocks), it sleeps until a command
// arrives or the engine's next deadline (a request's, a lease's expiry)
// passes on the engine's clock: under a FakeClock, advancing the clock wakes it. Update callbacks run on the loop's
// thread: they must be quick and must not call back into the loop's owner
// synchronously (pushing into an SSE writer is the intended use).
//
// Thread-safe: every public method may be called from any thread.

#include <atomic>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <variant>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "engine/engine.h"

namespace tandem::engine {

class EngineLoop {
 public:
  // Called on the loop thread after every step, and with currentStats() when
  // commands changed the engine and it is idle (metrics export; the
  // worker-state stream drains Engine::drainRoutableChanges() here, so every
  // change to the engine is followed by a call).
  using StepObserver = std::function<void(const StepStats&, Engine&)>;

  // Starts the thread. The engine is owned by the loop from now on; the
  // loop waits on the engine's clock.
  EngineLoop(std::unique_ptr<Engine> engine, StepObserver on_step = nullptr);
  // Cancels everything still live (finish reason kCancelled) and joins.
  ~EngineLoop();

  // Queues a request. The handle names it for cancel(); updates (including an
  // immediate rejection) arrive on the loop thread.
  uint64_t submit(RequestSpec spec, UpdateCallback on_update);
  // Ends the request with `reason` through the engine's cleanup path. Unknown
  // or finished handles are ignored.
  void cancel(uint64_t handle, FinishReason reason = FinishReason::kCancelled);
  // Runs `fn` on the loop thread between steps, without waiting (for the
  // transport's completions: completeImport, releaseLease, cancel).
  void post(std::function<void(Engine&)> fn);
  // Runs `fn` on the loop thread between steps and waits for it (for reads
  // that need the engine, e.g. invariants in tests, or dropping a session).
  void runOnLoop(std::function<void(Engine&)> fn);

  // Requests admitted or queued but not finished.
  int numLive() const;
  // True once the loop thread has stepped at least once or idled; for readiness.
  bool alive() const;
  // The backend's failure once a step saw one (Engine::backendStatus: sticky,
  // every later step fails too), for health checks; nullopt while healthy.
  std::optional<std::string> failure() const;

 private:
  struct Submit {
    uint64_t handle;
    RequestSpec spec;
    UpdateCallback on_update;
  };
  struct Cancel {
    uint64_t handle;
    FinishReason reason;
  };
  struct Call {
    std::function<void(Engine&)> fn;
    std::shared_ptr<std::promise<void>> done;
  };
  using Command = std::variant<Submit, Cancel, Call>;

  void run();
  // Takes the queued commands, first sleeping while there is nothing to do:
  // no command, and no work or only work that cannot progress (`stalled`)
  // before the engine's next deadline. Returns false when stopping.
  bool waitForCommands(bool stalled, std::deque<Command>* batch);
  void apply(Command& cmd);

  std::unique_ptr<Engine> engine_;
  const Clock& clock_;
  StepObserver on_step_;

  absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<Command> commands_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_handle_ ABSL_GUARDED_BY(mu_) = 1;
  std::atomic<int> num_live_{0};
  std::atomic<bool> alive_{false};
  mutable absl::Mutex failure_mu_;
  std::optional<std::string> failure_ ABSL_GUARDED_BY(failure_mu_);

  // Loop thread only.
  absl::flat_hash_map<uint64_t, RequestId> by_handle_;

  std::thread thread_;
};

}  // namespace tandem::engine
