#include "agent/prefill_peers.h"

namespace tandem::agent {

PrefillPeers::PrefillPeers(const std::vector<PeerAddress>& addresses, const PeerHealthOptions& health,
                           const Clock& clock) {
  peers_.reserve(addresses.size());
  for (const PeerAddress& a : addresses) {
    Peer& p = peers_.emplace_back();
    p.address = a;
    p.name = a.name();
    p.health = std::make_unique<PeerHealth>(health, clock);
  }
}

std::optional<size_t> PrefillPeers::find(std::string_view name) const {
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (peers_[i].name == name) return i;
  }
  return std::nullopt;
}

std::optional<size_t> PrefillPeers::byConn(transport::ConnId conn) const {
  if (conn == 0) return std::nullopt;
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (peers_[i].conn == conn) return i;
  }
  return std::nullopt;
}

std::optional<size_t> PrefillPeers::choose(std::optional<size_t> named) {
  auto usable = [this](size_t i) { return !peers_[i].incompatible && peers_[i].health->healthy(); };
  if (named && *named < peers_.size() && usable(*named)) return named;
  std::optional<size_t> best;
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (usable(i) && (!best || peers_[i].num_inflight < peers_[*best].num_inflight)) best = i;
  }
  if (best) return best;
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (peers_[i].health->healthy()) return i;
  }
  return std::nullopt;
}

}  // namespace tandem::agent
