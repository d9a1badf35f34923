#include "agent/worker_events_http.h"

#include <memory>

namespace tandem::agent {
namespace {

// A subscriber's messages into its SSE stream.
class SseSink final : public WorkerEventSink {
 public:
  explicit SseSink(std::shared_ptr<http::SseWriter> writer) : writer_(std::move(writer)) {}
  bool send(std::string_view message) override { return writer_->send(message); }
  size_t numUnsentBytes() const override { return writer_->numUnsentBytes(); }
  void close() override { writer_->close(); }

 private:
  const std::shared_ptr<http::SseWriter> writer_;
};

routing::WorkerRole workerRole(AgentRole role) {
  switch (role) {
    case AgentRole::kPrefill:
      return routing::WorkerRole::kPrefill;
    case AgentRole::kDecode:
      return routing::WorkerRole::kDecode;
    default:
      return routing::WorkerRole::kBoth;
  }
}

}  // namespace

http::Response serveWorkerEvents(WorkerEventsPublisher& publisher) {
  return http::Response::sse([&publisher](std::shared_ptr<http::SseWriter> writer) {
    const uint64_t id = publisher.subscribe(std::make_shared<SseSink>(writer));
    writer->context().onCancel([&publisher, id] { publisher.unsubscribe(id); });
  });
}

WorkerEventsOptions workerEventsOptions(const AgentConfig& config, const engine::Engine& engine, const Clock& clock) {
  return {.worker = config.worker,
          .role = workerRole(config.role),
          .block_size = engine.options().block_size,
          .hash_root = engine.blockHashRoot(),
          .max_context_tokens = engine.options().max_model_len,
          .initial_load = workerLoad(engine.currentStats(), false),
          .load_interval = config.events_load_interval,
          .heartbeat_interval = config.events_heartbeat,
          .max_buffered_deltas = static_cast<size_t>(config.events_buffer),
          .clock = &clock};
}

}  // namespace tandem::agent
