#include "e2e/kubelet/process_records.h"

#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "src/common/status.h"
#include "src/common/strings.h"

namespace tandem::kubelet {

using nlohmann::json;

unsigned long long ProcessRecords::startTime(pid_t pid) {
  std::ifstream in(strCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The command name (field 2) may hold spaces and parentheses: fields
  // are counted after its closing parenthesis.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(stat.substr(close + 2));
  std::string field;
  for (int i = 3; i < 22 && rest >> field; ++i) {
  }
  unsigned long long start = 0;
  rest >> start;
  return start;
}

absl::StatusOr<int> ProcessRecords::killLeftovers() {
  absl::MutexLock lock(&mu_);
  std::ifstream in(path_);
  int killed = 0;
  if (in) {
    json entries = json::parse(in, nullptr, false);
    if (entries.is_discarded() || !entries.is_array()) {
      return absl::DataLossError(strCat(path_, ": not a list of process groups (remove it to start over)"));
    }
    for (const auto& e : entries) {
      const pid_t pgid = e.value("pgid", 0);
      const unsigned long long start = e.value("start", 0ull);
      if (pgid <= 1) continue;
      const unsigned long long now = startTime(pgid);
      if (now != 0 && now != start) continue;  // the number belongs to another process now
      if (::kill(-pgid, SIGKILL) == 0) ++killed;
    }
  }
  groups_.clear();
  TANDEM_RETURN_IF_ERROR(writeLocked());
  return killed;
}

absl::Status ProcessRecords::add(pid_t pgid) {
  absl::MutexLock lock(&mu_);
  groups_[pgid] = startTime(pgid);
  return writeLocked();
}

absl::Status ProcessRecords::remove(pid_t pgid) {
  absl::MutexLock lock(&mu_);
  if (groups_.erase(pgid) == 0) return absl::OkStatus();
  return writeLocked();
}

absl::Status ProcessRecords::writeLocked() {
  json entries = json::array();
  for (const auto& [pgid, start] : groups_) entries.push_back({{"pgid", pgid}, {"start", start}});
  const std::string tmp = path_ + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << entries.dump() << "\n";
    if (!out) return absl::InternalError(strCat("cannot write ", tmp, ": ", std::strerror(errno)));
  }
  if (std::rename(tmp.c_str(), path_.c_str()) != 0) {
    return absl::InternalError(strCat("cannot rename ", tmp, " to ", path_, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace tandem::kubelet
