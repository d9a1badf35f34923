#include "agent/prefill_peers.h"

#include <algorithm>

namespace tandem::agent {

PrefillPeers::PrefillPeers(const std::vector<PeerAddress>& addresses, const PeerHealthOptions& health,
                           const Clock& clock, const PrefillDeadlineOptions& deadline) {
  peers_.reserve(addresses.size());
  for (const PeerAddress& a : addresses) {
    Peer& p = peers_.emplace_back();
    p.address = a;
    p.name = a.name();
    p.health = std::make_unique<PeerHealth>(health, clock);
    p.rate = PrefillRate(deadline);
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

std::optional<size_t> PrefillPeers::choose(std::optional<size_t> named, const std::vector<size_t>& exclude) {
  auto allowed = [&](size_t i) {
    return peers_[i].health->healthy() && std::find(exclude.begin(), exclude.end(), i) == exclude.end();
  };
  auto usable = [&](size_t i) { return !peers_[i].incompatible && allowed(i); };
  if (named && *named < peers_.size() && usable(*named)) return named;
  std::optional<size_t> best;
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (usable(i) && (!best || peers_[i].num_inflight < peers_[*best].num_inflight)) best = i;
  }
  if (best) return best;
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (allowed(i)) return i;
  }
  return std::nullopt;
}

}  // namespace tandem::agent
