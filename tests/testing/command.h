#pragma once
// Runs a shell command line and returns its exit status and standard output
// (append " 2>&1" to the command to have standard error too).

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace tandem::testutil {

struct CommandResult {
  int status = -1;  // the exit status; -1 when it could not run or died of a signal
  std::string out;
};

inline CommandResult runCommand(const std::string& command) {
  CommandResult r;
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

}  // namespace tandem::testutil
