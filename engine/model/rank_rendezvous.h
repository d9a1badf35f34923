#pragma once
// How the ranks of one tensor-parallel group (one process per GPU in a pod,
// docs/engine.md "Tensor parallelism") learn the group's id before NCCL
// wires them: rank 0 makes the id (ncclGetUniqueId's 128 bytes) and hands it,
// over a Unix socket in the pod's filesystem, to every other rank; it
// returns once each of them has it. The rendezvous stays in the pod (the
// socket is a path, not a port); NCCL's own set-up and traffic then go over
// the network NCCL is given.
//
// Wire (little-endian): a rank sends "TPRV", its rank (u16) and the world
// size it was started with (u16); rank 0 answers 0 and the id (u16 length,
// then the bytes), or 1 and a message (u16 length, UTF-8) saying why it
// refuses that rank (another world size, a rank outside [1, world), a rank
// that already has the id). A connection that sends anything else is
// closed and rank 0 keeps waiting for the ranks it still needs.
//
// Errors name what went wrong: rank 0 times out naming the ranks that never
// came; another rank times out if rank 0 is not there (it retries until
// then: the processes start in any order), or says why rank 0 refused it.

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::engine {

struct RendezvousOptions {
  std::string socket_path;  // in the pod (an emptyDir); at most 107 bytes
  int world = 0;            // ranks in the group, 2..65535
  int rank = 0;             // this process's, [0, world)
  std::chrono::milliseconds timeout{60000};
};

// InvalidArgument naming the field when the options cannot work.
absl::Status validateRendezvous(const RendezvousOptions& options);

// Rank 0: listens on options.socket_path (replacing a stale socket file;
// FailedPrecondition when a live rank 0 answers there, or the path is not a
// socket),
// gives `group_id` (1..65535 bytes) to ranks 1..world-1 and returns when each
// has it; DeadlineExceeded naming the missing ranks after the timeout.
absl::Status serveGroupId(const RendezvousOptions& options, const std::vector<std::byte>& group_id);

// Ranks 1..world-1: the group id from rank 0.
absl::StatusOr<std::vector<std::byte>> fetchGroupId(const RendezvousOptions& options);

}  // namespace tandem::engine
