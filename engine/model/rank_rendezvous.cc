#include "engine/model/rank_rendezvous.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <set>
#include <thread>

#include "src/common/strings.h"

namespace tandem::engine {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kMagic[4] = {'T', 'P', 'R', 'V'};

// A socket closed on scope exit.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

std::string errnoText(int e) { return std::strerror(e); }

sockaddr_un addressOf(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.data(), path.size());
  return a;
}

int millisLeft(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

// Reads or writes exactly `n` bytes before the deadline; false on timeout,
// a closed peer or an error (`why` says which).
bool transfer(int fd, void* data, size_t n, bool write, Clock::time_point deadline, std::string* why) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    pollfd pfd{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    const int ready = ::poll(&pfd, 1, millisLeft(deadline));
    if (ready == 0) {
      *why = "timed out";
      return false;
    }
    if (ready < 0) {
      if (errno == EINTR) continue;
      *why = errnoText(errno);
      return false;
    }
    const ssize_t k = write ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (k == 0) {
      *why = "the peer closed the connection";
      return false;
    }
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      *why = errnoText(errno);
      return false;
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

void putU16(std::vector<std::byte>& out, size_t v) {
  out.push_back(static_cast<std::byte>(v & 0xff));
  out.push_back(static_cast<std::byte>((v >> 8) & 0xff));
}
uint16_t getU16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

// Rank 0's answer to one rank: refused (with why) or the id.
std::vector<std::byte> answer(bool ok, const std::vector<std::byte>& payload) {
  std::vector<std::byte> out;
  out.push_back(static_cast<std::byte>(ok ? 0 : 1));
  putU16(out, payload.size());
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}
std::vector<std::byte> refusal(const std::string& why) {
  std::vector<std::byte> b(why.size());
  std::memcpy(b.data(), why.data(), why.size());
  return answer(false, b);
}

}  // namespace

absl::Status validateRendezvous(const RendezvousOptions& o) {
  if (o.socket_path.empty() || o.socket_path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return absl::InvalidArgumentError(strCat("rendezvous socket path: must be 1..", sizeof(sockaddr_un{}.sun_path) - 1,
                                             " bytes, got ", o.socket_path.size()));
  }
  if (o.world < 2 || o.world > 65535) {
    return absl::InvalidArgumentError(strCat("rendezvous world size: must be 2..65535, got ", o.world));
  }
  if (o.rank < 0 || o.rank >= o.world) {
    return absl::InvalidArgumentError(strCat("rendezvous rank: must be in [0, ", o.world, "), got ", o.rank));
  }
  if (o.timeout.count() <= 0) return absl::InvalidArgumentError("rendezvous timeout: must be positive");
  return absl::OkStatus();
}

absl::Status serveGroupId(const RendezvousOptions& o, const std::vector<std::byte>& group_id) {
  if (auto s = validateRendezvous(o); !s.ok()) return s;
  if (o.rank != 0) return absl::InvalidArgumentError(strCat("rendezvous: rank ", o.rank, " cannot serve the group id"));
  if (group_id.empty() || group_id.size() > 65535) {
    return absl::InvalidArgumentError(strCat("rendezvous group id: must be 1..65535 bytes, got ", group_id.size()));
  }
  const auto deadline = Clock::now() + o.timeout;
  Fd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (listener.get() < 0) return absl::InternalError("rendezvous: socket: " + errnoText(errno));
  const sockaddr_un addr = addressOf(o.socket_path);
  // Something at the path: a socket an earlier run of rank 0 left (replaced),
  // unless a rank 0 still answers there; anything else is not ours to remove.
  if (struct stat st{}; ::lstat(o.socket_path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(strCat("rendezvous: ", o.socket_path, " exists and is not a socket"));
    }
    Fd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (probe.get() >= 0 && ::connect(probe.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) {
      return absl::FailedPreconditionError(
          strCat("rendezvous: another rank 0 is serving at ", o.socket_path, " (two processes started as rank 0?)"));
    }
    ::unlink(o.socket_path.c_str());
  }
  if (::bind(listener.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::FailedPreconditionError(strCat("rendezvous: bind ", o.socket_path, ": ", errnoText(errno)));
  }
  // At the end the path is removed if it is still this socket.
  struct stat bound{};
  ::lstat(o.socket_path.c_str(), &bound);
  struct Unlink {
    std::string path;
    ino_t inode;
    ~Unlink() {
      struct stat now{};
      if (::lstat(path.c_str(), &now) == 0 && now.st_ino == inode) ::unlink(path.c_str());
    }
  } unlink_at_end{o.socket_path, bound.st_ino};
  if (::listen(listener.get(), 64) != 0) return absl::InternalError("rendezvous: listen: " + errnoText(errno));
  std::set<int> have;  // ranks that got the id
  const std::vector<std::byte> ok_answer = answer(true, group_id);
  while (static_cast<int>(have.size()) < o.world - 1) {
    pollfd pfd{listener.get(), POLLIN, 0};
    const int ready = ::poll(&pfd, 1, millisLeft(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      std::string missing;
      for (int r = 1; r < o.world; ++r) {
        if (!have.contains(r)) missing += strCat(missing.empty() ? "" : ", ", r);
      }
      return absl::DeadlineExceededError(strCat("rendezvous: ", have.size(), " of ", o.world - 1, " ranks came within ",
                                                o.timeout.count(), " ms; missing rank(s) ", missing));
    }
    Fd conn(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (conn.get() < 0) continue;
    // One rank at a time, each given at most a second (or what is left).
    const auto conn_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(1));
    unsigned char hello[8];
    std::string why;
    if (!transfer(conn.get(), hello, sizeof(hello), false, conn_deadline, &why)) continue;
    if (std::memcmp(hello, kMagic, sizeof(kMagic)) != 0) continue;  // not a rank of ours
    const int rank = getU16(hello + 4), world = getU16(hello + 6);
    std::vector<std::byte> reply;
    if (world != o.world) {
      reply = refusal(strCat("rank 0 runs a group of ", o.world, " ranks, this rank was started for ", world));
    } else if (rank < 1 || rank >= o.world) {
      reply = refusal(strCat("rank ", rank, " is outside [1, ", o.world, ")"));
    } else if (have.contains(rank)) {
      reply = refusal(strCat("rank ", rank, " already has the group id (two processes started as rank ", rank, "?)"));
    } else {
      reply = ok_answer;
    }
    if (transfer(conn.get(), reply.data(), reply.size(), true, conn_deadline, &why) && reply == ok_answer) {
      have.insert(rank);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::byte>> fetchGroupId(const RendezvousOptions& o) {
  if (auto s = validateRendezvous(o); !s.ok()) return s;
  if (o.rank == 0) return absl::InvalidArgumentError("rendezvous: rank 0 serves the group id, it does not fetch it");
  const auto deadline = Clock::now() + o.timeout;
  const sockaddr_un addr = addressOf(o.socket_path);
  std::string last = "not tried";
  while (true) {
    Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) return absl::InternalError("rendezvous: socket: " + errnoText(errno));
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) {
      unsigned char hello[8];
      std::memcpy(hello, kMagic, sizeof(kMagic));
      hello[4] = static_cast<unsigned char>(o.rank & 0xff);
      hello[5] = static_cast<unsigned char>(o.rank >> 8);
      hello[6] = static_cast<unsigned char>(o.world & 0xff);
      hello[7] = static_cast<unsigned char>(o.world >> 8);
      unsigned char head[3];
      std::string why;
      if (transfer(fd.get(), hello, sizeof(hello), true, deadline, &why) &&
          transfer(fd.get(), head, sizeof(head), false, deadline, &why)) {
        std::vector<std::byte> payload(getU16(head + 1));
        if (transfer(fd.get(), payload.data(), payload.size(), false, deadline, &why)) {
          if (head[0] == 0 && !payload.empty()) return payload;
          return absl::FailedPreconditionError(strCat(
              "rendezvous: rank 0 refused rank ", o.rank, ": ",
              std::string(reinterpret_cast<const char*>(payload.data()), payload.size())));
        }
      }
      last = why;
    } else {
      last = errnoText(errno);  // rank 0 not listening yet
    }
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(strCat("rendezvous: rank ", o.rank, " got no group id from rank 0 at ",
                                                o.socket_path, " within ", o.timeout.count(), " ms (last: ", last, ")"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(50, millisLeft(deadline) + 1)));
  }
}

}  // namespace tandem::engine
