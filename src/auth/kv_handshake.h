#pragma once
// The KV channel's authentication handshake (kvproto v4; docs/security.md):
//
//   connector (D)                          acceptor (P)
//   AuthHello{versions, role, name, Nc, key ids it holds}  →
//                     ←  AuthChallenge{role, name, Ns, chosen key id, MACa}
//   AuthProof{MACc}                        →
//   Hello (region, rkey)                   →   (only now)
//                     ←  Hello (region, rkey)
//
//   MACa = HMAC(K, T("acceptor")), MACc = HMAC(K, T("connector")), where
//   T(side) = "tandem-kv-auth/1\0" side "\0" key_id, Nc, Ns, both roles and
//   both names (length-prefixed), the connector's version range.
//
// The acceptor picks the first key in the connector's list that it holds
// (rotation: the two sides need only one key in common). Each side proves
// the key with a fresh nonce of the other side in the MAC, so a recorded
// handshake replayed on a new connection fails (the acceptor's Ns is new),
// and the roles and names each side claims are bound to the proof: an
// attacker in the middle cannot change them. A side learns nothing of the
// other's KV region before the proofs succeed.
//
// These classes are pure (no I/O, not thread-safe: one per connection,
// used under the owner's lock); the P/D services send what they return.

#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "src/auth/pool_key.h"
#include "src/kvproto/kvproto.h"

namespace tandem::auth {

// Who a side says it is; bound into the MACs.
struct KvIdentity {
  kvproto::PeerRole role = kvproto::PeerRole::kDecode;
  std::string name;
};

// Why a handshake failed. `reason` is the tandem_kv_auth_failures_total
// label: incompatible_version, unknown_key, bad_proof (the connector's MAC
// is wrong), bad_challenge (the acceptor's MAC is wrong), unauthenticated
// (another message before the handshake finished), wrong_role; the P/D
// services add malformed, handshake_timeout and refused_by_peer.
struct AuthFailure {
  std::string_view reason;
  std::string message;
};

class KvAuthConnector {
 public:
  // Fails only if no nonce can be drawn.
  static absl::StatusOr<KvAuthConnector> start(std::shared_ptr<const PoolKeys> keys, KvIdentity me);

  // What to send first.
  const kvproto::AuthHello& hello() const { return hello_; }
  // Checks the acceptor's challenge: the proof to send next, or why the
  // acceptor is not to be trusted (then close without sending anything).
  std::variant<kvproto::AuthProof, AuthFailure> onChallenge(const kvproto::AuthChallenge& c);
  // The acceptor, once onChallenge succeeded.
  const std::optional<KvIdentity>& peer() const { return peer_; }

 private:
  KvAuthConnector(std::shared_ptr<const PoolKeys> keys, KvIdentity me, kvproto::AuthHello hello)
      : keys_(std::move(keys)), me_(std::move(me)), hello_(std::move(hello)) {}
  std::shared_ptr<const PoolKeys> keys_;
  KvIdentity me_;
  kvproto::AuthHello hello_;
  std::optional<KvIdentity> peer_;
};

class KvAuthAcceptor {
 public:
  KvAuthAcceptor(std::shared_ptr<const PoolKeys> keys, KvIdentity me) : keys_(std::move(keys)), me_(std::move(me)) {}

  // The connector's AuthHello: the challenge to answer with, or why not.
  std::variant<kvproto::AuthChallenge, AuthFailure> onHello(const kvproto::AuthHello& h);
  // The connector's proof: nothing when it is right (authenticated()).
  std::optional<AuthFailure> onProof(const kvproto::AuthProof& p);
  bool authenticated() const { return authenticated_; }
  // The connector as it identified itself; trustworthy once authenticated().
  const std::optional<KvIdentity>& peer() const { return peer_; }

 private:
  std::shared_ptr<const PoolKeys> keys_;
  KvIdentity me_;
  std::optional<KvIdentity> peer_;
  kvproto::AuthHello hello_;  // the connector's
  const PoolKeys::Key* key_ = nullptr;  // into keys_
  std::string nonce_;
  bool authenticated_ = false;
};

// The MAC one side sends (exposed for tests).
std::string kvAuthMac(std::string_view side, const PoolKeys::Key& key, const kvproto::AuthHello& connector,
                      const KvIdentity& acceptor, std::string_view acceptor_nonce);

}  // namespace tandem::auth
