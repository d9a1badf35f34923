#pragma once
// The handles a handler gets for answering later: SseWriter and Responder
// (server.h), both thin views of one Exchange. Internal to src/http.

#include <atomic>
#include <memory>
#include <string_view>

#include "src/http/exchange.h"
#include "src/http/server.h"

namespace tandem::http {

// Dropping the last reference closes the stream.
class SseWriterImpl final : public SseWriter {
 public:
  explicit SseWriterImpl(std::shared_ptr<Exchange> ex) : ex_(std::move(ex)) {}
  ~SseWriterImpl() override { ex_->closeStream(); }

  bool send(std::string_view data) override;
  bool sendEvent(const SseEvent& event) override;
  bool sendRaw(std::string_view bytes) override { return ex_->write(bytes); }
  size_t numUnsentBytes() const override { return ex_->numUnsentBytes(); }
  void close() override { ex_->closeStream(); }
  CallContext& context() override { return *ex_->context; }

 private:
  const std::shared_ptr<Exchange> ex_;
};

// Dropping the last reference without responding sends 500.
class ResponderImpl final : public Responder {
 public:
  explicit ResponderImpl(std::shared_ptr<Exchange> ex) : ex_(std::move(ex)) {}
  ~ResponderImpl() override;

  bool respond(Response response) override;
  CallContext& context() override { return *ex_->context; }

 private:
  const std::shared_ptr<Exchange> ex_;
  std::atomic<bool> responded_{false};
};

}  // namespace tandem::http
