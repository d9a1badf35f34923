#include "agent/pd_transport.h"

#include <future>

#include "agent/pd_metrics.h"
#include "engine/kv/kv_storage.h"
#include "engine/model/model_fingerprint.h"
#include "src/common/strings.h"

namespace tandem::agent {

transport::KvTransportFactory ucxTransportFactory() {
  return [](const transport::TransportOptions& options,
            transport::TransportCallbacks callbacks) -> absl::StatusOr<std::unique_ptr<transport::KvTransport>> {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<transport::UcxTransport> t,
                            transport::UcxTransport::start(options, std::move(callbacks)));
    return std::unique_ptr<transport::KvTransport>(std::move(t));
  };
}

absl::Status startKvTransport(const PdEnv& env, const PdOptions& options, std::span<std::byte> kv,
                              transport::TransportCallbacks callbacks,
                              const std::function<void(std::unique_ptr<transport::KvTransport>)>& hold) {
  transport::TransportOptions to = options.transport;
  if (kv.empty()) {
    return absl::FailedPreconditionError(
        "the engine's KV pool is in device memory, neither staged through host memory for the transport "
        "(EngineOptions::kv_staging) nor registered by it (EngineOptions::kv_direct)");
  }
  if (!to.pool) {
    to.region = kv;
  } else if (to.pool->bytes().data() != kv.data() || to.pool->bytes().size() < kv.size()) {
    return absl::InternalError("the engine's KV pool is not the transport's UCX region");
  }
  auto held = std::make_shared<std::promise<void>>();
  std::shared_future<void> ready = held->get_future().share();
  transport::TransportCallbacks gated;
  if (callbacks.on_accept) {
    gated.on_accept = [ready, f = std::move(callbacks.on_accept)](transport::ConnId c) {
      ready.wait();
      f(c);
    };
  }
  if (callbacks.on_message) {
    gated.on_message = [ready, f = std::move(callbacks.on_message)](transport::ConnId c, std::vector<uint8_t> b) {
      ready.wait();
      f(c, std::move(b));
    };
  }
  if (callbacks.on_disconnect) {
    gated.on_disconnect = [ready, f = std::move(callbacks.on_disconnect)](transport::ConnId c, absl::Status s) {
      ready.wait();
      f(c, std::move(s));
    };
  }
  const transport::KvTransportFactory& start = env.transport ? env.transport : ucxTransportFactory();
  absl::StatusOr<std::unique_ptr<transport::KvTransport>> t = start(to, std::move(gated));
  if (t.ok()) hold(std::move(*t));
  held->set_value();
  return t.status();
}

namespace {
kvproto::KvDtype wireKvDtype(engine::KvDtype d) {
  return d == engine::KvDtype::kBfloat16 ? kvproto::KvDtype::kBfloat16 : kvproto::KvDtype::kFloat32;
}
}  // namespace

kvproto::Hello helloFor(kvproto::PeerRole role, const ModelIdentity& model, const engine::KvLayout& l,
                        const transport::KvTransport& t, std::string name) {
  return {.min_version = kvproto::kMinVersion,
          .max_version = kvproto::kMaxVersion,
          .model_fingerprint = model.fingerprint,
          .hash_root = model.hash_root.value(),
          .role = role,
          .num_layers = static_cast<uint16_t>(l.num_layers),
          .num_blocks = static_cast<uint32_t>(l.num_blocks),
          .block_size = static_cast<uint16_t>(l.block_size),
          .num_kv_heads = static_cast<uint16_t>(l.num_kv_heads),
          .head_dim = static_cast<uint16_t>(l.head_dim),
          .dtype = wireKvDtype(l.dtype),
          .region_base = t.regionBase(),
          .rkey = t.packedRkey(),
          .peer_name = std::move(name),
          .tp_rank = model.tensor_parallel.rank,
          .tp_world = model.tensor_parallel.world,
          .kv_head_begin = model.tensor_parallel.kv_head_begin};
}

namespace {

// "rank 1 of 2, KV heads [4, 8)"
std::string shardName(uint16_t rank, uint16_t world, uint16_t kv_head_begin, uint16_t num_kv_heads) {
  return strCat("rank ", rank, " of ", world, ", KV heads [", kv_head_begin, ", ",
                static_cast<uint32_t>(kv_head_begin) + num_kv_heads, ")");
}

}  // namespace

std::optional<PeerRefusal> refusePeer(const ModelIdentity& mine, const engine::KvLayout& layout,
                                      const kvproto::Hello& peer) {
  if (!kvproto::compatibleVersion(peer.min_version, peer.max_version)) {
    return PeerRefusal{
        "incompatible_version",
        strCat("the peer ", peer.peer_name, " speaks kvproto versions [", peer.min_version, ", ", peer.max_version,
               "], this agent [", kvproto::kMinVersion, ", ", kvproto::kMaxVersion, "]: no common version")};
  }
  if (peer.model_fingerprint != mine.fingerprint) {
    return PeerRefusal{
        "fingerprint_mismatch",
        strCat("the peer ", peer.peer_name, " serves the model with fingerprint ",
               engine::fingerprintHex(peer.model_fingerprint), ", this agent ",
               engine::fingerprintHex(mine.fingerprint),
               ": another checkpoint, tokenizer or chat template (--model-fingerprint), or another --dtype")};
  }
  if (peer.hash_root != mine.hash_root.value()) {
    return PeerRefusal{
        "hash_root_mismatch",
        strCat("the peer ", peer.peer_name, " chains block hashes from root ", engine::fingerprintHex(peer.hash_root),
               ", this agent from ", engine::fingerprintHex(mine.hash_root.value()), ": another --cache-salt")};
  }
  if (peer.dtype != wireKvDtype(layout.dtype)) {
    return PeerRefusal{"kv_dtype_mismatch",
                       strCat("the peer ", peer.peer_name, " keeps its KV cache in ", kvproto::kvDtypeName(peer.dtype),
                              ", this agent in ", engine::kvDtypeName(layout.dtype),
                              ": give both the same --kv-dtype (KV blocks move byte for byte)")};
  }
  // Checked before the layout: a rank's num_kv_heads is its share, so
  // another shard would otherwise pass for another model's layout.
  const TensorParallelShard& tp = mine.tensor_parallel;
  const auto kv_heads = static_cast<uint16_t>(layout.num_kv_heads);
  if (peer.tp_rank != tp.rank || peer.tp_world != tp.world || peer.kv_head_begin != tp.kv_head_begin ||
      peer.num_kv_heads != kv_heads) {
    return PeerRefusal{
        "tensor_parallel_mismatch",
        strCat("the peer ", peer.peer_name, " is tensor-parallel ",
               shardName(peer.tp_rank, peer.tp_world, peer.kv_head_begin, peer.num_kv_heads), ", this agent ",
               shardName(tp.rank, tp.world, tp.kv_head_begin, kv_heads),
               ": a decode rank must pull from the prefill rank of the same rank and KV heads")};
  }
  return std::nullopt;
}

std::shared_ptr<const auth::PoolKeys> currentPoolKeys(const PdOptions& options) {
  return options.pool_keys ? options.pool_keys->keys() : auth::PoolKeys::insecure();
}

void AuthFailureLog::report(const std::string& peer_address, std::string_view reason, std::string_view detail) {
  metrics_.authFailure(reason);
  {
    absl::MutexLock lock(&mu_);
    if (logged_.size() >= kMaxAddresses) logged_.clear();
    if (!logged_.insert(peer_address).second) return;
  }
  log_.warn("a KV connection failed authentication (logged once per address)",
            {{"peer_address", peer_address}, {"reason", reason}, {"detail", detail}});
}

}  // namespace tandem::agent
