#include "agent/prefill_peers.h"

#include <algorithm>

namespace tandem::agent {

PrefillPeers::PrefillPeers(const std::vector<PeerAddress>& addresses, const PeerHealthOptions& health,
                           const Clock& clock, const PrefillDeadlineOptions& deadline)
    : health_(health), clock_(clock), deadline_(deadline) {
  sync(addresses);
}

std::vector<size_t> PrefillPeers::sync(const std::vector<PeerAddress>& addresses) {
  std::vector<size_t> joined;
  for (Peer& p : peers_) {
    p.member = std::any_of(addresses.begin(), addresses.end(), [&](const PeerAddress& a) { return a.name() == p.name; });
  }
  for (const PeerAddress& a : addresses) {
    if (find(a.name())) continue;
    Peer& p = peers_.emplace_back();
    p.address = a;
    p.name = a.name();
    p.health = std::make_unique<PeerHealth>(health_, clock_);
    p.rate = PrefillRate(deadline_);
    joined.push_back(peers_.size() - 1);
  }
  return joined;
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
    return peers_[i].member && peers_[i].health->healthy() &&
           std::find(exclude.begin(), exclude.end(), i) == exclude.end();
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
