#pragma once
// What the prefill and decode services share about their KV transport:
// the options and dependencies they run with, how the transport is
// started over the engine's KV pool, and what a Hello says about it.

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_set>

#include "agent/peer_directory.h"
#include "agent/peer_health.h"
#include "agent/prefill_deadline.h"
#include "agent/transport/kv_transport.h"
#include "agent/transport/ucx_transport.h"
#include "src/auth/pool_key.h"
#include "src/common/block_hash.h"
#include "src/common/clock.h"
#include "src/common/log.h"
#include "src/kvproto/kvproto.h"

namespace tandem::engine {
class EngineLoop;
struct KvLayout;
}  // namespace tandem::engine

namespace tandem::agent {

class PdMetrics;

// Which tensor-parallel shard of the model's KV an agent holds
// (engine/model/tensor_parallel.h): rank `rank` of `world`, KV heads
// [kv_head_begin, kv_head_begin + the layout's num_kv_heads). Sent in the
// Hello, so a decode rank pulls only from the prefill rank with the same
// heads. Nothing sets it yet: an agent with --tensor-parallel keeps the
// transport in rank 0 with every rank's KV heads (Engine::kvRegionLayout),
// so every agent is rank 0 of 1 holding all the KV heads.
struct TensorParallelShard {
  uint16_t rank = 0;
  uint16_t world = 1;
  uint16_t kv_head_begin = 0;
};

// What KV of this agent is KV of: P and D refuse a peer whose Hello
// names another model, hash root or tensor-parallel shard (docs/pd.md).
struct ModelIdentity {
  uint64_t fingerprint = 0;              // engine/model/model_fingerprint.h, or the operator's --model-fingerprint
  BlockHash hash_root = kBlockHashRoot;  // blockHashRoot(fingerprint, --cache-salt): the engine's
  TensorParallelShard tensor_parallel;   // PdOptions::tensor_parallel
};

struct PdOptions {
  transport::TransportOptions transport;
  uint64_t model_fingerprint = 0;                    // sent in the Hello; the hash root comes from the engine
  TensorParallelShard tensor_parallel;               // sent in the Hello; the default until agents run TP
  std::chrono::milliseconds lease_ttl{30000};        // P: how long KV stays pinned without a Release
  // D: P must deliver all layers within this of the request (the ceiling;
  // once P accepted, prefill_deadline's work-proportional deadline may be earlier).
  std::chrono::milliseconds prefill_timeout{60000};
  double checksum_rate = 1.0;                        // D: fraction of transfers whose checksums are verified
  std::shared_ptr<const PeerDirectory> prefill_peers;  // D: its prefill agents (read at start)
  int direct_max_suffix_tokens = 256;  // D: direct-to-D when the session is resident and at most this much is new
  // D: heartbeats to each prefill peer and its failure counts (peer_health.h).
  PeerHealthOptions peer_health;
  // D: how long a prefill peer gets once it accepted (prefill_deadline.h).
  PrefillDeadlineOptions prefill_deadline;
  // The pool's keys for the KV channel's handshake (src/auth/kv_handshake.h);
  // null: insecure (the empty key, which only other insecure agents hold).
  std::shared_ptr<auth::PoolKeySource> pool_keys;
};

// The real transport: UcxTransport::start.
transport::KvTransportFactory ucxTransportFactory();

// What a P/D service runs on; nothing here is owned, all must outlive it.
struct PdEnv {
  engine::EngineLoop& loop;
  PdMetrics& metrics;
  const Clock& clock;
  transport::KvTransportFactory transport;  // starts the KV transport; empty: ucxTransportFactory()
};

// Starts the transport over the engine's KV pool `kv`: the memory UCX
// allocated (options.transport.pool, which the engine was given) or the
// engine's own allocation, and hands it to `hold` (the service keeps it).
// A peer may connect as soon as the listener exists: none of `callbacks`
// runs before `hold` returned (or start failed), so they may use what it
// stored.
absl::Status startKvTransport(const PdEnv& env, const PdOptions& options, std::span<std::byte> kv,
                              transport::TransportCallbacks callbacks,
                              const std::function<void(std::unique_ptr<transport::KvTransport>)>& hold);

// The Hello that opens every connection: this side's protocol versions,
// model identity (its tensor-parallel shard included), KV layout and region.
kvproto::Hello helloFor(kvproto::PeerRole role, const ModelIdentity& model, const engine::KvLayout& layout,
                        const transport::KvTransport& t, std::string name);

// Why a peer whose Hello is `peer` cannot work with this side: no common
// protocol version, another model fingerprint, another hash root (another
// --cache-salt), another KV dtype (--kv-dtype), or another tensor-parallel
// rank, world size or KV-head
// range than this side's (`mine` and `layout`'s num_kv_heads). `reason` is
// the tandem_kv_control_messages_rejected_total label (incompatible_version,
// fingerprint_mismatch, hash_root_mismatch, kv_dtype_mismatch,
// tensor_parallel_mismatch);
// `message` names both sides' values.
struct PeerRefusal {
  std::string_view reason;
  std::string message;
};
std::optional<PeerRefusal> refusePeer(const ModelIdentity& mine, const engine::KvLayout& layout,
                                      const kvproto::Hello& peer);

// The keys the KV handshake uses now: options.pool_keys', or the insecure key.
std::shared_ptr<const auth::PoolKeys> currentPoolKeys(const PdOptions& options);

// Counts every failed KV handshake (tandem_kv_auth_failures_total{reason})
// and logs it once per peer address, so a scanner or a misconfigured pool
// cannot flood the log. Thread-safe.
class AuthFailureLog {
 public:
  AuthFailureLog(PdMetrics& metrics, std::string component) : metrics_(metrics), log_(std::move(component)) {}
  void report(const std::string& peer_address, std::string_view reason, std::string_view detail);

 private:
  static constexpr size_t kMaxAddresses = 4096;  // then it starts over
  PdMetrics& metrics_;
  Logger log_;
  absl::Mutex mu_;
  std::unordered_set<std::string> logged_ ABSL_GUARDED_BY(mu_);
};

// Byte offset of (layer, block) in a KvStorage region with this shape.
inline uint64_t layerBlockOffset(uint32_t layer, uint32_t block, uint32_t num_blocks, uint64_t bytes_per_layer_block) {
  return (static_cast<uint64_t>(layer) * num_blocks + block) * bytes_per_layer_block;
}

}  // namespace tandem::agent
