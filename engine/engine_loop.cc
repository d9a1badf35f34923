#include "engine/engine_loop.h"
#include "src/common/thread_name.h"

#include <future>

namespace tandem::engine {

EngineLoop::EngineLoop(std::unique_ptr<Engine> engine, StepObserver on_step)
    : engine_(std::move(engine)), clock_(engine_->clock()), on_step_(std::move(on_step)) {
  thread_ = std::thread([this] {
    nameThisThread("engine-loop");
    run();
  });
}

EngineLoop::~EngineLoop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

uint64_t EngineLoop::submit(RequestSpec spec, UpdateCallback on_update) {
  uint64_t handle;
  {
    absl::MutexLock lock(&mu_);
    handle = next_handle_++;
    commands_.push_back(Submit{handle, std::move(spec), std::move(on_update)});
  }
  num_live_.fetch_add(1);
  cv_.SignalAll();
  return handle;
}

void EngineLoop::cancel(uint64_t handle, FinishReason reason) {
  {
    absl::MutexLock lock(&mu_);
    commands_.push_back(Cancel{handle, reason});
  }
  cv_.SignalAll();
}

void EngineLoop::post(std::function<void(Engine&)> fn) {
  {
    absl::MutexLock lock(&mu_);
    commands_.push_back(Call{std::move(fn), nullptr});
  }
  cv_.SignalAll();
}

void EngineLoop::runOnLoop(std::function<void(Engine&)> fn) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> f = done->get_future();
  {
    absl::MutexLock lock(&mu_);
    commands_.push_back(Call{std::move(fn), done});
  }
  cv_.SignalAll();
  f.wait();
}

int EngineLoop::numLive() const { return num_live_.load(); }
bool EngineLoop::alive() const { return alive_.load(); }

std::optional<std::string> EngineLoop::failure() const {
  absl::MutexLock lock(&failure_mu_);
  return failure_;
}

void EngineLoop::apply(Command& cmd) {
  if (auto* s = std::get_if<Submit>(&cmd)) {
    uint64_t handle = s->handle;
    UpdateCallback user = std::move(s->on_update);
    // The wrapper forgets the handle when the request finishes, whatever the path.
    UpdateCallback wrapped = [this, handle, user = std::move(user)](const RequestUpdate& u) {
      if (u.finished) {
        by_handle_.erase(handle);
        num_live_.fetch_sub(1);
      }
      if (user) user(u);
    };
    // Register before adding: a rejection finishes inside addRequest.
    by_handle_[handle] = RequestId(0);
    RequestId id = engine_->addRequest(std::move(s->spec), std::move(wrapped));
    if (auto it = by_handle_.find(handle); it != by_handle_.end()) it->second = id;
  } else if (auto* c = std::get_if<Cancel>(&cmd)) {
    if (auto it = by_handle_.find(c->handle); it != by_handle_.end()) engine_->cancel(it->second, c->reason);
  } else if (auto* call = std::get_if<Call>(&cmd)) {
    call->fn(*engine_);
    if (call->done) call->done->set_value();
  }
}

bool EngineLoop::waitForCommands(bool stalled, std::deque<Command>* batch) {
  absl::MutexLock lock(&mu_);
  alive_.store(true);
  while (!stop_ && commands_.empty() && (stalled || !engine_->hasWork())) {
    // The engine is touched only by this thread, which holds no other lock.
    if (clock_.waitUntil(cv_, mu_, engine_->nextDeadline().value_or(MonoTime::max()))) break;
  }
  if (stop_) return false;
  batch->swap(commands_);
  return true;
}

void EngineLoop::run() {
  bool stalled = false;
  for (;;) {
    std::deque<Command> batch;
    if (!waitForCommands(stalled, &batch)) break;
    for (Command& cmd : batch) apply(cmd);
    if (!engine_->hasWork() && engine_->expireLeases() > 0 && on_step_) on_step_(engine_->currentStats(), *engine_);
    stalled = false;
    if (engine_->hasWork()) {
      StepStats st = engine_->step();
      stalled = !st.progressed;
      if (const absl::Status backend = engine_->backendStatus(); !backend.ok()) {
        absl::MutexLock lock(&failure_mu_);
        if (!failure_) failure_ = std::string(backend.message());
      }
      if (on_step_) on_step_(st, *engine_);
    } else if (on_step_ && !batch.empty()) {
      // Commands changed state and no step follows (e.g. the last request was
      // cancelled): let the observer see the idle state.
      on_step_(engine_->currentStats(), *engine_);
    }
  }
  // Shutdown: queued submissions are cancelled too, so every caller hears back once.
  std::deque<Command> rest;
  {
    absl::MutexLock lock(&mu_);
    rest.swap(commands_);
  }
  for (Command& cmd : rest) apply(cmd);
  std::vector<uint64_t> handles;
  for (const auto& [h, id] : by_handle_) handles.push_back(h);
  for (uint64_t h : handles) {
    if (auto it = by_handle_.find(h); it != by_handle_.end()) engine_->cancel(it->second, FinishReason::kCancelled);
  }
}

}  // namespace tandem::engine
