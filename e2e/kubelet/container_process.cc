#include "e2e/kubelet/container_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include "src/common/strings.h"

extern char** environ;

namespace tandem::kubelet {
namespace {

int exitStatus(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

}  // namespace

absl::StatusOr<std::unique_ptr<ContainerProcess>> ContainerProcess::start(const ContainerSpec& spec) {
  if (spec.argv.empty() || spec.argv[0].empty()) return absl::InvalidArgumentError("container: no command");
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [name, value] : spec.env) {
    if (name.empty() || name.find('=') != std::string::npos) {
      return absl::InvalidArgumentError(strCat("container: environment variable name \"", name, "\" is not valid"));
    }
    env[name] = value;
  }
  const int log = open(spec.log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) {
    return absl::FailedPreconditionError(
        strCat("container: cannot open its log ", spec.log_file, ": ", std::strerror(errno)));
  }
  std::vector<std::string> argv = spec.exec_prefix;
  argv.insert(argv.end(), spec.argv.begin(), spec.argv.end());
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (const auto& [name, value] : env) env_strings.push_back(strCat(name, "=", value));
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, log, 1);
  posix_spawn_file_actions_adddup2(&fa, log, 2);
  // Nothing else of the kubelet's (its sockets, say) goes with it.
  posix_spawn_file_actions_addclosefrom_np(&fa, 3);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Its own process group, so stop() reaches whatever it starts.
  posix_spawnattr_setpgroup(&attr, 0);
  // Default signal handling, whatever the kubelet blocks or ignores.
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &fa, &attr, args.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&fa);
  close(log);
  if (rc != 0) return absl::FailedPreconditionError(strCat("container: cannot start ", argv[0], ": ", std::strerror(rc)));
  return std::unique_ptr<ContainerProcess>(new ContainerProcess(pid));
}

ContainerProcess::~ContainerProcess() { stop(Duration(0)); }

std::optional<int> ContainerProcess::poll() {
  if (status_) return status_;
  // Ended? Asked without reaping it, so its number (its group's) stays taken
  // while the group is killed: a container ends with its main process, and
  // whatever it started goes too.
  siginfo_t info{};
  if (waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid != pid_) {
    return std::nullopt;
  }
  kill(-pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  status_ = exitStatus(status);
  return status_;
}

int ContainerProcess::stop(Duration grace) {
  if (poll()) return *status_;
  kill(-pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (!poll() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (status_) return *status_;
  kill(-pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  status_ = exitStatus(status);
  return *status_;
}

}  // namespace tandem::kubelet
