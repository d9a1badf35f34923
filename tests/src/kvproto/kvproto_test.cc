#include "src/kvproto/kvproto.h"

#include <gtest/gtest.h>

#include <cstring>

namespace tandem::kvproto {
namespace {

std::vector<Message> samples() {
  Hello h{.model_fingerprint = 0x0123456789abcdefULL,
          .hash_root = 0xfedcba9876543210ULL,
          .role = PeerRole::kPrefill,
          .num_layers = 4,
          .num_blocks = 512,
          .block_size = 16,
          .num_kv_heads = 2,
          .head_dim = 32,
          .dtype = KvDtype::kFloat32,
          .region_base = 0x7f0012345000,
          .rkey = std::string("\x01\x02\x00\x03", 4),
          .peer_name = "p-0"};
  PrefillRequest pr{.deadline_ms = 5000, .lease_ms = 30000, .tokens = {1, 50, 60, 70}, .temperature = 0.5f,
                    .top_p = 0.9f, .top_k = 40, .seed = 7};
  return {{1, h},
          {2, pr},
          {2, PrefillRequest{.tokens = {9}}},
          {3, PrefillAccepted{.num_cached_tokens = 32, .block_ids = {4, 9, 2}}},
          {3, LayerReady{.layer = 3, .first_block = 5, .checksums = {1, 2, 0xffffffffffffffffULL}}},
          {4, PrefillDone{.first_token = 42}},
          {5, Release{}},
          {6, Abort{.reason = FailureReason::kLeaseExpired, .message = "lease expired after 30s"}},
          {7, Ping{}},
          {8, Pong{}},
          {0, AuthHello{.role = PeerRole::kDecode, .nonce = std::string(kAuthNonceSize, 'n'), .key_ids = {1, 0xabcdef},
                        .peer_name = "d-0"}},
          {0, AuthChallenge{.role = PeerRole::kPrefill, .nonce = std::string(kAuthNonceSize, 'm'), .key_id = 0xabcdef,
                            .mac = std::string(kAuthMacSize, '\x7f'), .peer_name = "p-0"}},
          {0, AuthProof{.mac = std::string(kAuthMacSize, '\0')}}};
}

TEST(KvProtoTest, RoundTripsEveryMessage) {
  for (const Message& m : samples()) {
    std::vector<uint8_t> wire = encode(m);
    auto back = decode(wire);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->transfer_id, m.transfer_id);
    EXPECT_EQ(back->body.index(), m.body.index());
    EXPECT_EQ(encode(*back), wire);  // re-encoding is byte-identical
  }
  auto pr = std::get<PrefillRequest>(decode(encode(samples()[1]))->body);
  EXPECT_EQ(pr.tokens, (std::vector<uint32_t>{1, 50, 60, 70}));
  EXPECT_EQ(pr.seed, 7u);
  EXPECT_FLOAT_EQ(pr.top_p, 0.9f);
  EXPECT_FALSE(std::get<PrefillRequest>(decode(encode(samples()[2]))->body).seed.has_value());
}

TEST(KvProtoTest, HeaderLayoutIsAsDocumented) {
  std::vector<uint8_t> wire = encode({0x0102030405060708ULL, PrefillDone{.first_token = 5}});
  ASSERT_EQ(wire.size(), kHeaderSize + 4);
  EXPECT_EQ(std::string(wire.begin(), wire.begin() + 4), "TKV1");
  EXPECT_EQ(wire[4], 5);  // version, little-endian
  EXPECT_EQ(wire[6], static_cast<uint8_t>(MessageType::kPrefillDone));
  EXPECT_EQ(wire[8], 0x08);  // transfer id, little-endian
  EXPECT_EQ(wire[16], 4);    // payload length
}

TEST(KvProtoTest, EveryTruncationIsRejected) {
  for (const Message& m : samples()) {
    std::vector<uint8_t> wire = encode(m);
    for (size_t n = 0; n < wire.size(); ++n) {
      auto r = decode(std::span<const uint8_t>(wire.data(), n));
      EXPECT_FALSE(r.ok()) << "accepted a " << n << "-byte prefix of a " << wire.size() << "-byte message";
    }
  }
}

std::string errorOf(std::vector<uint8_t> wire, DecodeLimits limits = {}) {
  auto r = decode(wire, limits);
  EXPECT_FALSE(r.ok());
  return std::string(r.status().message());
}

TEST(KvProtoTest, BadHeadersAreRejectedWithReason) {
  std::vector<uint8_t> wire = encode({1, Ping{}});
  auto bad = wire;
  bad[0] ^= 0xff;
  EXPECT_NE(errorOf(bad).find("bad magic"), std::string::npos);
  bad = wire;
  bad[4] = 3;  // the previous version: connections were not authenticated
  EXPECT_NE(errorOf(bad).find("unsupported version 3 (this agent speaks 4 to 5)"), std::string::npos);
  bad[4] = 6;  // a later version, for a message other than the Hellos
  EXPECT_NE(errorOf(bad).find("unsupported version 6"), std::string::npos);
  bad = wire;
  bad[6] = 99;
  EXPECT_NE(errorOf(bad).find("unknown message type 99"), std::string::npos);
  bad = wire;
  bad.push_back(0);
  EXPECT_NE(errorOf(bad).find("payload_len 0 but 1 bytes follow"), std::string::npos);
}

TEST(KvProtoTest, HelloCarriesVersionRangeFingerprintAndRoot) {
  auto back = decode(encode(samples()[0]));
  ASSERT_TRUE(back.ok()) << back.status();
  const Hello& h = std::get<Hello>(back->body);
  EXPECT_EQ(h.min_version, kMinVersion);
  EXPECT_EQ(h.max_version, kMaxVersion);
  EXPECT_EQ(h.model_fingerprint, 0x0123456789abcdefULL);
  EXPECT_EQ(h.hash_root, 0xfedcba9876543210ULL);
  std::vector<uint8_t> wire = encode(samples()[0]);
  EXPECT_EQ(wire[kHeaderSize], kMinVersion);  // the range opens the payload
  EXPECT_EQ(wire[kHeaderSize + 2], kMaxVersion);
}

// `wire` as a version-6 sender would send it: header version 6 and eight
// bytes of fields appended to the payload.
std::vector<uint8_t> asNewerVersion(std::vector<uint8_t> wire) {
  wire[4] = kMaxVersion + 1;
  for (int i = 0; i < 8; ++i) wire.push_back(0xab);
  const uint32_t len = static_cast<uint32_t>(wire.size() - kHeaderSize);
  std::memcpy(wire.data() + 16, &len, 4);
  return wire;
}

TEST(KvProtoTest, HelloOfAnyRangedVersionDecodes) {
  // A newer peer's Hello still decodes,
  // so the receiver can name its range when it refuses it.
  Hello newer{.min_version = 5, .max_version = 6, .peer_name = "p-new", .tp_rank = 1, .tp_world = 2};
  std::vector<uint8_t> wire = asNewerVersion(encode({0, newer}));
  auto back = decode(wire);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(std::get<Hello>(back->body).max_version, 6);
  EXPECT_EQ(std::get<Hello>(back->body).peer_name, "p-new");
  EXPECT_EQ(std::get<Hello>(back->body).tp_rank, 1);  // the fields this build knows are read
  // Trailing bytes after a Hello of this version are still malformed.
  wire[4] = kMaxVersion;
  EXPECT_NE(errorOf(wire).find("unexpected bytes"), std::string::npos);
  // An empty range is malformed.
  EXPECT_NE(errorOf(encode({0, Hello{.min_version = 5, .max_version = 4}})).find("version range [5, 4] is empty"),
            std::string::npos);
}

TEST(KvProtoTest, HelloCarriesTheTensorParallelShard) {
  Hello h = std::get<Hello>(samples()[0].body);
  h.tp_rank = 3;
  h.tp_world = 4;
  h.kv_head_begin = 6;
  std::vector<uint8_t> wire = encode({0, h});
  EXPECT_EQ(wire[4], kFirstTensorParallelVersion);
  auto back = decode(wire);
  ASSERT_TRUE(back.ok()) << back.status();
  const Hello& b = std::get<Hello>(back->body);
  EXPECT_EQ(b.tp_rank, 3);
  EXPECT_EQ(b.tp_world, 4);
  EXPECT_EQ(b.kv_head_begin, 6);
  EXPECT_EQ(b.num_kv_heads, 2);  // its heads: [6, 8)
  EXPECT_EQ(b.peer_name, "p-0");
  // The shard closes the payload: u16 rank, u16 world, u16 first KV head.
  EXPECT_EQ(wire[wire.size() - 6], 3);
  EXPECT_EQ(wire[wire.size() - 4], 4);
  EXPECT_EQ(wire[wire.size() - 2], 6);
}

// `wire` (a Hello of this build) as a version-4 sender sent it: header
// version 4, without the tensor-parallel fields version 5 appended.
std::vector<uint8_t> asVersion4Hello(std::vector<uint8_t> wire) {
  if (wire.size() < kHeaderSize + 6) {
    ADD_FAILURE() << "not a Hello: " << wire.size() << " bytes";
    return wire;
  }
  wire[4] = 4;
  wire.erase(wire.end() - 6, wire.end());
  const uint32_t len = static_cast<uint32_t>(wire.size() - kHeaderSize);
  std::memcpy(wire.data() + 16, &len, 4);
  return wire;
}

TEST(KvProtoTest, VersionFourHelloDecodesAsRankZeroOfOne) {
  Hello h = std::get<Hello>(samples()[0].body);
  h.min_version = 4;
  h.max_version = 4;
  h.tp_rank = 1;  // not sent at version 4
  h.tp_world = 2;
  h.kv_head_begin = 1;
  auto back = decode(asVersion4Hello(encode({0, h})));
  ASSERT_TRUE(back.ok()) << back.status();
  const Hello& b = std::get<Hello>(back->body);
  EXPECT_EQ(b.max_version, 4);
  EXPECT_EQ(b.peer_name, "p-0");
  EXPECT_EQ(b.tp_rank, 0);  // before version 5 every agent held all the KV heads
  EXPECT_EQ(b.tp_world, 1);
  EXPECT_EQ(b.kv_head_begin, 0);
  EXPECT_EQ(b.num_kv_heads, 2);
  EXPECT_EQ(compatibleVersion(b.min_version, b.max_version), 4);  // and this build still talks to it
}

TEST(KvProtoTest, HelloCarriesTheKvDtypeAndOnlyKnownOnes) {
  Hello h = std::get<Hello>(samples()[0].body);
  h.dtype = KvDtype::kBfloat16;
  auto back = decode(encode({0, h}));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(std::get<Hello>(back->body).dtype, KvDtype::kBfloat16);
  EXPECT_EQ(kvDtypeName(KvDtype::kBfloat16), "bfloat16");
  EXPECT_EQ(kvDtypeName(KvDtype::kFloat32), "float32");
  for (uint16_t bad : {uint16_t{0}, uint16_t{3}, uint16_t{0xffff}}) {
    h.dtype = static_cast<KvDtype>(bad);
    EXPECT_NE(errorOf(encode({0, h})).find("unsupported KV dtype " + std::to_string(bad)), std::string::npos) << bad;
  }
}

TEST(KvProtoTest, ImpossibleTensorParallelShardsAreRejected) {
  Hello h = std::get<Hello>(samples()[0].body);
  h.tp_world = 0;
  h.tp_rank = 0;
  EXPECT_NE(errorOf(encode({0, h})).find("tp_world is 0"), std::string::npos);
  h.tp_world = 2;
  h.tp_rank = 2;
  EXPECT_NE(errorOf(encode({0, h})).find("tp_rank 2 is outside the 2 ranks [0, 2)"), std::string::npos);
  h.tp_rank = 1;
  EXPECT_TRUE(decode(encode({0, h})).ok());
  // A v4 Hello cut short where the v5 fields would be is still complete.
  h.tp_rank = 5;
  EXPECT_TRUE(decode(asVersion4Hello(encode({0, h}))).ok());
}

TEST(KvProtoTest, AuthHelloOfAnyAuthVersionDecodes) {
  // A newer peer's AuthHello (version 6, fields appended) decodes, so the
  // acceptor can name its range; a v3 peer's first message (a Hello) decodes
  // too and is refused by the handshake, not as garbage.
  AuthHello newer{.min_version = 5, .max_version = 6, .nonce = std::string(kAuthNonceSize, 'x'), .key_ids = {3}};
  std::vector<uint8_t> wire = asNewerVersion(encode({0, newer}));
  auto back = decode(wire);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(std::get<AuthHello>(back->body).max_version, 6);
  wire[4] = 3;  // before authentication existed: no such message
  EXPECT_NE(errorOf(wire).find("unsupported version 3"), std::string::npos);
}

TEST(KvProtoTest, AuthFieldsHaveFixedSizes) {
  EXPECT_NE(errorOf(encode({0, AuthProof{.mac = "short"}})).find("mac is 5 bytes, expected 32"), std::string::npos);
  EXPECT_NE(errorOf(encode({0, AuthProof{.mac = std::string(33, 'a')}})).find("mac length 33 exceeds the limit 32"),
            std::string::npos);
  EXPECT_NE(errorOf(encode({0, AuthHello{.nonce = "n"}})).find("nonce is 1 bytes, expected 32"), std::string::npos);
  AuthHello many{.nonce = std::string(kAuthNonceSize, 'n'), .key_ids = std::vector<uint64_t>(kMaxAuthKeys + 1, 1)};
  EXPECT_NE(errorOf(encode({0, many})).find("key_ids count 9 exceeds the limit 8"), std::string::npos);
  AuthChallenge bad_role{.role = static_cast<PeerRole>(9), .nonce = std::string(kAuthNonceSize, 'n'),
                         .mac = std::string(kAuthMacSize, 'm')};
  EXPECT_NE(errorOf(encode({0, bad_role})).find("unknown role 9"), std::string::npos);
}

TEST(KvProtoTest, CompatibleVersionIsTheHighestCommonOne) {
  EXPECT_EQ(compatibleVersion(kMinVersion, kMaxVersion), kMaxVersion);
  EXPECT_EQ(compatibleVersion(1, 100), kMaxVersion);
  EXPECT_EQ(compatibleVersion(kMinVersion, kMinVersion), kMinVersion);
  EXPECT_FALSE(compatibleVersion(kMaxVersion + 1, kMaxVersion + 3).has_value());
  EXPECT_FALSE(compatibleVersion(1, kMinVersion - 1).has_value());
}

TEST(KvProtoTest, OversizedLengthsAreRejectedBeforeAllocating) {
  // A block list claiming 2^31 entries in a tiny message.
  std::vector<uint8_t> wire = encode({3, PrefillAccepted{.num_cached_tokens = 0, .block_ids = {1}}});
  uint32_t huge = 0x80000000u;
  std::memcpy(wire.data() + kHeaderSize + 8, &huge, 4);  // the count after num_cached_tokens and lease_ms
  EXPECT_NE(errorOf(wire).find("exceeds the limit"), std::string::npos);
  EXPECT_NE(errorOf(wire, {.max_blocks = UINT32_MAX}).find("exceeds the bytes left"), std::string::npos);
  std::vector<uint8_t> s = encode({6, Abort{.reason = FailureReason::kCapacity, .message = std::string(5000, 'x')}});
  EXPECT_NE(errorOf(s).find("message length 5000 exceeds the limit 4096"), std::string::npos);
  std::vector<uint8_t> t = encode({2, PrefillRequest{.tokens = std::vector<uint32_t>(100, 5)}});
  EXPECT_NE(errorOf(t, {.max_tokens = 64}).find("tokens count 100 exceeds the limit 64"), std::string::npos);
}

TEST(KvProtoTest, OutOfRangeBlocksAndLayersAreRejected) {
  DecodeLimits peer{.num_blocks = 8, .num_layers = 4};
  EXPECT_NE(errorOf(encode({3, PrefillAccepted{.block_ids = {1, 8}}}), peer).find("block_ids[1] = 8 is outside the peer's pool of 8"),
            std::string::npos);
  EXPECT_TRUE(decode(encode({3, PrefillAccepted{.block_ids = {0, 7}}}), peer).ok());
  EXPECT_NE(errorOf(encode({3, LayerReady{.layer = 4, .checksums = {1}}}), peer).find("layer 4 is outside"), std::string::npos);
  // A block range past any request's list (the receiver checks it against the request).
  EXPECT_NE(errorOf(encode({3, LayerReady{.layer = 0, .first_block = 0xffffffffu, .checksums = {1, 2}}}), peer)
                .find("exceed the limit"),
            std::string::npos);
  auto l = decode(encode({3, LayerReady{.layer = 1, .first_block = 6, .checksums = {1, 2}}}), peer);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(std::get<LayerReady>(l->body).first_block, 6u);
}

TEST(KvProtoTest, SemanticGarbageIsRejected) {
  EXPECT_NE(errorOf(encode({1, Abort{.reason = static_cast<FailureReason>(77)}})).find("unknown failure reason 77"), std::string::npos);
  EXPECT_NE(errorOf(encode({1, PrefillRequest{}})).find("empty prompt"), std::string::npos);
  EXPECT_NE(errorOf(encode({1, Hello{.role = static_cast<PeerRole>(9)}})).find("unknown role 9"), std::string::npos);
}

TEST(KvProtoTest, ChecksumSeesEveryByte) {
  std::vector<std::byte> a(4096, std::byte{1});
  uint64_t base = layerBlockChecksum(a);
  a[4095] = std::byte{2};
  EXPECT_NE(layerBlockChecksum(a), base);
  EXPECT_EQ(std::string(failureReasonName(FailureReason::kPrefillTimeout)), "prefill_timeout");
}

}  // namespace
}  // namespace tandem::kvproto
