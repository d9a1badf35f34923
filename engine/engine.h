#pragma once
// The inference engine: one model, one paged KV pool, one scheduler, stepped
// by one owning thread (nano-vllm's shape: step() = schedule, run, postprocess).
//
//   auto engine = Engine::create(options, weights, std::make_unique<CpuBackend>(), tokenizer, clock);
//   RequestId id = (*engine)->addRequest(spec, [](const RequestUpdate& u) { ... });
//   while ((*engine)->hasWork()) (*engine)->step();
//
// Every way a request ends (eos, length, stop, cancel, timeout, preemption
// limit, rejection, error) goes through one private finish() that leaves the
// scheduler, releases the KV (or keeps it resident under the session id), and
// delivers the single final update.
//
// Thread-safety: none. All calls, and all update callbacks, happen on the
// engine's owning thread; other threads talk to it through a queue (the
// agent's job). Callbacks must not call back into the engine.

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/kv/block_manager.h"
#include "engine/kv/kv_storage.h"
#include "engine/kv/layer_announcer.h"
#include "engine/kv/lease_table.h"
#include "engine/kv/session_store.h"
#include "engine/routable_state.h"
#include "engine/sched/request.h"
#include "engine/sched/scheduler.h"
#include "src/common/block_hash.h"
#include "src/common/clock.h"
#include "src/common/status.h"

namespace tandem::engine {

class Backend;
class LlamaModel;
class RankGroupLeader;
class Tokenizer;
struct ModelWeights;
struct SequenceChunk;

struct EngineOptions {
  int num_blocks = 512;
  int block_size = 16;
  // What the KV pool stores: fp32, or bf16 for half the memory per block
  // (K and V rounded to bf16 as they are written; kv_storage.h).
  KvDtype kv_dtype = KvDtype::kFloat32;
  int max_num_batched_tokens = 512;  // token budget of one step (decodes count 1 each)
  int max_num_seqs = 64;             // running at once; must not exceed the token budget
  int max_waiting = 1024;            // waiting-queue bound; beyond it requests are rejected kQueueFull
  int max_model_len = 0;             // 0 = the model's max_position_embeddings
  bool enable_prefix_cache = true;
  // Expected output for the admission reservation: 0 reserves max_tokens
  // (never runs out); N > 0 reserves min(max_tokens, N), e.g. a p95 of
  // observed output lengths, and relies on preemption when it is exceeded.
  int expected_output_tokens = 0;
  int max_preemptions = 8;  // beyond this a request finishes kPreempted
  int session_low_watermark_blocks = 0;
  int max_session_evictions_per_step = 4;  // for the watermark, admission and running requests together
  uint64_t seed = 0;                       // seeds unseeded requests' sampling; 0 = from std::random_device
  // Root of the block-hash chain of every sequence (prefix cache, session
  // chains): blockHashRoot(model fingerprint, cache salt) in the agent, so
  // KV of another model or tenant never matches. The default is the
  // unkeyed root (src/common/block_hash.h).
  BlockHash block_hash_root = kBlockHashRoot;
  // Where the KV pool lives. Unset: the engine allocates it. Set: called
  // once by create() with the pool's size in bytes (the agent returns memory
  // UCX allocated, so a shared-memory peer can map it); the memory must be
  // that large and 64-byte aligned, or create() fails with the reason.
  std::function<absl::StatusOr<KvMemory>(size_t bytes)> kv_memory;
  // With a pool in device memory (KvMemory::device, e.g. a GPU backend's
  // kvMemory), host memory of the pool's size that a transport reads and
  // writes instead (the agent returns memory UCX allocated): the engine
  // downloads each layer block of a leased prefill there before announcing
  // it, and uploads an import's blocks from there when the import
  // completes. Unset with a device pool: kvRegion() is empty (no P/D).
  // Must be host memory of the pool's size (with tensor_parallel, the
  // whole model's: world times the pool), 64-byte aligned.
  std::function<absl::StatusOr<KvMemory>(size_t bytes)> kv_staging;
  // With a pool in device memory, instead of kv_staging: the transport
  // registers the pool itself (a UCX that reads and writes GPU memory,
  // GPUDirect RDMA), so kvRegion() is the pool in device memory, nothing is
  // staged or uploaded, and checksums of announced layers and of pulled
  // blocks are computed on the device (kvRegionChecksums). The engine then
  // waits for a layer's launches before announcing it (the checksums'
  // download). Not with kv_staging or tensor_parallel; needs a device pool.
  bool kv_direct = false;
  // Test hook (tandem-agent --scripted-output, which needs
  // --allow-test-hooks): when not empty, request k (k = 1, 2, ... in
  // submission order) replies scripted_replies[(k - 1) % size]: its n-th
  // output token is the reply's n-th instead of a sampled one, then EOS.
  // The model still runs every step; only sampling is replaced.
  std::vector<std::vector<TokenId>> scripted_replies;
  // Sample where the backend makes the logits when it can
  // (Backend::samplesLogits: a device backend downloads one token per row,
  // not the logits). The same tokens either way; off samples on the host.
  bool sample_on_device = true;
  // Tensor parallelism across processes (engine/model/rank_group.h): this
  // engine is rank 0 of the group, create()'s weights are its shard
  // (shardWeights), and every step's block copies and batch run on the
  // other ranks too. A failed rank fails the engine like a failed backend
  // (backendStatus). With kv_staging (P/D) the staging copy holds every
  // rank's KV heads (kvRegionLayout) and is filled and read between steps
  // (prefill layers are announced after the step that computed them).
  // Unset: one process holds the whole model.
  std::shared_ptr<RankGroupLeader> tensor_parallel;
};

// What one step did, for the agent's metrics. Hit rates are derived by the
// reader: prefix hit rate = prefix_hit_tokens / prefix_query_tokens.
struct StepStats {
  int num_scheduled_tokens = 0;
  int num_prefill_tokens = 0;  // tokens of chunks that were not single-token decodes
  int num_decode_tokens = 0;
  int num_running = 0;  // after the step
  int num_waiting = 0;
  int queue_tokens = 0;     // uncomputed prompt tokens of waiting and prefilling sequences
  int num_free_blocks = 0;  // available: free + cached-unreferenced
  int num_total_blocks = 0;
  int num_sessions_resident = 0;
  int num_session_blocks = 0;  // blocks only resident sessions hold (evicting them all frees these)
  int prefix_hit_tokens = 0;  // of sequences admitted this step
  int prefix_query_tokens = 0;
  int num_preemptions = 0;
  int num_session_evictions = 0;  // resident sessions evicted this step (watermark, admission, growth)
  int num_finished = 0;  // requests that ended during the step (any reason)
  // Whether the step changed anything: computed tokens, admitted, preempted,
  // finished, evicted a session or released a lease. A step that did not
  // would do the same again until a command or a deadline (nextDeadline())
  // changes the engine, so the owning thread may sleep until then.
  bool progressed = false;
  Duration schedule_time{0};
  Duration model_time{0};
  Duration postprocess_time{0};
  // A staged KV pool (Engine::kvStaged): bytes copied to the staging copy
  // (announced prefill layers) and from it (completed imports), and the time
  // those copies took, since the previous step's stats (an import completes
  // between steps).
  int64_t kv_staged_to_host_bytes = 0;
  int64_t kv_staged_to_device_bytes = 0;
  Duration kv_staging_time{0};
  // With tensor parallelism: time rank 0 waited for the other ranks (their
  // partials, Dones and staged KV) since the previous step's stats.
  Duration tensor_parallel_wait_time{0};
  // Decode steps the backend ran as CUDA graphs since the previous step's
  // stats (BackendStats::graph_steps_*): at most one of the three is 1.
  int graph_steps_captured = 0;
  int graph_steps_replayed = 0;
  int graph_steps_left = 0;
};

// Tokens a request reserves at admission: prompt + expected output
// (max_tokens, or expected_output_tokens for requests that may be
// preempted), capped at the context. `options` must be resolved (an
// engine's options()).
int reservedTokens(const EngineOptions& options, int num_prompt_tokens, const RequestSpec& spec);
// Why a pool with `options` could never admit the request (the
// RejectReason::kCapacity message), or nothing. Pure: the agent checks it
// before opening a stream; Engine::addRequest rejects with it.
std::optional<std::string> capacityRejection(const EngineOptions& options, int num_prompt_tokens,
                                             const RequestSpec& spec);

class Engine {
 public:
  // Validates options against the model and allocates the KV pool.
  // `tokenizer` may be null: then updates carry tokens only and stop strings are refused.
  static absl::StatusOr<std::unique_ptr<Engine>> create(const EngineOptions& options,
                                                        std::shared_ptr<const ModelWeights> weights,
                                                        std::unique_ptr<Backend> backend,
                                                        std::shared_ptr<const Tokenizer> tokenizer, const Clock& clock);
  ~Engine();

  // Queues a request. A request refused at the door gets its final update
  // (kRejected with a RejectReason and message) before this returns.
  RequestId addRequest(RequestSpec spec, UpdateCallback on_update);
  // Ends a live request through the cleanup path with `reason` (kCancelled,
  // kTimeout, kError). Unknown or finished ids are ignored. Returns whether it
  // was live. An importing request is not ended here: its importer is asked
  // to stop (see RequestSpec::import_kv).
  bool cancel(RequestId id, FinishReason reason = FinishReason::kCancelled, std::string message = {});
  // One iteration: schedule, run the model, sample, finish what is done.
  StepStats step();
  bool hasWork() const { return !live_.empty(); }
  // The earliest time at which time alone changes the engine: a live
  // request's deadline (not an importing one's) or a lease's expiry.
  // Nothing when there is none.
  std::optional<MonoTime> nextDeadline() const;
  // The clock it was created with (not owned), for its owning thread's waits.
  const Clock& clock() const { return clock_; }
  // The root its block hashes chain from (EngineOptions::block_hash_root):
  // what a router needs to compute the same hashes (worker_state's hash_root).
  BlockHash blockHashRoot() const { return options_.block_hash_root; }
  // The gauges of StepStats (running, waiting, queue tokens, blocks, sessions)
  // as they are now, with the per-step counters zero. For observers that must
  // see changes made between steps (a cancel when the engine then idles).
  StepStats currentStats() const;

  bool dropSession(const SessionId& id) { return sessions_.drop(id); }

  // --- P/D (see RequestSpec::lease and ::import_kv) ---
  // The state lives beside the session store: held leases in LeaseTable,
  // announcement progress in LayerAnnouncer, import states in kv_import.h.

  // Announces final KV of leased prefills, so a peer can pull it while the
  // rest computes: blocks [first_block, first_block + blocks.size()) of the
  // list reported in the request's kv_blocks update hold their final KV for
  // layer `layer`. Called during the step that runs a prompt's last chunk,
  // once per layer as it lands (for the blocks not announced yet); and after
  // a step that ran an earlier chunk, for every layer, for the blocks that
  // chunk completed. Every block is announced exactly once per layer
  // (layer_announcer.h).
  using LayerReady = engine::LayerReady;
  using LayerObserverFn = std::function<void(int layer, std::span<const LayerReady> prefills)>;
  void setLayerObserver(LayerObserverFn fn) { layer_observer_ = std::move(fn); }

  // The prompt KV of an importing request has landed in its blocks: it
  // continues as if it had computed the prompt, with `first_token` as its
  // first output token. Returns false if `id` is not an importing request.
  bool completeImport(RequestId id, TokenId first_token);
  // Ends an importing request (the importer's transfers are over). Returns
  // false if `id` is not an importing request.
  bool abortImport(RequestId id, FinishReason reason, std::string message);
  // The importer gave up before any KV was written into the request's
  // blocks (its prefill peer stalled before accepting): the request computes
  // its prompt here instead, keeping its blocks and place. Returns false if
  // `id` is not an importing request.
  bool computeImportLocally(RequestId id);
  // Unpins a lease's blocks. Returns whether the lease existed.
  bool releaseLease(uint64_t lease_id);
  // Releases leases whose expiry has passed; returns how many. step() does
  // this too; call it when idle.
  int expireLeases();
  int numLeases() const { return leases_.numLeases(); }
  // Prefix-cache "stored"/"removed" events since the last call (for the router).
  std::vector<KvEvent> drainKvEvents() { return blocks_.drainEvents(); }

  // --- What routers see of this engine (routable_state.h) ---
  // Prefix-cache events and session residency changes since the last call
  // (drainKvEvents() and this take from the same prefix-cache events).
  // Call regularly (the agent does after every step): the events queue up until then.
  RoutableChanges drainRoutableChanges();

  // Pool invariants plus ownership: every block's reference count equals the
  // number of live sequences, resident sessions and held leases that hold it.
  absl::Status checkInvariants() const;

  const EngineOptions& options() const { return options_; }
  int numAvailableBlocks() const { return blocks_.numAvailable(); }
  int numFreeBlocks() const { return blocks_.numFree(); }
  int numSessionsResident() const { return sessions_.numResident(); }
  int numLive() const { return static_cast<int>(live_.size()); }
  const KvStorage& kv() const { return *kv_; }
  // The memory the transport registers and reads and writes only as the
  // P/D protocol allows: the KV pool itself, or with a pool in device
  // memory its staging copy (EngineOptions::kv_staging; empty without one).
  // With kv_direct, the device pool: device memory, which only the
  // transport (and kvRegionChecksums) may touch, never the host.
  std::span<std::byte> kvRegion() {
    if (kvStaged()) return staging_.bytes;
    return kv_->onDevice() && !options_.kv_direct ? std::span<std::byte>() : kv_->bytes();
  }
  // kvRegion() is device memory (EngineOptions::kv_direct).
  bool kvRegionOnDevice() const { return options_.kv_direct; }
  // The checksums (layerBlockChecksum) of the layer blocks `items` of
  // kvRegion() into out[i]: on the device for a region in device memory (one
  // launch, after the launches before; a decode agent verifies pulled
  // blocks with it), else on the host. An error if the backend failed.
  // Engine thread.
  absl::Status kvRegionChecksums(std::span<const KvLayerBlock> items, std::span<uint64_t> out);
  // kvRegion()'s layout: the pool's, or with tensor parallelism and a
  // staging copy, the whole model's (every rank's KV heads, rank r's at
  // [r·KV/N, (r+1)·KV/N) of each token): what a peer reads is a one-process
  // agent's KV, whatever either side's group size.
  const KvLayout& kvRegionLayout() const { return kvStaged() ? staging_layout_ : kv_->layout(); }
  // kvRegion() is a host copy of the pool (a device pool's, or a
  // tensor-parallel group's every rank's), not the pool.
  bool kvStaged() const { return !staging_.bytes.empty(); }
  // The backend's first failure (a device error, a launch refused), or a
  // tensor-parallel rank's (EngineOptions::tensor_parallel); every step
  // fails from then on. Engine thread only (EngineLoop::failure()
  // publishes it to other threads).
  absl::Status backendStatus() const;
  // Whether the staging copy is page-locked for the device's copies
  // (Backend::pinKvHost), or why not; OK without staging. A
  // tensor-parallel group's is not pinned (it is filled on the host).
  const absl::Status& kvStagingPinned() const { return staging_pinned_; }

 private:
  Engine(const EngineOptions& options, std::shared_ptr<const ModelWeights> weights, std::unique_ptr<Backend> backend,
         std::unique_ptr<LlamaModel> model, std::shared_ptr<const Tokenizer> tokenizer, const Clock& clock,
         std::unique_ptr<KvStorage> kv, KvMemory staging, const KvLayout& staging_layout);
  RejectReason validate(const RequestSpec& spec, std::string* message) const;

  // The phases of step(), in order.
  // Ends requests whose deadline passed (not importing ones) and expired leases.
  // Returns whether anything ended.
  bool finishExpired(MonoTime now);
  // Runs the scheduler; ends requests preempted past their limit; copies
  // copy-on-write blocks; reports the blocks of imports admitted now.
  ScheduleResult schedule();
  // The model's input for the scheduled chunks; counts their tokens into *st.
  std::vector<SequenceChunk> buildBatch(std::span<const ScheduledChunk> chunks, MonoTime now, StepStats* st);
  // Reports leased prefills' blocks before the model writes them; returns
  // what the layer observer announces during the run.
  std::vector<LayerReady> reportLeasedPrefills(std::span<const ScheduledChunk> chunks);
  absl::Status runModel(std::span<const ScheduledChunk> chunks, const std::vector<SequenceChunk>& batch,
                        std::span<const LayerReady> during_run);
  // Whether this step's tokens are sampled by the backend (sampled_).
  bool samplingOnDevice() const;
  // Calls the layer observer for `ready` with their blocks' checksums
  // (kvRegionChecksums); with a staged pool, after copying layer `layer` of
  // their blocks to the staging copy. False, announcing
  // nothing, when the backend failed: during a run the step then fails with
  // the backend's status; after one the caller ends those prefills.
  bool announce(int layer, std::span<const LayerReady> ready);
  // A staged pool: every layer of `blocks` from the staging copy (an
  // import's, when it completes). False when the backend failed.
  bool stageIn(std::span<const BlockId> blocks);
  // Layer `layer` of `blocks` between the device pool and the staging copy.
  void copyStaged(int layer, std::span<const BlockId> blocks, bool to_host);
  // With tensor parallelism: `layers` of `blocks` between every rank's
  // cache and the staging copy (rank 0's through the backend, the others'
  // over their links). False when the backend or the group failed.
  bool stageGroup(std::span<const int32_t> layers, std::span<const BlockId> blocks, bool to_host);
  // Rank `rank`'s layer blocks (`rank_bytes`, its layout, layers outer)
  // into (to_staging) or out of its KV heads of the staging copy.
  void spliceHeads(int rank, std::span<std::byte> rank_bytes, std::span<const int32_t> layers,
                   std::span<const BlockId> blocks, bool to_staging);
  // Advances computed tokens, commits full blocks to the prefix cache,
  // announces what earlier chunks completed, samples where logits came out.
  void postprocess(std::span<const ScheduledChunk> chunks, const std::vector<SequenceChunk>& batch);

  void sample(Sequence* seq, std::span<const float> logits);
  // Appends a sampled (or imported) token and finishes the request if it is done.
  void acceptToken(Sequence* seq, TokenId tok);
  void reportKvBlocks(Sequence* seq, size_t num_blocks);
  void fillGauges(StepStats* st) const;
  // Decodes the newest output token into seq->text. On a stop string it
  // finishes the request (seq is destroyed) and returns true.
  bool appendText(Sequence* seq);
  // The single cleanup path.
  void finish(Sequence* seq, FinishReason reason, RejectReason reject = RejectReason::kNone, std::string message = {});
  void flushUpdate(Sequence* seq);

  EngineOptions options_;
  std::shared_ptr<const ModelWeights> weights_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<LlamaModel> model_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  const Clock& clock_;
  std::unique_ptr<KvStorage> kv_;
  // announce()'s copy of what it announces, with checksums (announce_sums_).
  std::vector<LayerReady> announced_;
  std::vector<KvLayerBlock> announce_blocks_;
  std::vector<uint64_t> announce_sums_;
  KvMemory staging_;  // the transport's host copy of the pool (kvRegion): a device pool's, or a group's
  KvLayout staging_layout_;  // its layout (kvRegionLayout)
  std::vector<std::byte> group_stage_;  // stageGroup's rank-0 layer blocks
  absl::Status staging_pinned_;  // Backend::pinKvHost's answer for staging_
  // Staging copies since the last step's stats (StepStats::kv_staged_*).
  int64_t staged_to_host_bytes_ = 0, staged_to_device_bytes_ = 0;
  Duration staging_time_{0};
  BlockManager blocks_;
  SessionStore sessions_;  // sessions_ and leases_ after blocks_: they release into the pool when destroyed
  LeaseTable leases_;
  LayerAnnouncer announcer_;
  Scheduler scheduler_;
  absl::flat_hash_map<RequestId, std::unique_ptr<Sequence>> live_;
  uint64_t next_id_ = 1;
  SamplerRng seed_rng_;
  size_t max_stop_len_ = 0;
  uint64_t num_finished_ = 0;  // requests ended so far, by any path
  LayerObserverFn layer_observer_;
  // The backend's graph counters (BackendStats::graph_steps_*) at the last step's stats.
  int64_t graph_captured_seen_ = 0, graph_replayed_seen_ = 0, graph_left_seen_ = 0;
  std::vector<float> logits_;
  // Device sampling (EngineOptions::sample_on_device): per chunk that wants
  // logits, its params, its draw (taken before the step, as the host
  // sampler takes it) and the token the backend sampled.
  std::vector<SamplingParams> sample_params_;
  std::vector<double> sample_draws_;
  std::vector<TokenId> sampled_;
  SamplerScratch sample_scratch_;
};

}  // namespace tandem::engine
