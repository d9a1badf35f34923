#pragma once
// The engine's owning thread. Other threads (HTTP handlers) submit and cancel
// requests through a queue; the loop applies them between steps and steps
// while there is work, sleeping otherwise. Update callbacks run on the loop's
// thread: they must be quick and must not call back into the loop's owner
// synchronously (pushing into an SSE writer is the intended use).
//
// Thread-safe: every public method may be called from any thread.

#include <atomic>
#include <condition_variable>
#include <future>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <variant>

#include "absl/container/flat_hash_map.h"
#include "engine/engine.h"

namespace tandem::engine {

class EngineLoop {
 public:
  // Called on the loop thread after every step, and with currentStats() when
  // commands changed the engine and it is idle (metrics export).
  using StepObserver = std::function<void(const StepStats&, const Engine&)>;

  // Starts the thread. The engine is owned by the loop from now on.
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
  void apply(Command& cmd);

  std::unique_ptr<Engine> engine_;
  StepObserver on_step_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Command> commands_;  // guarded by mu_
  bool stop_ = false;             // guarded by mu_
  uint64_t next_handle_ = 1;      // guarded by mu_
  std::atomic<int> num_live_{0};
  std::atomic<bool> alive_{false};

  // Loop thread only.
  absl::flat_hash_map<uint64_t, RequestId> by_handle_;

  std::thread thread_;
};

}  // namespace tandem::engine
