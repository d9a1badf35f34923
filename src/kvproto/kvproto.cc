#include "src/kvproto/kvproto.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "src/common/block_hash.h"
#include "src/common/strings.h"

namespace tandem::kvproto {
namespace {

static_assert(std::endian::native == std::endian::little, "the wire format is little-endian; add byte swapping");

class Writer {
 public:
  explicit Writer(std::vector<uint8_t>* out) : out_(out) {}
  template <typename T>
  void put(T v) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out_->insert(out_->end(), b, b + sizeof(T));
  }
  void bytes(std::string_view s) {
    put(static_cast<uint32_t>(s.size()));
    out_->insert(out_->end(), s.begin(), s.end());
  }
  template <typename T>
  void list(const std::vector<T>& v) {
    put(static_cast<uint32_t>(v.size()));
    for (T x : v) put(x);
  }

 private:
  std::vector<uint8_t>* out_;
};

// Bounds-checked reads; the first failure sticks and names the field.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> data) : data_(data) {}
  template <typename T>
  T get(const char* field) {
    T v{};
    if (!ok()) return v;
    if (data_.size() - pos_ < sizeof(T)) {
      fail(strCat("truncated at ", field, " (needs ", sizeof(T), " bytes, ", data_.size() - pos_, " left)"));
      return v;
    }
    std::memcpy(&v, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string bytes(const char* field, uint32_t max) {
    uint32_t n = get<uint32_t>(field);
    if (!ok()) return {};
    if (n > max) {
      fail(strCat(field, " length ", n, " exceeds the limit ", max));
      return {};
    }
    if (data_.size() - pos_ < n) {
      fail(strCat(field, " length ", n, " exceeds the ", data_.size() - pos_, " bytes left"));
      return {};
    }
    std::string s(reinterpret_cast<const char*>(data_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  template <typename T>
  std::vector<T> list(const char* field, uint32_t max) {
    uint32_t n = get<uint32_t>(field);
    if (!ok()) return {};
    if (n > max) {
      fail(strCat(field, " count ", n, " exceeds the limit ", max));
      return {};
    }
    if ((data_.size() - pos_) / sizeof(T) < n) {
      fail(strCat(field, " count ", n, " exceeds the bytes left (", data_.size() - pos_, ")"));
      return {};
    }
    std::vector<T> v(n);
    if (n == 0) return v;  // memcpy with a null pointer is undefined even for 0 bytes
    std::memcpy(v.data(), data_.data() + pos_, static_cast<size_t>(n) * sizeof(T));
    pos_ += static_cast<size_t>(n) * sizeof(T);
    return v;
  }
  bool ok() const { return error_.empty(); }
  void fail(std::string msg) {
    if (error_.empty()) error_ = std::move(msg);
  }
  size_t remaining() const { return data_.size() - pos_; }
  void skipRest() { pos_ = data_.size(); }
  const std::string& error() const { return error_; }

 private:
  std::span<const uint8_t> data_;
  size_t pos_ = 0;
  std::string error_;
};

void encodeBody(const Hello& h, Writer& w) {
  w.put(h.min_version);
  w.put(h.max_version);
  w.put(h.model_fingerprint);
  w.put(h.hash_root);
  w.put(static_cast<uint16_t>(h.role));
  w.put(h.num_layers);
  w.put(h.num_blocks);
  w.put(h.block_size);
  w.put(h.num_kv_heads);
  w.put(h.head_dim);
  w.put(static_cast<uint16_t>(h.dtype));
  w.put(h.region_base);
  w.bytes(h.rkey);
  w.bytes(h.peer_name);
  w.put(h.tp_rank);  // version 5 (kFirstTensorParallelVersion)
  w.put(h.tp_world);
  w.put(h.kv_head_begin);
}
void encodeBody(const PrefillRequest& r, Writer& w) {
  w.put(r.deadline_ms);
  w.put(r.lease_ms);
  w.list(r.tokens);
  w.put(r.temperature);
  w.put(r.top_p);
  w.put(r.top_k);
  w.put(r.seed.value_or(0));
  w.put(static_cast<uint8_t>(r.seed.has_value()));
}
void encodeBody(const PrefillAccepted& a, Writer& w) {
  w.put(a.num_cached_tokens);
  w.put(a.lease_ms);
  w.list(a.block_ids);
}
void encodeBody(const LayerReady& l, Writer& w) {
  w.put(l.layer);
  w.put(l.first_block);
  w.list(l.checksums);
}
void encodeBody(const PrefillDone& d, Writer& w) { w.put(d.first_token); }
void encodeBody(const Abort& a, Writer& w) {
  w.put(static_cast<uint16_t>(a.reason));
  w.bytes(a.message);
}
void encodeBody(const Release&, Writer&) {}
void encodeBody(const Ping&, Writer&) {}
void encodeBody(const Pong&, Writer&) {}
void encodeBody(const AuthHello& h, Writer& w) {
  w.put(h.min_version);
  w.put(h.max_version);
  w.put(static_cast<uint16_t>(h.role));
  w.bytes(h.nonce);
  w.list(h.key_ids);
  w.bytes(h.peer_name);
}
void encodeBody(const AuthChallenge& c, Writer& w) {
  w.put(static_cast<uint16_t>(c.role));
  w.bytes(c.nonce);
  w.put(c.key_id);
  w.bytes(c.mac);
  w.bytes(c.peer_name);
}
void encodeBody(const AuthProof& p, Writer& w) { w.bytes(p.mac); }

bool knownRole(uint16_t role) {
  return role == static_cast<uint16_t>(PeerRole::kPrefill) || role == static_cast<uint16_t>(PeerRole::kDecode);
}

// A fixed-size byte field (nonce, MAC): exactly `size` bytes.
std::string fixedBytes(Reader& r, const char* field, size_t size) {
  std::string s = r.bytes(field, static_cast<uint32_t>(size));
  if (r.ok() && s.size() != size) r.fail(strCat(field, " is ", s.size(), " bytes, expected ", size));
  return s;
}

absl::Status invalid(uint64_t id, std::string_view what) {
  return absl::InvalidArgumentError(strCat("kvproto: transfer ", id, ": ", what));
}

}  // namespace

std::string_view peerRoleName(PeerRole r) {
  switch (r) {
    case PeerRole::kPrefill:
      return "prefill";
    case PeerRole::kDecode:
      return "decode";
  }
  return "unknown";
}

std::string_view kvDtypeName(KvDtype d) {
  switch (d) {
    case KvDtype::kFloat32:
      return "float32";
    case KvDtype::kBfloat16:
      return "bfloat16";
  }
  return "unknown";
}

std::string_view failureReasonName(FailureReason r) {
  switch (r) {
    case FailureReason::kPrefillTimeout: return "prefill_timeout";
    case FailureReason::kTransferFailed: return "transfer_failed";
    case FailureReason::kPeerUnhealthy: return "peer_unhealthy";
    case FailureReason::kLeaseExpired: return "lease_expired";
    case FailureReason::kCapacity: return "capacity";
    case FailureReason::kChecksumMismatch: return "checksum_mismatch";
    case FailureReason::kCancelled: return "cancelled";
  }
  return "unknown";
}

MessageType typeOf(const Body& body) {
  static constexpr MessageType kTypes[] = {MessageType::kHello,       MessageType::kPrefillRequest,
                                           MessageType::kPrefillAccepted, MessageType::kLayerReady,
                                           MessageType::kPrefillDone, MessageType::kRelease,
                                           MessageType::kAbort,       MessageType::kPing,
                                           MessageType::kPong,        MessageType::kAuthHello,
                                           MessageType::kAuthChallenge, MessageType::kAuthProof};
  static_assert(std::size(kTypes) == std::variant_size_v<Body>);
  return kTypes[body.index()];
}

std::optional<uint16_t> compatibleVersion(uint16_t peer_min, uint16_t peer_max) {
  const uint16_t lo = std::max(kMinVersion, peer_min);
  const uint16_t hi = std::min(kMaxVersion, peer_max);
  if (lo > hi) return std::nullopt;
  return hi;
}

void encode(const Message& m, std::vector<uint8_t>* out) {
  const size_t start = out->size();
  Writer w(out);
  w.put(kMagic);
  w.put(kVersion);
  w.put(static_cast<uint16_t>(typeOf(m.body)));
  w.put(m.transfer_id);
  w.put(uint32_t{0});  // payload_len, patched below
  w.put(uint32_t{0});
  std::visit([&](const auto& b) { encodeBody(b, w); }, m.body);
  const uint32_t len = static_cast<uint32_t>(out->size() - start - kHeaderSize);
  std::memcpy(out->data() + start + 16, &len, sizeof(len));
}

std::vector<uint8_t> encode(const Message& m) {
  std::vector<uint8_t> out;
  encode(m, &out);
  return out;
}

absl::StatusOr<Message> decode(std::span<const uint8_t> data, const DecodeLimits& limits) {
  if (data.size() < kHeaderSize) {
    return absl::InvalidArgumentError(strCat("kvproto: message of ", data.size(), " bytes is shorter than the ", kHeaderSize, "-byte header"));
  }
  Reader r(data);
  const uint32_t magic = r.get<uint32_t>("magic");
  const uint16_t version = r.get<uint16_t>("version");
  const uint16_t type = r.get<uint16_t>("type");
  Message m;
  m.transfer_id = r.get<uint64_t>("transfer_id");
  const uint32_t payload_len = r.get<uint32_t>("payload_len");
  r.get<uint32_t>("reserved");
  if (magic != kMagic) return absl::InvalidArgumentError(strCat("kvproto: bad magic 0x", magic, " (not a Tandem KV message)"));
  // A Hello or AuthHello of any ranged version decodes, so a peer of another
  // version is refused by name (compatibleVersion) rather than as malformed.
  const bool hello = type == static_cast<uint16_t>(MessageType::kHello);
  const bool auth_hello = type == static_cast<uint16_t>(MessageType::kAuthHello);
  const bool version_ok = hello        ? version >= kFirstRangedHelloVersion
                          : auth_hello ? version >= kFirstAuthVersion
                                       : version >= kMinVersion && version <= kMaxVersion;
  if (!version_ok) {
    return absl::InvalidArgumentError(strCat("kvproto: unsupported version ", version, " (this agent speaks ",
                                             kMinVersion, " to ", kMaxVersion, ")"));
  }
  if (payload_len != r.remaining()) {
    return invalid(m.transfer_id, strCat("payload_len ", payload_len, " but ", r.remaining(), " bytes follow the header"));
  }
  switch (static_cast<MessageType>(type)) {
    case MessageType::kHello: {
      Hello h;
      h.min_version = r.get<uint16_t>("min_version");
      h.max_version = r.get<uint16_t>("max_version");
      h.model_fingerprint = r.get<uint64_t>("model_fingerprint");
      h.hash_root = r.get<uint64_t>("hash_root");
      if (r.ok() && h.min_version > h.max_version) {
        r.fail(strCat("version range [", h.min_version, ", ", h.max_version, "] is empty"));
      }
      const auto role = r.get<uint16_t>("role");
      h.num_layers = r.get<uint16_t>("num_layers");
      h.num_blocks = r.get<uint32_t>("num_blocks");
      h.block_size = r.get<uint16_t>("block_size");
      h.num_kv_heads = r.get<uint16_t>("num_kv_heads");
      h.head_dim = r.get<uint16_t>("head_dim");
      const auto dtype = r.get<uint16_t>("dtype");
      h.region_base = r.get<uint64_t>("region_base");
      h.rkey = r.bytes("rkey", limits.max_string);
      h.peer_name = r.bytes("peer_name", limits.max_string);
      if (version >= kFirstTensorParallelVersion) {  // before, every agent held all KV heads: the defaults
        h.tp_rank = r.get<uint16_t>("tp_rank");
        h.tp_world = r.get<uint16_t>("tp_world");
        h.kv_head_begin = r.get<uint16_t>("kv_head_begin");
        if (r.ok() && h.tp_world == 0) r.fail("tp_world is 0: a model runs on at least one rank");
        if (r.ok() && h.tp_rank >= h.tp_world) {
          r.fail(strCat("tp_rank ", h.tp_rank, " is outside the ", h.tp_world, " ranks [0, ", h.tp_world, ")"));
        }
      }
      if (version > kMaxVersion) r.skipRest();  // a newer sender's appended fields
      if (r.ok() && !knownRole(role)) r.fail(strCat("unknown role ", role));
      if (r.ok() && dtype != static_cast<uint16_t>(KvDtype::kFloat32) &&
          dtype != static_cast<uint16_t>(KvDtype::kBfloat16)) {
        r.fail(strCat("unsupported KV dtype ", dtype));
      }
      h.role = static_cast<PeerRole>(role);
      h.dtype = static_cast<KvDtype>(dtype);
      m.body = std::move(h);
      break;
    }
    case MessageType::kPrefillRequest: {
      PrefillRequest p;
      p.deadline_ms = r.get<uint32_t>("deadline_ms");
      p.lease_ms = r.get<uint32_t>("lease_ms");
      p.tokens = r.list<uint32_t>("tokens", limits.max_tokens);
      p.temperature = r.get<float>("temperature");
      p.top_p = r.get<float>("top_p");
      p.top_k = r.get<uint32_t>("top_k");
      uint64_t seed = r.get<uint64_t>("seed");
      uint8_t has_seed = r.get<uint8_t>("has_seed");
      if (r.ok() && has_seed > 1) r.fail(strCat("has_seed is ", has_seed, ", expected 0 or 1"));
      if (r.ok() && has_seed == 0 && seed != 0) r.fail("seed is set but has_seed is 0");
      if (has_seed == 1) p.seed = seed;
      if (r.ok() && p.tokens.empty()) r.fail("empty prompt");
      m.body = std::move(p);
      break;
    }
    case MessageType::kPrefillAccepted: {
      PrefillAccepted a;
      a.num_cached_tokens = r.get<uint32_t>("num_cached_tokens");
      a.lease_ms = r.get<uint32_t>("lease_ms");
      a.block_ids = r.list<uint32_t>("block_ids", limits.max_blocks);
      for (size_t i = 0; r.ok() && i < a.block_ids.size(); ++i) {
        if (a.block_ids[i] >= limits.num_blocks) {
          r.fail(strCat("block_ids[", i, "] = ", a.block_ids[i], " is outside the peer's pool of ", limits.num_blocks, " blocks"));
        }
      }
      m.body = std::move(a);
      break;
    }
    case MessageType::kLayerReady: {
      LayerReady l;
      l.layer = r.get<uint16_t>("layer");
      l.first_block = r.get<uint32_t>("first_block");
      l.checksums = r.list<uint64_t>("checksums", limits.max_blocks);
      if (r.ok() && l.layer >= limits.num_layers) r.fail(strCat("layer ", l.layer, " is outside the model's ", limits.num_layers, " layers"));
      if (r.ok() && static_cast<uint64_t>(l.first_block) + l.checksums.size() > limits.max_blocks) {
        r.fail(strCat("blocks [", l.first_block, ", ", static_cast<uint64_t>(l.first_block) + l.checksums.size(),
                      ") exceed the limit of ", limits.max_blocks, " blocks"));
      }
      m.body = std::move(l);
      break;
    }
    case MessageType::kPrefillDone:
      m.body = PrefillDone{r.get<uint32_t>("first_token")};
      break;
    case MessageType::kRelease: m.body = Release{}; break;
    case MessageType::kAbort: {
      Abort a;
      uint16_t reason = r.get<uint16_t>("reason");
      a.message = r.bytes("message", limits.max_string);
      if (r.ok() && (reason < 1 || reason > 7)) r.fail(strCat("unknown failure reason ", reason));
      a.reason = static_cast<FailureReason>(reason);
      m.body = std::move(a);
      break;
    }
    case MessageType::kPing: m.body = Ping{}; break;
    case MessageType::kPong: m.body = Pong{}; break;
    case MessageType::kAuthHello: {
      AuthHello h;
      h.min_version = r.get<uint16_t>("min_version");
      h.max_version = r.get<uint16_t>("max_version");
      if (r.ok() && h.min_version > h.max_version) {
        r.fail(strCat("version range [", h.min_version, ", ", h.max_version, "] is empty"));
      }
      const auto role = r.get<uint16_t>("role");
      h.nonce = fixedBytes(r, "nonce", kAuthNonceSize);
      h.key_ids = r.list<uint64_t>("key_ids", kMaxAuthKeys);
      h.peer_name = r.bytes("peer_name", limits.max_string);
      if (version > kMaxVersion) r.skipRest();  // a newer sender's appended fields
      if (r.ok() && !knownRole(role)) r.fail(strCat("unknown role ", role));
      h.role = static_cast<PeerRole>(role);
      m.body = std::move(h);
      break;
    }
    case MessageType::kAuthChallenge: {
      AuthChallenge c;
      const auto role = r.get<uint16_t>("role");
      c.nonce = fixedBytes(r, "nonce", kAuthNonceSize);
      c.key_id = r.get<uint64_t>("key_id");
      c.mac = fixedBytes(r, "mac", kAuthMacSize);
      c.peer_name = r.bytes("peer_name", limits.max_string);
      if (r.ok() && !knownRole(role)) r.fail(strCat("unknown role ", role));
      c.role = static_cast<PeerRole>(role);
      m.body = std::move(c);
      break;
    }
    case MessageType::kAuthProof:
      m.body = AuthProof{fixedBytes(r, "mac", kAuthMacSize)};
      break;
    default: return invalid(m.transfer_id, strCat("unknown message type ", type));
  }
  if (!r.ok()) return invalid(m.transfer_id, r.error());
  if (r.remaining() != 0) return invalid(m.transfer_id, strCat(r.remaining(), " unexpected bytes after the payload"));
  return m;
}

uint64_t layerBlockChecksum(std::span<const std::byte> bytes) { return tandem::layerBlockChecksum(bytes); }

}  // namespace tandem::kvproto
