#include "src/http/exchange.h"

namespace tandem::http {

Exchange::Exchange(std::shared_ptr<Server::Impl> server, std::shared_ptr<Wire> wire, uint64_t id, MonoTime deadline,
                   const Clock& clock)
    : server(std::move(server)),
      wire(std::move(wire)),
      id(id),
      context(std::make_shared<CallContext>(deadline)),
      clock_(clock) {}

bool Exchange::claim(State next) {
  absl::MutexLock lock(&mu_);
  if (state_ != State::kPending) return false;
  state_ = next;
  if (next == State::kStreaming) lastWrite_ = clock_.now();
  return true;
}

bool Exchange::pending() const {
  absl::MutexLock lock(&mu_);
  return state_ == State::kPending;
}

bool Exchange::streamOpen() const {
  absl::MutexLock lock(&mu_);
  return state_ == State::kStreaming && !streamClosed_;
}

bool Exchange::write(std::string_view bytes) {
  absl::MutexLock lock(&mu_);
  if (state_ != State::kStreaming || streamClosed_ || context->cancelled()) return false;
  if (!wire->writeStream(bytes)) return false;
  lastWrite_ = clock_.now();
  return true;
}

void Exchange::closeStream() {
  absl::MutexLock lock(&mu_);
  if (state_ != State::kStreaming || streamClosed_) return;
  streamClosed_ = true;
  wire->closeStream();
}

std::optional<MonoTime> Exchange::keepaliveDue(Duration interval) const {
  absl::MutexLock lock(&mu_);
  if (state_ != State::kStreaming || streamClosed_) return std::nullopt;
  return lastWrite_ + interval;
}

}  // namespace tandem::http
