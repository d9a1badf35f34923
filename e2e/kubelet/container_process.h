#pragma once
// One container of a pod as a process (docs/local-cluster.md): started with
// the container's command, args and environment, inside the pod's network
// namespace (PodNetwork::execPrefix), in a process group of its own, its
// stdout and stderr appended to a log file (what `kubectl logs` will show);
// stopped as Kubernetes stops a container: SIGTERM to the group, then
// SIGKILL once the grace period is over.
//
// The environment is the kubelet's, with the container's variables added
// (and overriding): a local process needs the machine's PATH and libraries,
// which an image would bring.
//
// Not thread-safe: the kubelet's pod loop owns each one.

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "src/common/clock.h"

namespace tandem::kubelet {

struct ContainerSpec {
  std::vector<std::string> argv;                            // command, then args; argv[0] is looked up in PATH
  std::vector<std::pair<std::string, std::string>> env;     // added to the kubelet's environment
  std::string log_file;                                     // appended to; created if missing
  std::vector<std::string> exec_prefix;                     // runs argv inside the pod's namespace
};

class ContainerProcess {
 public:
  // InvalidArgument for an empty command or a variable name with '='; an
  // error naming the path when the log cannot be opened, or the program
  // when it cannot be started.
  static absl::StatusOr<std::unique_ptr<ContainerProcess>> start(const ContainerSpec& spec);
  // Kills what still runs (SIGKILL, no grace) and reaps it.
  ~ContainerProcess();
  ContainerProcess(const ContainerProcess&) = delete;
  ContainerProcess& operator=(const ContainerProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Its exit status once it ended (128 + N when signal N killed it); never
  // blocks. When it has ended, whatever it left in its process group is killed.
  std::optional<int> poll();
  // SIGTERM to its process group; SIGKILL after `grace` if it still runs.
  // Returns its exit status. Idempotent.
  int stop(Duration grace);

 private:
  explicit ContainerProcess(pid_t pid) : pid_(pid) {}
  const pid_t pid_;
  std::optional<int> status_;
};

}  // namespace tandem::kubelet
