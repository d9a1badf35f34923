// The tensor-parallel group's rendezvous (engine/model/rank_rendezvous.h):
// real Unix sockets between threads standing in for the pod's processes.

#include "engine/model/rank_rendezvous.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tandem::engine {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

std::string socketPath(const char* name) {
  return "/tmp/tandem-rdv-" + std::to_string(::getpid()) + "-" + name + ".sock";
}

std::vector<std::byte> groupId() {
  std::vector<std::byte> id(128);
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<std::byte>(i * 7 + 3);
  return id;
}

RendezvousOptions options(const std::string& path, int world, int rank, std::chrono::milliseconds timeout = 5000ms) {
  return {.socket_path = path, .world = world, .rank = rank, .timeout = timeout};
}

TEST(RankRendezvousTest, EveryRankGetsRankZerosIdWhateverOrderTheyStartIn) {
  const std::string path = socketPath("order");
  std::vector<std::future<absl::StatusOr<std::vector<std::byte>>>> ranks;
  // Ranks 2 and 3 start before rank 0 listens: they retry until it does.
  for (int r : {2, 3}) ranks.push_back(std::async(std::launch::async, [&, r] { return fetchGroupId(options(path, 4, r)); }));
  std::this_thread::sleep_for(100ms);
  auto served = std::async(std::launch::async, [&] { return serveGroupId(options(path, 4, 0), groupId()); });
  ranks.push_back(std::async(std::launch::async, [&] { return fetchGroupId(options(path, 4, 1)); }));
  for (auto& r : ranks) {
    absl::StatusOr<std::vector<std::byte>> id = r.get();
    ASSERT_TRUE(id.ok()) << id.status();
    EXPECT_EQ(*id, groupId());
  }
  EXPECT_TRUE(served.get().ok());
  EXPECT_NE(::access(path.c_str(), F_OK), 0) << "rank 0 leaves no socket file behind";
}

TEST(RankRendezvousTest, ARankOfAnotherGroupOrADuplicateIsRefusedAndTheGroupStillForms) {
  const std::string path = socketPath("refuse");
  auto served = std::async(std::launch::async, [&] { return serveGroupId(options(path, 3, 0), groupId()); });
  // Another world size: refused with why.
  auto other = fetchGroupId(options(path, 2, 1));
  EXPECT_THAT(other.status().message(), HasSubstr("rank 0 runs a group of 3 ranks, this rank was started for 2"));
  // Something that is not a rank: closed, rank 0 keeps waiting.
  {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, path.data(), path.size());
    ASSERT_EQ(::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof(a)), 0);
    ASSERT_EQ(::send(fd, "GET / HTTP/1.0\r\n", 16, MSG_NOSIGNAL), 16);
    char c;
    EXPECT_LE(::recv(fd, &c, 1, 0), 0) << "closed without an answer";
    ::close(fd);
  }
  auto first = fetchGroupId(options(path, 3, 1));
  ASSERT_TRUE(first.ok()) << first.status();
  // A second process started as rank 1.
  auto duplicate = fetchGroupId(options(path, 3, 1));
  EXPECT_THAT(duplicate.status().message(), HasSubstr("rank 1 already has the group id"));
  auto second = fetchGroupId(options(path, 3, 2));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(served.get().ok());
}

TEST(RankRendezvousTest, TimeoutsNameWhatIsMissing) {
  const std::string path = socketPath("timeout");
  auto served = std::async(std::launch::async, [&] { return serveGroupId(options(path, 4, 0, 3000ms), groupId()); });
  ASSERT_TRUE(fetchGroupId(options(path, 4, 2)).ok());
  // A second process started as rank 0 while the first serves.
  const absl::Status second = serveGroupId(options(path, 4, 0, 3000ms), groupId());
  EXPECT_THAT(second.message(), HasSubstr("another rank 0 is serving at"));
  const absl::Status s = served.get();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("1 of 3 ranks came within 3000 ms; missing rank(s) 1, 3"));
  EXPECT_NE(::access(path.c_str(), F_OK), 0);
  // A path that is not a socket is not removed.
  const std::string file = socketPath("file");
  { std::FILE* f = std::fopen(file.c_str(), "w"); ASSERT_NE(f, nullptr); std::fclose(f); }
  EXPECT_THAT(serveGroupId(options(file, 2, 0, 300ms), groupId()).message(), HasSubstr("exists and is not a socket"));
  EXPECT_EQ(::access(file.c_str(), F_OK), 0);
  ::unlink(file.c_str());

  const auto alone = fetchGroupId(options(socketPath("nobody"), 2, 1, 300ms));
  EXPECT_EQ(alone.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(alone.status().message(), HasSubstr("rank 1 got no group id from rank 0"));
}

TEST(RankRendezvousTest, BadOptionsAreRefusedNamingTheField) {
  EXPECT_THAT(validateRendezvous(options("", 2, 0)).message(), HasSubstr("socket path"));
  EXPECT_THAT(validateRendezvous(options(std::string(200, 'x'), 2, 0)).message(), HasSubstr("socket path"));
  EXPECT_THAT(validateRendezvous(options("/tmp/x", 1, 0)).message(), HasSubstr("world size: must be 2..65535, got 1"));
  EXPECT_THAT(validateRendezvous(options("/tmp/x", 2, 2)).message(), HasSubstr("rank: must be in [0, 2), got 2"));
  EXPECT_THAT(serveGroupId(options("/tmp/x", 2, 1), groupId()).message(), HasSubstr("rank 1 cannot serve"));
  EXPECT_THAT(fetchGroupId(options("/tmp/x", 2, 0)).status().message(), HasSubstr("rank 0 serves the group id"));
  EXPECT_THAT(serveGroupId(options("/tmp/x", 2, 0), {}).message(), HasSubstr("group id: must be 1..65535 bytes"));
}

}  // namespace
}  // namespace tandem::engine
