#pragma once
// The containers' process groups, on disk, so a kubelet killed with SIGKILL
// leaves no process behind: the next kubelet started with the same file
// kills every group it lists before it runs anything (docs/local-cluster.md).
//
// Each entry is a group's id (its first process's pid) and that process's
// start time (/proc/<pid>/stat, field 22), so a pid the system has since
// given to an unrelated process is never signalled: a group whose leader
// still runs is killed only if the start time matches; one whose leader has
// exited is killed as a group (no new process can take the number of a group
// that still has members, and a group with none ignores the signal).
//
// Thread-safe. Every change rewrites the file (write to a temporary, rename).

#include <sys/types.h>

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace tandem::kubelet {

class ProcessRecords {
 public:
  explicit ProcessRecords(std::string path) : path_(std::move(path)) {}

  // Kills the groups a previous kubelet left in the file (SIGKILL) and
  // empties it. Returns how many groups were signalled.
  absl::StatusOr<int> killLeftovers();
  // A group started / ended (its leader reaped and the group killed).
  absl::Status add(pid_t pgid);
  absl::Status remove(pid_t pgid);

  // The start time of process `pid` in clock ticks since boot; 0 if it does not exist.
  static unsigned long long startTime(pid_t pid);

 private:
  absl::Status writeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  absl::Mutex mu_;
  std::map<pid_t, unsigned long long> groups_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::kubelet
