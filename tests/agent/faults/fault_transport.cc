#include "tests/agent/faults/fault_transport.h"

#include <atomic>
#include <set>
#include <unordered_map>

#include "absl/synchronization/mutex.h"
#include "src/common/log.h"
#include "src/kvproto/kvproto.h"
#include "tests/agent/faults/delayed_runner.h"

namespace tandem::agent::testing {
namespace {

using transport::ConnId;
using transport::GetId;
using transport::KvTransport;

// State the wrapped callbacks share with the transport; they exist before
// the inner transport does.
struct Shared {
  Shared(FaultOptions o, const Clock& c) : options(o), clock(c), runner(c) {}
  const FaultOptions options;
  const Clock& clock;
  DelayedRunner runner;
  Logger log{"faults"};
  std::atomic<int> failed_transfers{0};
  // P: the transfers (connection, id) whose announcements are dropped.
  absl::Mutex stall_mu;
  std::set<std::pair<ConnId, uint64_t>> stalled ABSL_GUARDED_BY(stall_mu);
  int num_stalled ABSL_GUARDED_BY(stall_mu) = 0;
  absl::Mutex mu;
  KvTransport* inner ABSL_GUARDED_BY(mu) = nullptr;  // set once started

  KvTransport& waitForInner() {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](KvTransport** t) { return *t != nullptr; }, &inner));
    return *inner;
  }

  // P: answers one of the first N PrefillRequests with an Abort. True if it did.
  bool failTransfer(ConnId conn, const std::vector<uint8_t>& bytes) {
    if (options.fail_first_transfers == 0) return false;
    auto m = kvproto::decode(bytes, {.max_tokens = 1u << 22});
    if (!m.ok() || !std::holds_alternative<kvproto::PrefillRequest>(m->body)) return false;
    if (failed_transfers.fetch_add(1) >= options.fail_first_transfers) return false;
    waitForInner().send(
        conn,
        kvproto::encode({m->transfer_id, kvproto::Abort{kvproto::FailureReason::kTransferFailed, "injected failure"}}));
    return true;
  }

  // P: whether `bytes` (going out on `conn`) is dropped: an announcement of
  // a stalled transfer. The first N PrefillAccepted stall their transfers.
  bool stallTransfer(ConnId conn, const std::vector<uint8_t>& bytes) {
    if (options.stall_first_transfers == 0) return false;
    auto m = kvproto::decode(bytes);
    if (!m.ok()) return false;
    absl::MutexLock lock(&stall_mu);
    const std::pair<ConnId, uint64_t> key{conn, m->transfer_id};
    if (std::holds_alternative<kvproto::PrefillAccepted>(m->body)) {
      if (num_stalled >= options.stall_first_transfers) return false;
      ++num_stalled;
      stalled.insert(key);
      log.warn("stalling a transfer: its layers and its end will never be sent", {{"transfer", m->transfer_id}});
      return false;
    }
    const bool announcement =
        std::holds_alternative<kvproto::LayerReady>(m->body) || std::holds_alternative<kvproto::PrefillDone>(m->body);
    return announcement && stalled.contains(key);
  }
};

class FaultTransport final : public KvTransport {
 public:
  FaultTransport(std::shared_ptr<Shared> shared, std::unique_ptr<KvTransport> inner)
      : shared_(std::move(shared)), inner_(std::move(inner)) {}
  ~FaultTransport() override { shutdown(); }

  void shutdown() override {
    if (closing_.exchange(true)) return;
    // The inner transport completes its gets (held completions go to the
    // runner), then the runner hands on everything still held at once:
    // no callback runs after this returns.
    inner_->shutdown();
    shared_->runner.stop();
  }

  int port() const override { return inner_->port(); }
  uint64_t regionBase() const override { return inner_->regionBase(); }
  const std::string& packedRkey() const override { return inner_->packedRkey(); }
  ConnId connect(const std::string& host, int port) override { return inner_->connect(host, port); }
  std::string peerAddress(ConnId conn) const override { return inner_->peerAddress(conn); }
  void setRemoteRegion(ConnId conn, uint64_t base, uint64_t length, std::string rkey) override {
    inner_->setRemoteRegion(conn, base, length, std::move(rkey));
  }
  void close(ConnId conn) override { inner_->close(conn); }
  uint64_t ucxGetsIssued() const override { return inner_->ucxGetsIssued(); }

  void send(ConnId conn, std::vector<uint8_t> bytes) override {
    if (shared_->stallTransfer(conn, bytes)) return;
    if (shared_->options.layer_delay.count() > 0 && isLayerReady(bytes)) {
      shared_->runner.at(shared_->clock.now() + shared_->options.layer_delay,
                         [this, conn, bytes = std::move(bytes)]() mutable {
                           if (!closing_.load()) inner_->send(conn, std::move(bytes));
                         });
      return;
    }
    inner_->send(conn, std::move(bytes));
  }

  GetId getv(ConnId conn, std::vector<Segment> segments, std::function<void(absl::Status)> done) override {
    absl::MutexLock lock(&mu_);
    const GetId id = next_get_++;
    gets_[id].done = std::move(done);
    if (shared_->options.get_delay.count() == 0) {
      issueLocked(id, conn, std::move(segments));
    } else {
      shared_->runner.at(
          shared_->clock.now() + shared_->options.get_delay,
          [this, id, conn, segments = std::move(segments)]() mutable { issue(id, conn, std::move(segments)); });
    }
    return id;
  }

  void cancelGet(GetId id) override {
    absl::MutexLock lock(&mu_);
    auto it = gets_.find(id);
    if (it == gets_.end()) return;
    if (it->second.issued) return inner_->cancelGet(it->second.inner);
    // Not issued yet: it completes cancelled, on the runner (never inline).
    it->second.cancelled = true;
    shared_->runner.at(shared_->clock.now(), [this, id] { issue(id, 0, {}); });
  }

 private:
  struct Get {
    std::function<void(absl::Status)> done;
    GetId inner = 0;
    bool issued = false;
    bool cancelled = false;
  };

  static bool isLayerReady(const std::vector<uint8_t>& bytes) {
    auto m = kvproto::decode(bytes);
    return m.ok() && std::holds_alternative<kvproto::LayerReady>(m->body);
  }

  // Issues a delayed get, or completes it cancelled when it was cancelled
  // meanwhile or the transport is closing.
  void issue(GetId id, ConnId conn, std::vector<Segment> segments) {
    std::function<void(absl::Status)> done;
    {
      absl::MutexLock lock(&mu_);
      auto it = gets_.find(id);
      if (it == gets_.end() || it->second.issued) return;
      if (!it->second.cancelled && !closing_.load()) return issueLocked(id, conn, std::move(segments));
      done = std::move(it->second.done);
      gets_.erase(it);
    }
    done(absl::CancelledError("the get was cancelled before it was issued"));
  }

  void issueLocked(GetId id, ConnId conn, std::vector<Segment> segments) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Get& g = gets_[id];
    g.issued = true;
    // The inner completion takes mu_, which we hold: it runs after this records the id.
    g.inner = inner_->getv(conn, std::move(segments), [this, id](absl::Status s) { completed(id, std::move(s)); });
  }

  // The inner get completed: hand it on, late under get_complete_delay.
  void completed(GetId id, absl::Status s) {
    const Duration delay = shared_->options.get_complete_delay;
    if (delay.count() == 0) return finish(id, std::move(s));
    shared_->log.warn("held a get completion",
                      {{"get", id}, {"ms", std::chrono::duration_cast<std::chrono::milliseconds>(delay).count()}});
    shared_->runner.at(shared_->clock.now() + delay,
                       [this, id, s = std::move(s)]() mutable { finish(id, std::move(s)); });
  }

  void finish(GetId id, absl::Status s) {
    std::function<void(absl::Status)> done;
    {
      absl::MutexLock lock(&mu_);
      auto it = gets_.find(id);
      if (it == gets_.end()) return;
      done = std::move(it->second.done);
      gets_.erase(it);
    }
    done(std::move(s));
  }

  std::shared_ptr<Shared> shared_;
  std::unique_ptr<KvTransport> inner_;
  std::atomic<bool> closing_{false};
  absl::Mutex mu_;
  std::unordered_map<GetId, Get> gets_ ABSL_GUARDED_BY(mu_);
  GetId next_get_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace

transport::KvTransportFactory faultInjectingTransport(FaultOptions options, const Clock& clock,
                                                      transport::KvTransportFactory inner) {
  return [options, &clock, inner = std::move(inner)](
             const transport::TransportOptions& to,
             transport::TransportCallbacks cb) -> absl::StatusOr<std::unique_ptr<KvTransport>> {
    auto shared = std::make_shared<Shared>(options, clock);
    transport::TransportCallbacks wrapped = cb;
    wrapped.on_message = [shared, on_message = std::move(cb.on_message)](ConnId c, std::vector<uint8_t> bytes) {
      if (shared->failTransfer(c, bytes)) return;
      if (on_message) on_message(c, std::move(bytes));
    };
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<KvTransport> t, inner(to, std::move(wrapped)));
    {
      absl::MutexLock lock(&shared->mu);
      shared->inner = t.get();
    }
    return std::unique_ptr<KvTransport>(std::make_unique<FaultTransport>(std::move(shared), std::move(t)));
  };
}

}  // namespace tandem::agent::testing
