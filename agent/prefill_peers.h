#pragma once
// A decode agent's prefill peers (docs/pd.md "Many prefill agents"): per P
// its connection, what its Hello said, its health (PeerHealth: heartbeats
// and failures) and the transfers in flight to it, and which P serves a
// request.
//
// Thread-safety: none; DecodeService holds its mutex around every call.

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/peer_directory.h"
#include "agent/peer_health.h"
#include "agent/prefill_deadline.h"
#include "agent/transport/kv_transport.h"
#include "src/kvproto/kvproto.h"

namespace tandem::agent {

class PrefillPeers {
 public:
  struct Peer {
    PeerAddress address;
    std::string name;                         // address.name()
    transport::ConnId conn = 0;               // 0: not connected (reconnected when next needed)
    std::optional<kvproto::Hello> hello;      // the peer's, once it arrived and was accepted
    std::optional<std::string> incompatible;  // why it cannot serve this agent (its Hello)
    std::unique_ptr<PeerHealth> health;
    PeerState reported = PeerState::kHealthy;  // the state last logged and shown in the metrics
    int num_inflight = 0;                      // transfers to it not yet complete or ended
    PrefillRate rate{{}};                      // its measured prefill rate: accepted requests' deadlines
    bool member = true;  // in the directory now; a former member only finishes what it has
  };

  // Each peer's health follows `health` (peer_health.h), its deadlines
  // `deadline` (prefill_deadline.h).
  PrefillPeers(const std::vector<PeerAddress>& addresses, const PeerHealthOptions& health, const Clock& clock,
               const PrefillDeadlineOptions& deadline = {});

  size_t size() const { return peers_.size(); }
  Peer& operator[](size_t i) { return peers_[i]; }
  const Peer& operator[](size_t i) const { return peers_[i]; }

  // Makes the members exactly `addresses` (discovery): a new address gets a
  // peer at the end (indexes never move, so transfers keep theirs); one no
  // longer listed stops being a member (never chosen, no heartbeats once
  // idle); one listed again is a member again. Returns the indexes of the
  // peers that joined.
  std::vector<size_t> sync(const std::vector<PeerAddress>& addresses);

  // The peer named "HOST:PORT", if it is one of them.
  std::optional<size_t> find(std::string_view name) const;
  // The peer connected through `conn`.
  std::optional<size_t> byConn(transport::ConnId conn) const;

  // Which peer serves the next request: `named` (the router's choice) when
  // it is healthy and not known incompatible; otherwise the healthy peer
  // not known incompatible with the fewest transfers in flight, ties by
  // order; otherwise any healthy one (its incompatibility then fails the
  // transfer with the reason); never one that is no longer a member.
  // Nothing when every peer is unhealthy: the
  // request is computed here (fallback). Peers in `exclude` (those a
  // request was moved off) are never chosen.
  std::optional<size_t> choose(std::optional<size_t> named, const std::vector<size_t>& exclude = {});

 private:
  std::vector<Peer> peers_;
  PeerHealthOptions health_;
  const Clock& clock_;
  PrefillDeadlineOptions deadline_;
};

}  // namespace tandem::agent
