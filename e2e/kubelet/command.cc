#include "e2e/kubelet/command.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "src/common/strings.h"

extern char** environ;

namespace tandem::kubelet {
namespace {

std::string commandLine(const std::vector<std::string>& argv) {
  std::string s;
  for (const std::string& a : argv) s += strCat(s.empty() ? "" : " ", a);
  return s;
}

}  // namespace

absl::StatusOr<CommandResult> runCommand(const std::vector<std::string>& argv) {
  if (argv.empty()) return absl::InvalidArgumentError("runCommand: no command");
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError(strCat("pipe: ", std::strerror(errno)));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  std::vector<char*> args;
  std::vector<std::string> copy = argv;
  for (std::string& a : copy) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return absl::UnavailableError(strCat("cannot run ", argv[0], ": ", std::strerror(rc)));
  }
  CommandResult out;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fds[0], buf, sizeof buf);
    if (n > 0) {
      out.output.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  close(fds[0]);
  int status = 0;
  pid_t waited = 0;
  while ((waited = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
  }
  // Reaped elsewhere (SIGCHLD ignored?): its status is unknown, not success.
  if (waited != pid) return absl::InternalError(strCat("cannot wait for ", argv[0], ": ", std::strerror(errno)));
  out.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return out;
}

absl::Status runChecked(const std::vector<std::string>& argv) {
  absl::StatusOr<CommandResult> r = runCommand(argv);
  if (!r.ok()) return r.status();
  if (r->exit_code == 0) return absl::OkStatus();
  std::string output = r->output;
  while (!output.empty() && (output.back() == '\n' || output.back() == ' ')) output.pop_back();
  return absl::FailedPreconditionError(
      strCat("`", commandLine(argv), "` exited with ", r->exit_code, output.empty() ? "" : ": ", output));
}

}  // namespace tandem::kubelet
