#include "src/auth/kv_handshake.h"

#include <algorithm>
#include <cstring>

#include "src/common/strings.h"

namespace tandem::auth {
namespace {

template <typename T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
void putBytes(std::string& out, std::string_view s) {
  put(out, static_cast<uint32_t>(s.size()));
  out.append(s);
}

std::string idList(const std::vector<uint64_t>& ids) {
  std::string out = "[";
  for (uint64_t id : ids) {
    if (out.size() > 1) out += ", ";
    out += poolKeyIdName(id);
  }
  return out + "]";
}

}  // namespace

std::string kvAuthMac(std::string_view side, const PoolKeys::Key& key, const kvproto::AuthHello& c,
                      const KvIdentity& acceptor, std::string_view acceptor_nonce) {
  std::string t("tandem-kv-auth/1\0", 17);
  t.append(side);
  t.push_back('\0');
  put(t, key.id);
  putBytes(t, c.nonce);
  putBytes(t, acceptor_nonce);
  put(t, static_cast<uint16_t>(c.role));
  putBytes(t, c.peer_name);
  put(t, static_cast<uint16_t>(acceptor.role));
  putBytes(t, acceptor.name);
  put(t, c.min_version);
  put(t, c.max_version);
  return hmacSha256(key.secret, t);
}

absl::StatusOr<KvAuthConnector> KvAuthConnector::start(std::shared_ptr<const PoolKeys> keys, KvIdentity me) {
  TANDEM_ASSIGN_OR_RETURN(std::string nonce, randomBytes(kvproto::kAuthNonceSize));
  kvproto::AuthHello h{.role = me.role, .nonce = std::move(nonce), .key_ids = keys->ids(), .peer_name = me.name};
  if (h.key_ids.size() > kvproto::kMaxAuthKeys) h.key_ids.resize(kvproto::kMaxAuthKeys);
  return KvAuthConnector(std::move(keys), std::move(me), std::move(h));
}

std::variant<kvproto::AuthProof, AuthFailure> KvAuthConnector::onChallenge(const kvproto::AuthChallenge& c) {
  const PoolKeys::Key* key = keys_->find(c.key_id);
  const KvIdentity acceptor{c.role, c.peer_name};
  if (key == nullptr ||
      std::find(hello_.key_ids.begin(), hello_.key_ids.end(), c.key_id) == hello_.key_ids.end()) {
    return AuthFailure{"bad_challenge", strCat("the peer ", c.peer_name, " chose key ", poolKeyIdName(c.key_id),
                                               ", which this agent did not offer ", idList(hello_.key_ids))};
  }
  if (!constantTimeEqual(c.mac, kvAuthMac("acceptor", *key, hello_, acceptor, c.nonce))) {
    return AuthFailure{"bad_challenge", strCat("the peer ", c.peer_name, " could not prove it holds the pool key ",
                                               poolKeyIdName(c.key_id), ": not an agent of this pool")};
  }
  peer_ = acceptor;
  return kvproto::AuthProof{kvAuthMac("connector", *key, hello_, acceptor, c.nonce)};
}

std::variant<kvproto::AuthChallenge, AuthFailure> KvAuthAcceptor::onHello(const kvproto::AuthHello& h) {
  if (peer_) return AuthFailure{"unauthenticated", "a second AuthHello on one connection"};
  if (!kvproto::compatibleVersion(h.min_version, h.max_version)) {
    return AuthFailure{"incompatible_version",
                       strCat("the peer ", h.peer_name, " speaks kvproto versions [", h.min_version, ", ",
                              h.max_version, "], this agent [", kvproto::kMinVersion, ", ", kvproto::kMaxVersion,
                              "]: no common version")};
  }
  for (uint64_t id : h.key_ids) {
    if ((key_ = keys_->find(id)) != nullptr) break;
  }
  if (key_ == nullptr) {
    return AuthFailure{"unknown_key", strCat("the peer ", h.peer_name, " holds pool keys ", idList(h.key_ids),
                                             ", this agent ", keys_->idNames(),
                                             ": none in common (another pool, a stale Secret, or one side "
                                             "without --pool-key-dir)")};
  }
  absl::StatusOr<std::string> nonce = randomBytes(kvproto::kAuthNonceSize);
  if (!nonce.ok()) return AuthFailure{"unauthenticated", std::string(nonce.status().message())};
  nonce_ = std::move(*nonce);
  hello_ = h;
  peer_ = KvIdentity{h.role, h.peer_name};
  return kvproto::AuthChallenge{.role = me_.role,
                                .nonce = nonce_,
                                .key_id = key_->id,
                                .mac = kvAuthMac("acceptor", *key_, h, me_, nonce_),
                                .peer_name = me_.name};
}

std::optional<AuthFailure> KvAuthAcceptor::onProof(const kvproto::AuthProof& p) {
  if (key_ == nullptr || authenticated_) {
    return AuthFailure{"unauthenticated", "an AuthProof without a pending challenge"};
  }
  if (!constantTimeEqual(p.mac, kvAuthMac("connector", *key_, hello_, me_, nonce_))) {
    const uint64_t id = key_->id;
    key_ = nullptr;  // one try per challenge
    return AuthFailure{"bad_proof", strCat("the peer ", hello_.peer_name, " could not prove it holds the pool key ",
                                           poolKeyIdName(id),
                                           ": a replayed or forged handshake, or another pool's key")};
  }
  authenticated_ = true;
  return std::nullopt;
}

}  // namespace tandem::auth
