#pragma once
// Wire format of the P/D control messages (UCP active messages between a
// decode agent D and a prefill agent P). Bulk KV never travels in these
// messages: D pulls layer blocks from P's registered memory with UCP get.
//
// Every message is a 24-byte header followed by a payload. All integers are
// little-endian; there is no padding.
//
//   offset size field
//   0      4    magic        0x3156_4B54 ("TKV1" in memory order)
//   4      2    version      the sender's protocol version (see "Versions" below)
//   6      2    type         MessageType
//   8      8    transfer_id  chosen by D, unique per D; names one prefill/transfer
//   16     4    payload_len  bytes after the header; must equal what remains
//   20     4    reserved     0
//
// Payloads (u8/u16/u32/u64 fixed width; "list<T>" = u32 count then count × T;
// "bytes" = u32 length then the bytes):
//
//   kHello            u16 min_version, u16 max_version (the range the sender speaks),
//                     u64 model_fingerprint, u64 hash_root (the block-hash chain's root:
//                     fingerprint and cache salt, src/common/block_hash.h),
//                     u16 role (1 prefill, 2 decode), u16 num_layers, u32 num_blocks,
//                     u16 block_size, u16 num_kv_heads, u16 head_dim, u16 dtype (1 = fp32),
//                     u64 region_base, bytes rkey, bytes peer_name,
//                     from version 5: u16 tp_rank, u16 tp_world, u16 kv_head_begin (the
//                     sender is tensor-parallel rank tp_rank of tp_world and holds KV heads
//                     [kv_head_begin, kv_head_begin + num_kv_heads) of the full model; a
//                     Hello of version 3 or 4 decodes as rank 0 of 1 from head 0)
//   kPrefillRequest   u32 deadline_ms, u32 lease_ms, list<u32> tokens,
//                     f32 temperature, f32 top_p, u32 top_k, u64 seed, u8 has_seed
//   kPrefillAccepted  u32 num_cached_tokens, u32 lease_ms (how long P keeps the blocks
//                     pinned from now: D must not read them later), list<u32> block_ids
//                     (P's blocks, in logical order)
//   kLayerReady       u16 layer, u32 first_block, list<u64> checksums: blocks
//                     [first_block, first_block + count) of kPrefillAccepted's list
//                     hold their final KV for this layer; one checksum each
//   kPrefillDone      u32 first_token
//   kRelease          (empty) D is done reading; P unpins
//   kAbort            u16 reason (FailureReason), bytes message
//   kPing, kPong      (empty) health probe
//   kAuthHello        u16 min_version, u16 max_version, u16 role, bytes nonce (32 bytes),
//                     list<u64> key_ids (the pool keys the sender holds, preferred first),
//                     bytes peer_name
//   kAuthChallenge    u16 role, bytes nonce (32 bytes), u64 key_id (the one chosen),
//                     bytes mac (32 bytes: the acceptor's proof), bytes peer_name
//   kAuthProof        bytes mac (32 bytes: the connector's proof)
//
// Authentication (docs/security.md). Every connection opens with
// kAuthHello (connector) → kAuthChallenge (acceptor) → kAuthProof
// (connector): each side proves it holds the same pool key by an HMAC over
// both nonces and both identities (src/auth/kv_handshake.h). Only then is
// the Hello (which carries the region's remote key) sent, first by the
// connector, answered by the acceptor; an acceptor ignores nothing before
// that: any other message closes the connection.
//
// Versions. Each side speaks [kMinVersion, kMaxVersion]. The Hello that
// opens a connection carries that range, and its layout starts with it in
// every version from 3 on (a later version may only append fields), so a
// Hello of any header version >= 3 decodes (a newer sender's extra fields
// are ignored). The peers then use the highest version both speak; with no
// common version the receiver refuses the peer, naming both ranges
// (compatibleVersion). Every other message must carry a version this side
// speaks. History: 2, LayerReady names a block range; 3, the Hello carries
// the version range, model fingerprint and hash root; 4, connections open
// with the authentication handshake; 5, the Hello carries the
// tensor-parallel rank, world size and KV-head range.
//
// decode() checks everything a peer could get wrong — magic, version, type,
// lengths (a count can never exceed the bytes that remain, and each is capped
// by DecodeLimits), and block ids and layers against the receiver's layout —
// so a corrupt or hostile message is rejected with a Status naming the
// problem, never read out of bounds.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "src/common/status.h"

namespace tandem::kvproto {

inline constexpr uint32_t kMagic = 0x31564B54;
inline constexpr uint16_t kMinVersion = 4;  // the oldest version this build speaks
inline constexpr uint16_t kMaxVersion = 5;  // the newest; what it sends
inline constexpr uint16_t kVersion = kMaxVersion;
inline constexpr uint16_t kFirstRangedHelloVersion = 3;  // Hellos from here on start with the range
inline constexpr uint16_t kFirstAuthVersion = 4;          // the first version with kAuthHello
inline constexpr uint16_t kFirstTensorParallelVersion = 5;  // Hellos from here on carry the TP rank
inline constexpr size_t kAuthNonceSize = 32;
inline constexpr size_t kAuthMacSize = 32;  // HMAC-SHA-256
inline constexpr size_t kHeaderSize = 24;

enum class MessageType : uint16_t {
  kHello = 1,
  kPrefillRequest = 2,
  kPrefillAccepted = 3,
  kLayerReady = 4,
  kPrefillDone = 5,
  kRelease = 6,
  kAbort = 7,
  kPing = 8,
  kPong = 9,
  kAuthHello = 10,
  kAuthChallenge = 11,
  kAuthProof = 12,
};

// Typed transfer failures (DESIGN.md §3), carried by kAbort and counted in
// tandem_kv_transfer_failures_total{reason}.
enum class FailureReason : uint16_t {
  kPrefillTimeout = 1,
  kTransferFailed = 2,
  kPeerUnhealthy = 3,
  kLeaseExpired = 4,
  kCapacity = 5,
  kChecksumMismatch = 6,
  kCancelled = 7,
};
std::string_view failureReasonName(FailureReason r);

// Who sent a Hello (wire values; anything else is refused on decode).
enum class PeerRole : uint16_t {
  kPrefill = 1,
  kDecode = 2,
};
std::string_view peerRoleName(PeerRole r);

// Element type of a KV pool (wire values; engine::KvDtype): the decode side
// pulls the prefill side's layer blocks byte for byte, so both must agree.
enum class KvDtype : uint16_t {
  kFloat32 = 1,
  kBfloat16 = 2,
};
std::string_view kvDtypeName(KvDtype d);  // "float32", "bfloat16"

struct Hello {
  uint16_t min_version = kMinVersion;
  uint16_t max_version = kMaxVersion;
  uint64_t model_fingerprint = 0;
  uint64_t hash_root = 0;
  PeerRole role = PeerRole::kPrefill;
  uint16_t num_layers = 0;
  uint32_t num_blocks = 0;
  uint16_t block_size = 0;
  uint16_t num_kv_heads = 0;
  uint16_t head_dim = 0;
  KvDtype dtype = KvDtype::kFloat32;
  uint64_t region_base = 0;
  std::string rkey;
  std::string peer_name;
  // Which tensor-parallel shard of the model's KV the sender holds, so a
  // decode rank pulls from the prefill rank with the same KV heads
  // (engine/model/tensor_parallel.h). An older peer's Hello gets these
  // defaults: before version 5 every agent held all the KV heads.
  uint16_t tp_rank = 0;
  uint16_t tp_world = 1;
  uint16_t kv_head_begin = 0;  // its KV heads: [kv_head_begin, kv_head_begin + num_kv_heads)
};
struct PrefillRequest {
  uint32_t deadline_ms = 0;
  uint32_t lease_ms = 0;
  std::vector<uint32_t> tokens;
  float temperature = 1.0f;
  float top_p = 1.0f;
  uint32_t top_k = 0;
  std::optional<uint64_t> seed;
};
struct PrefillAccepted {
  uint32_t num_cached_tokens = 0;
  uint32_t lease_ms = 0;
  std::vector<uint32_t> block_ids;
};
struct LayerReady {
  uint16_t layer = 0;
  uint32_t first_block = 0;  // index into PrefillAccepted::block_ids
  std::vector<uint64_t> checksums;
};
struct PrefillDone {
  uint32_t first_token = 0;
};
struct Release {};
struct Abort {
  FailureReason reason = FailureReason::kTransferFailed;
  std::string message;
};
struct Ping {};
struct Pong {};
struct AuthHello {
  uint16_t min_version = kMinVersion;
  uint16_t max_version = kMaxVersion;
  PeerRole role = PeerRole::kDecode;
  std::string nonce;              // kAuthNonceSize bytes
  std::vector<uint64_t> key_ids;  // at most kMaxAuthKeys
  std::string peer_name;
};
struct AuthChallenge {
  PeerRole role = PeerRole::kPrefill;
  std::string nonce;  // kAuthNonceSize bytes
  uint64_t key_id = 0;
  std::string mac;  // kAuthMacSize bytes
  std::string peer_name;
};
struct AuthProof {
  std::string mac;  // kAuthMacSize bytes
};
inline constexpr uint32_t kMaxAuthKeys = 8;

using Body = std::variant<Hello, PrefillRequest, PrefillAccepted, LayerReady, PrefillDone, Release, Abort, Ping, Pong,
                          AuthHello, AuthChallenge, AuthProof>;

struct Message {
  uint64_t transfer_id = 0;
  Body body;
};

// What the receiver will accept. Block ids and layers are checked against
// the receiver's view of the sender's layout (from the sender's Hello).
struct DecodeLimits {
  uint32_t max_tokens = 1u << 20;     // prompt tokens in one request
  uint32_t max_blocks = 1u << 20;     // entries in a block list
  uint32_t max_string = 4096;         // rkey, names, messages
  uint32_t num_blocks = UINT32_MAX;   // block ids must be < this
  uint16_t num_layers = UINT16_MAX;   // layers must be < this
};

MessageType typeOf(const Body& body);

// The highest version both this build and a peer whose Hello says
// [peer_min, peer_max] speak; nothing when the ranges do not meet.
std::optional<uint16_t> compatibleVersion(uint16_t peer_min, uint16_t peer_max);

// Appends the encoding of `m` to `out`.
void encode(const Message& m, std::vector<uint8_t>* out);
std::vector<uint8_t> encode(const Message& m);

// Decodes exactly one message occupying all of `data`.
absl::StatusOr<Message> decode(std::span<const uint8_t> data, const DecodeLimits& limits = {});

// 64-bit checksum of one layer block (XXH64, seed 0: src/common/block_hash.h),
// computed by P after the layer is written and verified by D after its get
// completed.
uint64_t layerBlockChecksum(std::span<const std::byte> bytes);

}  // namespace tandem::kvproto
