#pragma once
// Tensor parallelism across processes: one process per GPU of a pod
// (docs/engine.md, "Tensor parallelism across processes"). Rank 0, the
// leader, is the agent: it runs the engine (scheduler, prefix cache,
// sampling) and its shard of the model. Each other rank, a follower, holds
// its shard (shardWeights) and a KV cache of its KV heads with the leader's
// block count and size, and runs every step the leader runs, on the same
// block tables. The block ids mean the same on every rank, so only the
// leader keeps the books.
//
// Leader and follower talk over one connected stream socket per follower
// (a socketpair the leader made before starting the follower's process).
// Frames: magic "TPRG", u32 type, u64 payload bytes, then the payload, in
// host byte order (both ends are the same binary on the same machine):
//
//   follower -> leader  Hello    u16 rank, u16 world, i32 pid, i32 x5 the
//                                cache's layers, blocks, block size, KV
//                                heads, head_dim, u8 socket all-reduce:
//                                sent once its model is loaded
//   leader -> follower  Step     u32 copies, (i32 src, i32 dst) each; u32
//                                chunks, each: i32 start_pos, u8
//                                want_logits, u32 tokens, i32 each, u32
//                                blocks, i32 each
//   follower -> leader  Partial  its share of a row-parallel product (floats)
//   leader -> follower  Sum      every rank's share, added in rank order
//   follower -> leader  Done     i32 status code, the message (UTF-8)
//
// Between steps, for P/D (the transport's staging copy holds every rank's
// KV heads, on rank 0: Engine's kv_staging with tensor parallelism):
//
//   leader -> follower  StageOut u32 layers, i32 each; u32 blocks, i32 each
//   follower -> leader  KvData   those layer blocks of its cache (layers
//                                outer, blocks inner), or Done with an error
//   leader -> follower  StageIn  the same lists, then the bytes to write
//   follower -> leader  Done
//
// Partial and Sum cross the socket only with the socket all-reduce (host
// memory: the CPU backend and the CUDA emulator). The leader adds the
// partials in rank order, left to right, exactly as InProcessAllReduce does,
// so a group across processes computes the bits of an in-process group of
// the same size. On GPUs the all-reduce is NCCL's (nccl_group.h) and only
// Hello, Step and Done cross the socket.
//
// Failure: a rank that fails a step, dies, or says something out of turn
// fails the group for good. The leader keeps the first error (status()),
// shuts every link down so the followers exit, and fails every later step
// at once; the engine reports it as a backend failure (Engine::
// backendStatus), so the agent's /healthz fails and the pod is restarted.
// Ranks out of step cannot be brought back in step in place.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/kv/kv_storage.h"
#include "engine/model/llama.h"
#include "src/common/status.h"

namespace tandem::engine {

class Backend;

// One end of a rank link: whole frames over a connected stream socket,
// blocking. Owns the descriptor.
class RankLink {
 public:
  enum class Type : uint32_t {
    kHello = 1,
    kStep = 2,
    kPartial = 3,
    kSum = 4,
    kDone = 5,
    kStageOut = 6,
    kKvData = 7,
    kStageIn = 8,
  };
  static const char* typeName(Type type);

  explicit RankLink(int fd) : fd_(fd) {}
  ~RankLink();
  RankLink(const RankLink&) = delete;
  RankLink& operator=(const RankLink&) = delete;

  absl::Status send(Type type, std::span<const std::byte> payload);
  // The next frame's type, its payload in *payload. Unavailable when the
  // peer closed the link: `*at_boundary` says whether it closed between
  // frames (a clean close) or inside one. DataLoss for a frame that is not
  // one (a wrong magic, an unknown type, a length past the limit).
  // DeadlineExceeded when `timeout` (if given) passes with no frame started.
  absl::StatusOr<Type> receive(std::vector<std::byte>* payload, bool* at_boundary = nullptr,
                               std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  // Whether a frame (or the close) is waiting, within `timeout`.
  bool readable(std::chrono::milliseconds timeout) const;
  // Both directions shut down: the peer's reads see the close now.
  void shutdown();

 private:
  int fd_;
};

// A follower's Hello: who it is and the cache it holds.
struct RankHello {
  int rank = 0;
  int world = 0;
  int pid = 0;
  KvLayout layout;
  bool socket_all_reduce = false;
};

// One step's work, as the leader sends it: the KV block copies the
// scheduler made (copy-on-write), then the batch.
struct RankStep {
  std::vector<std::pair<BlockId, BlockId>> copies;  // (src, dst)
  struct Chunk {
    std::vector<TokenId> tokens;
    int32_t start_pos = 0;
    std::vector<BlockId> block_table;
    bool want_logits = false;
  };
  std::vector<Chunk> chunks;
  // The batch over `chunks` (spans into them).
  std::vector<SequenceChunk> batch() const;
};

// Which layer blocks a StageOut or StageIn names; a StageIn's bytes follow.
struct RankStage {
  std::vector<int32_t> layers;
  std::vector<BlockId> blocks;
  std::span<const std::byte> data;  // StageIn: into the decoded payload
};

std::vector<std::byte> encodeRankHello(const RankHello& hello);
absl::StatusOr<RankHello> decodeRankHello(std::span<const std::byte> payload);
std::vector<std::byte> encodeRankStep(std::span<const std::pair<BlockId, BlockId>> copies,
                                      std::span<const SequenceChunk> batch);
// DataLoss naming what was short or out of range.
absl::StatusOr<RankStep> decodeRankStep(std::span<const std::byte> payload);
std::vector<std::byte> encodeRankStage(std::span<const int32_t> layers, std::span<const BlockId> blocks);
// `with_data`: the rest of the payload is the StageIn's bytes.
absl::StatusOr<RankStage> decodeRankStage(std::span<const std::byte> payload, bool with_data);

// Rank 0's side: the followers' links, the step broadcast and, with the
// socket all-reduce, the sum. Engine thread only (EngineOptions::
// tensor_parallel); not thread-safe.
class RankGroupLeader {
 public:
  struct Options {
    // links[i] is rank i + 1's socket; owned from now on. world = size + 1.
    std::vector<int> links;
    // The leader's own cache: every follower's must be the same shape.
    KvLayout layout;
    // Partials cross the links (host memory). False: the ranks reduce
    // elsewhere: `all_reduce` is rank 0's (NCCL's), and `external_status`
    // its sticky error.
    bool socket_all_reduce = true;
    AllReducePartials all_reduce;
    std::function<absl::Status()> external_status;
    // How long a follower may take to load its shard and say Hello.
    std::chrono::milliseconds hello_timeout{std::chrono::minutes(20)};
    // How long rank 0 waits for a follower's frame within a step or a
    // stage before it gives up on the group (a rank alive but stuck).
    std::chrono::milliseconds step_timeout{std::chrono::minutes(5)};
  };
  // Waits for every follower's Hello and checks it (its rank, the world
  // size, the cache's shape, the all-reduce); the error names the rank and
  // what differs, or that it closed its link first (it exited: its log
  // says why), or that it said nothing within hello_timeout.
  static absl::StatusOr<std::unique_ptr<RankGroupLeader>> connect(Options options);
  ~RankGroupLeader();  // closes the links: the followers exit

  int world() const { return static_cast<int>(links_.size()) + 1; }
  // The followers' process ids, in rank order (from their Hellos).
  const std::vector<int>& followerPids() const { return pids_; }

  // OK when `layout` (rank 0's cache) is the shape the followers said they
  // hold; the error names both.
  absl::Status checkLayout(const KvLayout& layout) const;

  // Rank 0's all-reduce for its LlamaModel: the socket sum, or
  // Options::all_reduce when the ranks reduce elsewhere.
  AllReducePartials allReduce();

  // Sends one step to every follower (before rank 0 runs it). Fails at once
  // when the group has failed.
  absl::Status beginStep(std::span<const std::pair<BlockId, BlockId>> copies, std::span<const SequenceChunk> batch);
  // Every follower's Done for the step beginStep sent; the group's status.
  // `rank0` is rank 0's own result: when it failed, the followers may be
  // waiting mid-step (for a Sum, or in NCCL), so the group fails with it
  // rather than reading them out of step.
  absl::Status endStep(const absl::Status& rank0 = absl::OkStatus());
  // Copy-on-write block copies sent to the followers so far.
  int64_t copiesSent() const { return copies_sent_; }
  // Time rank 0 spent waiting for the other ranks' frames (their partials,
  // Dones and staged KV) since the last call: the links' cost and the
  // slowest rank's lag.
  std::chrono::nanoseconds takeWaitTime() { return std::exchange(wait_time_, std::chrono::nanoseconds(0)); }
  // OK, or the first failure (sticky).
  absl::Status status() const;

  // Between steps: layers `layers` of `blocks` of every follower's cache,
  // each follower's bytes (its layer blocks, layers outer, blocks inner)
  // handed to take(rank, bytes) in rank order. A follower's error fails
  // the group.
  absl::Status stageOut(std::span<const int32_t> layers, std::span<const BlockId> blocks,
                        const std::function<void(int rank, std::span<const std::byte> bytes)>& take);
  // The reverse: give(rank, &bytes) fills what each follower writes into
  // those layer blocks of its cache (the same order and size).
  absl::Status stageIn(std::span<const int32_t> layers, std::span<const BlockId> blocks,
                       const std::function<void(int rank, std::vector<std::byte>* bytes)>& give);

 private:
  explicit RankGroupLeader(Options options);
  void reduce(float* partial, int64_t n);
  void fail(absl::Status status);
  // The link's next frame, which must be `want`; fails the group otherwise.
  bool expect(size_t follower, RankLink::Type want, std::vector<std::byte>* payload);

  Options options_;
  std::vector<std::unique_ptr<RankLink>> links_;  // [world - 1], rank r at r - 1
  std::vector<int> pids_;
  absl::Status status_;
  bool in_step_ = false;
  int64_t copies_sent_ = 0;
  std::chrono::nanoseconds wait_time_{0};
  std::vector<std::byte> scratch_;
};

// A follower's side (ranks 1..world-1). Not thread-safe: its main thread
// drives it, and its model calls allReduce() from there.
class RankGroupFollower {
 public:
  RankGroupFollower(int link, int rank, int world);

  // The socket all-reduce for this rank's LlamaModel (host memory).
  AllReducePartials allReduce();
  // Tells the leader this rank is ready, with the cache it holds.
  absl::Status hello(const KvLayout& layout, bool socket_all_reduce);
  // Runs the leader's steps (and its stage requests) on `model` (which it
  // sets to skipLogits: rank 0 makes the logits), `kv` and `backend` until
  // the leader
  // closes the link between steps (OK) or something breaks (the error: the
  // link closed mid-step, a frame out of turn, a step that does not decode).
  // A step the model fails is reported to the leader in Done, and ends the
  // serving with that error too (the leader fails the group on it).
  // `external_status`: the NCCL all-reduce's sticky error, or null.
  absl::Status serve(LlamaModel& model, KvStorage& kv, Backend& backend,
                     const std::function<absl::Status()>& external_status = nullptr);

 private:
  void reduce(float* partial, int64_t n);
  // One Step: the copies and the forward pass, answered with Done.
  absl::Status runStep(std::span<const std::byte> payload, LlamaModel& model, KvStorage& kv, Backend& backend,
                       const std::function<absl::Status()>& external_status);
  // One StageOut (answered with KvData, or Done with the error) or StageIn
  // (answered with Done).
  absl::Status runStage(RankLink::Type type, std::span<const std::byte> payload, KvStorage& kv, Backend& backend);

  RankLink link_;
  int rank_;
  int world_;
  absl::Status link_status_;  // sticky: the socket all-reduce's first failure
  std::vector<std::byte> scratch_;
};

}  // namespace tandem::engine
