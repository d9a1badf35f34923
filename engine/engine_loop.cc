#include "engine/engine_loop.h"

#include <future>

namespace tandem::engine {

EngineLoop::EngineLoop(std::unique_ptr<Engine> engine, StepObserver on_step)
    : engine_(std::move(engine)), on_step_(std::move(on_step)) {
  thread_ = std::thread([this] { run(); });
}

EngineLoop::~EngineLoop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t EngineLoop::submit(RequestSpec spec, UpdateCallback on_update) {
  uint64_t handle;
  {
    std::lock_guard lock(mu_);
    handle = next_handle_++;
    commands_.push_back(Submit{handle, std::move(spec), std::move(on_update)});
  }
  num_live_.fetch_add(1);
  cv_.notify_all();
  return handle;
}

void EngineLoop::cancel(uint64_t handle, FinishReason reason) {
  {
    std::lock_guard lock(mu_);
    commands_.push_back(Cancel{handle, reason});
  }
  cv_.notify_all();
}

void EngineLoop::post(std::function<void(Engine&)> fn) {
  {
    std::lock_guard lock(mu_);
    commands_.push_back(Call{std::move(fn), nullptr});
  }
  cv_.notify_all();
}

void EngineLoop::runOnLoop(std::function<void(Engine&)> fn) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> f = done->get_future();
  {
    std::lock_guard lock(mu_);
    commands_.push_back(Call{std::move(fn), done});
  }
  cv_.notify_all();
  f.wait();
}

int EngineLoop::numLive() const { return num_live_.load(); }
bool EngineLoop::alive() const { return alive_.load(); }

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

void EngineLoop::run() {
  bool stalled = false;
  for (;;) {
    std::deque<Command> batch;
    {
      std::unique_lock lock(mu_);
      alive_.store(true);
      auto ready = [&] { return stop_ || !commands_.empty() || (engine_->hasWork() && !stalled); };
      if (stalled) {
        // The last step had nothing to compute (every live request waits on
        // an import or for blocks): sleep until a command arrives instead of
        // spinning, but wake up now and then for deadlines.
        cv_.wait_for(lock, std::chrono::milliseconds(5), ready);
      } else if (engine_->numLeases() > 0) {
        // Leases expire by the clock, with no command to wake us: poll.
        cv_.wait_for(lock, std::chrono::milliseconds(20), ready);
      } else {
        cv_.wait(lock, ready);
      }
      if (stop_) break;
      batch.swap(commands_);
    }
    for (Command& cmd : batch) apply(cmd);
    if (!engine_->hasWork() && engine_->expireLeases() > 0 && on_step_) on_step_(engine_->currentStats(), *engine_);
    stalled = false;
    if (engine_->hasWork()) {
      StepStats st = engine_->step();
      stalled = st.num_scheduled_tokens == 0;
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
    std::lock_guard lock(mu_);
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
