#pragma once
// Where a decode agent finds its prefill agents: a static list (the
// --prefill-peers flag) or discovery's (--prefill-service). Thread-safe:
// implementations answer from any thread.

#include <mutex>
#include <string>
#include <vector>

namespace tandem::agent {

// A prefill agent's KV listener.
struct PeerAddress {
  std::string host;
  int port = 0;
  // "HOST:PORT": how requests (x-tandem-prefill-peer), logs and traces name it.
  std::string name() const { return host + ":" + std::to_string(port); }
};

class PeerDirectory {
 public:
  virtual ~PeerDirectory() = default;
  // The prefill agents of this decode agent's pool, in the operator's
  // order (D's own choice breaks ties by it).
  virtual std::vector<PeerAddress> prefillPeers() const = 0;
  // Whether the list changes while the agent runs (discovery): D then
  // follows it and may start with none.
  virtual bool dynamic() const { return false; }
};

// A fixed list, as configured.
class StaticPeerDirectory final : public PeerDirectory {
 public:
  explicit StaticPeerDirectory(std::vector<PeerAddress> peers) : peers_(std::move(peers)) {}
  std::vector<PeerAddress> prefillPeers() const override { return peers_; }

 private:
  const std::vector<PeerAddress> peers_;
};

// Kept current by discovery (agent/discovery.h): set() from any thread.
class DynamicPeerDirectory final : public PeerDirectory {
 public:
  std::vector<PeerAddress> prefillPeers() const override {
    std::lock_guard l(mu_);
    return peers_;
  }
  bool dynamic() const override { return true; }
  void set(std::vector<PeerAddress> peers) {
    std::lock_guard l(mu_);
    peers_ = std::move(peers);
  }

 private:
  mutable std::mutex mu_;
  std::vector<PeerAddress> peers_;
};

}  // namespace tandem::agent
