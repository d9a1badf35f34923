#include "src/auth/kv_handshake.h"

#include <gtest/gtest.h>

namespace tandem::auth {
namespace {

using kvproto::PeerRole;

const std::string kKeyA(64, 'a');
const std::string kKeyB(64, 'b');

std::shared_ptr<const PoolKeys> keys(std::vector<std::string> secrets) {
  return *PoolKeys::of(secrets, std::vector<std::string>(secrets.size(), "k"));
}

struct Outcome {
  std::optional<AuthFailure> failure;  // at whichever side
  bool acceptor_authenticated = false;
};

Outcome run(std::shared_ptr<const PoolKeys> connector_keys, std::shared_ptr<const PoolKeys> acceptor_keys,
            PeerRole connector_role = PeerRole::kDecode) {
  auto c = KvAuthConnector::start(connector_keys, {connector_role, "d-0"});
  EXPECT_TRUE(c.ok());
  KvAuthAcceptor a(acceptor_keys, {PeerRole::kPrefill, "p-0"});
  auto challenge = a.onHello(c->hello());
  if (auto* f = std::get_if<AuthFailure>(&challenge)) return {*f, false};
  auto proof = c->onChallenge(std::get<kvproto::AuthChallenge>(challenge));
  if (auto* f = std::get_if<AuthFailure>(&proof)) return {*f, false};
  if (auto f = a.onProof(std::get<kvproto::AuthProof>(proof))) return {*f, false};
  EXPECT_EQ(a.peer()->role, connector_role);
  EXPECT_EQ(a.peer()->name, "d-0");
  EXPECT_EQ(c->peer()->name, "p-0");
  return {std::nullopt, a.authenticated()};
}

TEST(KvHandshakeTest, SameKeyAuthenticatesBothWays) {
  Outcome o = run(keys({kKeyA}), keys({kKeyA}));
  EXPECT_FALSE(o.failure.has_value()) << o.failure->message;
  EXPECT_TRUE(o.acceptor_authenticated);
}

TEST(KvHandshakeTest, InsecureAgentsWorkOnlyWithEachOther) {
  EXPECT_TRUE(run(PoolKeys::insecure(), PoolKeys::insecure()).acceptor_authenticated);
  Outcome o = run(PoolKeys::insecure(), keys({kKeyA}));
  ASSERT_TRUE(o.failure.has_value());
  EXPECT_EQ(o.failure->reason, "unknown_key");
  EXPECT_NE(o.failure->message.find("holds pool keys [insecure]"), std::string::npos) << o.failure->message;
  EXPECT_EQ(run(keys({kKeyA}), PoolKeys::insecure()).failure->reason, "unknown_key");
}

TEST(KvHandshakeTest, AnotherPoolsKeyIsUnknown) {
  Outcome o = run(keys({kKeyB}), keys({kKeyA}));
  ASSERT_TRUE(o.failure.has_value());
  EXPECT_EQ(o.failure->reason, "unknown_key");
}

TEST(KvHandshakeTest, EveryRotationStepSharesAKey) {
  auto old_only = keys({kKeyA});
  auto old_next = keys({kKeyA, kKeyB});      // step 1: next-key added
  auto new_prev = keys({kKeyB, kKeyA});      // step 2: promoted, old kept as previous-key
  auto new_only = keys({kKeyB});             // step 3
  // Neighbouring steps coexist while the Secret propagates, both directions.
  const std::vector<std::pair<std::shared_ptr<const PoolKeys>, std::shared_ptr<const PoolKeys>>> pairs = {
      {old_only, old_next}, {old_next, new_prev}, {new_prev, new_only}};
  for (const auto& [x, y] : pairs) {
    EXPECT_TRUE(run(x, y).acceptor_authenticated);
    EXPECT_TRUE(run(y, x).acceptor_authenticated);
    EXPECT_TRUE(x->acceptsInternalToken(y->internalToken()));
    EXPECT_TRUE(y->acceptsInternalToken(x->internalToken()));
  }
  EXPECT_FALSE(run(old_only, new_only).acceptor_authenticated);
}

TEST(KvHandshakeTest, ReplayedHandshakeFails) {
  // A captured session: the connector's AuthHello and AuthProof.
  auto c = *KvAuthConnector::start(keys({kKeyA}), {PeerRole::kDecode, "d-0"});
  KvAuthAcceptor first(keys({kKeyA}), {PeerRole::kPrefill, "p-0"});
  auto proof = std::get<kvproto::AuthProof>(c.onChallenge(std::get<kvproto::AuthChallenge>(first.onHello(c.hello()))));
  EXPECT_FALSE(first.onProof(proof).has_value());
  // Replayed on a new connection: the acceptor's nonce is new, so the old proof fails.
  KvAuthAcceptor second(keys({kKeyA}), {PeerRole::kPrefill, "p-0"});
  ASSERT_TRUE(std::holds_alternative<kvproto::AuthChallenge>(second.onHello(c.hello())));
  auto f = second.onProof(proof);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->reason, "bad_proof");
  EXPECT_FALSE(second.authenticated());
  // And no second try on the same challenge.
  EXPECT_EQ(second.onProof(proof)->reason, "unauthenticated");
}

TEST(KvHandshakeTest, ForgedChallengeIsRefusedByTheConnector) {
  auto c = *KvAuthConnector::start(keys({kKeyA}), {PeerRole::kDecode, "d-0"});
  KvAuthAcceptor impostor(keys({kKeyA}), {PeerRole::kPrefill, "p-0"});
  auto challenge = std::get<kvproto::AuthChallenge>(impostor.onHello(c.hello()));
  // An attacker in the middle renames the acceptor: the MAC no longer matches.
  challenge.peer_name = "p-evil";
  auto r = c.onChallenge(challenge);
  ASSERT_TRUE(std::holds_alternative<AuthFailure>(r));
  EXPECT_EQ(std::get<AuthFailure>(r).reason, "bad_challenge");
  // A challenge for a key the connector did not offer.
  challenge = std::get<kvproto::AuthChallenge>(KvAuthAcceptor(keys({kKeyA}), {PeerRole::kPrefill, "p"}).onHello(c.hello()));
  challenge.key_id ^= 1;
  EXPECT_EQ(std::get<AuthFailure>(c.onChallenge(challenge)).reason, "bad_challenge");
}

TEST(KvHandshakeTest, TamperedRoleFailsTheProof) {
  auto c = *KvAuthConnector::start(keys({kKeyA}), {PeerRole::kPrefill, "p-1"});
  kvproto::AuthHello h = c.hello();
  h.role = PeerRole::kDecode;  // claims decode on the wire; proves as prefill
  KvAuthAcceptor a(keys({kKeyA}), {PeerRole::kPrefill, "p-0"});
  auto challenge = std::get<kvproto::AuthChallenge>(a.onHello(h));
  // The acceptor's MAC covers the role it saw: the connector refuses it.
  auto r = c.onChallenge(challenge);
  ASSERT_TRUE(std::holds_alternative<AuthFailure>(r));
  EXPECT_EQ(std::get<AuthFailure>(r).reason, "bad_challenge");
  // A proof computed over the true hello does not pass at the acceptor either.
  kvproto::AuthProof forged{kvAuthMac("connector", keys({kKeyA})->primary(), c.hello(), {PeerRole::kPrefill, "p-0"},
                                      challenge.nonce)};
  auto f = a.onProof(forged);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->reason, "bad_proof");
}

TEST(KvHandshakeTest, IncompatibleVersionIsNamed) {
  auto c = *KvAuthConnector::start(keys({kKeyA}), {PeerRole::kDecode, "d-0"});
  kvproto::AuthHello h = c.hello();
  h.min_version = 9;
  h.max_version = 9;
  KvAuthAcceptor a(keys({kKeyA}), {PeerRole::kPrefill, "p-0"});
  auto r = a.onHello(h);
  ASSERT_TRUE(std::holds_alternative<AuthFailure>(r));
  EXPECT_EQ(std::get<AuthFailure>(r).reason, "incompatible_version");
  EXPECT_NE(std::get<AuthFailure>(r).message.find("[9, 9]"), std::string::npos);
}

}  // namespace
}  // namespace tandem::auth
