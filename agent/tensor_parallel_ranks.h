#pragma once
// An agent with --tensor-parallel N is rank 0 of a group of N processes
// (engine/model/rank_group.h; docs/cuda.md, "Tensor parallelism"). It starts
// ranks 1..N-1 itself, as this same binary:
//
//   tandem-agent tensor-parallel-rank --rank R --world N --link 3
//       [--rendezvous PATH] -- <the agent's own arguments>
//
// Each rank reads the same configuration, loads its shard of the model onto
// its device (GPU R with --device cuda) and serves rank 0's steps over the
// link (a socketpair inherited as descriptor 3) until rank 0 closes it.
// With --device cuda the ranks sum their partials with NCCL, whose group id
// rank 0 hands out over the Unix socket PATH (engine/model/rank_rendezvous.h);
// otherwise over the link.
//
// The ranks live and die with rank 0: they ignore SIGTERM and SIGINT (rank
// 0 drains, then closes the links and they exit), and they are killed when
// rank 0 is gone (PR_SET_PDEATHSIG; a rank waiting in serve() also sees
// its link close). Rank 0 reaps them; a rank that exits while rank
// 0 runs fails rank 0's health checks (exited()), so the pod restarts.

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/backend/backend.h"
#include "engine/backend/cpu/simd.h"

namespace tandem::agent {

// The engine's backend for --device `device` on rank `rank` of `world`
// (world 1: no tensor parallelism): the CPU backend, the GPU kernels on the
// CPU executor (cuda-emulator), or GPU `rank` (cuda). On the CPU each rank
// gets its share of the machine's cores.
absl::StatusOr<std::unique_ptr<engine::Backend>> makeRankBackend(const std::string& device, engine::SimdLevel simd,
                                                                 int rank, int world,
                                                                 engine::GemmDtype dtype = engine::GemmDtype::kFloat32);

// The descriptor a rank's link arrives on.
inline constexpr int kRankLinkFd = 3;

class RankProcesses {
 public:
  // Starts ranks 1..world-1 of this binary with `agent_args` (the agent's
  // arguments) and, for NCCL, `rendezvous` (empty: the socket all-reduce).
  static absl::StatusOr<std::unique_ptr<RankProcesses>> start(int world, std::span<const std::string> agent_args,
                                                              const std::string& rendezvous);
  // Waits up to 10 s in all for the ranks to exit (rank 0 closed the
  // links first), then kills those still running.
  ~RankProcesses();
  RankProcesses(const RankProcesses&) = delete;
  RankProcesses& operator=(const RankProcesses&) = delete;

  // Rank 0's ends of the links, rank 1 first; taken once (the group owns them).
  std::vector<int> takeLinks();
  // The first rank that has exited ("tensor-parallel rank 1 (pid 123)
  // exited with status 1"), waiting up to `grace` for one to; nothing while
  // all run. Thread-safe (health checks call it).
  std::optional<std::string> exited(std::chrono::milliseconds grace = std::chrono::milliseconds(0));

 private:
  struct Rank {
    int pid = -1;
    int link = -1;  // rank 0's end, until taken
    std::optional<int> wait_status;
  };
  RankProcesses() = default;
  // Reaps ranks that exited; the first exited one's description.
  std::optional<std::string> reapLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::vector<Rank> ranks_ ABSL_GUARDED_BY(mu_);  // rank r at r - 1
};

// `tandem-agent tensor-parallel-rank ...` (argv[0] is the subcommand): one
// rank's life. Returns the exit code: 0 when rank 0 closed the link between
// steps, 1 on a failure (logged), 2 on bad arguments.
int runTensorParallelRank(int argc, char** argv, const char* program);

}  // namespace tandem::agent
