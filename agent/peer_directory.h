#pragma once
// Where a decode agent finds its prefill agents. Today a static list (the
// --prefill-peers flag); the operator's discovery will implement the same
// interface. Thread-safe: implementations answer from any thread.

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
};

// A fixed list, as configured.
class StaticPeerDirectory final : public PeerDirectory {
 public:
  explicit StaticPeerDirectory(std::vector<PeerAddress> peers) : peers_(std::move(peers)) {}
  std::vector<PeerAddress> prefillPeers() const override { return peers_; }

 private:
  const std::vector<PeerAddress> peers_;
};

}  // namespace tandem::agent
