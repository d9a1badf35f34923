#include "agent/transport/shm_rkey.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <mutex>

#include "agent/transport/ucx_transport.h"
#include "src/common/strings.h"
#include "tests/agent/transport/get_waiter.h"
#include "tests/testing/wait.h"

namespace tandem::transport {
namespace {

using testutil::waitFor;

constexpr const char* kSharedMemoryTls = "posix,cma,tcp";

// The pid of a process that has exited and been reaped.
int deadPid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

ino_t inodeOf(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

// A KV pool allocated by UCX for shared memory, as the agents allocate theirs.
std::shared_ptr<UcxRegion> sharedMemoryPool(size_t bytes) {
  auto r = UcxRegion::allocate(bytes, {.tls = kSharedMemoryTls});
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return nullptr;
  auto mem = (*r)->bytes();
  for (size_t i = 0; i < mem.size(); ++i) mem[i] = static_cast<std::byte>((i * 11 + 1) & 0xff);
  return *r;
}

// The proc-link part of a real packed rkey (the one UCX 1.13 would open).
int procLinkPartIndex(const PackedRkey& rkey) {
  for (size_t i = 0; i < rkey.parts.size(); ++i) {
    ProcLinkSegment seg;
    if (procLinkSegment(rkey.parts[i], seg)) return static_cast<int>(i);
  }
  return -1;
}

TEST(PackedRkeyTest, ARealRkeyParsesAndSerializesBackByteForByte) {
  auto pool = sharedMemoryPool(1 << 20);
  ASSERT_NE(pool, nullptr);
  auto t = UcxTransport::start({.host = "127.0.0.1", .port = 0, .pool = pool}, {});
  ASSERT_TRUE(t.ok()) << t.status();
  const std::string& packed = (*t)->packedRkey();
  PackedRkey rkey;
  ASSERT_TRUE(parsePackedRkey(packed, rkey));
  EXPECT_EQ(serializePackedRkey(rkey), packed);
  const int i = procLinkPartIndex(rkey);
  ASSERT_GE(i, 0) << "UCX's posix part (proc-link mode) is not in the pool's rkey";
  ProcLinkSegment seg;
  ASSERT_TRUE(procLinkSegment(rkey.parts[i], seg));
  EXPECT_EQ(seg.pid, ::getpid()) << "the segment is this process's own";
  EXPECT_NE(inodeOf(strCat("/proc/self/fd/", seg.fd)), 0u);
}

TEST(PackedRkeyTest, WhatIsNotAPackedRkeyPassesThroughUnchanged) {
  PackedRkey rkey;
  EXPECT_FALSE(parsePackedRkey("", rkey));
  EXPECT_FALSE(parsePackedRkey(std::string(8, '\0'), rkey));
  // Names two parts, carries one byte of the first.
  std::string cut(8, '\0');
  cut[0] = 0x3;
  cut += '\0';  // memory type
  cut += '\x18';
  cut += 'x';
  EXPECT_FALSE(parsePackedRkey(cut, rkey));
  for (const std::string& bad : {std::string(), std::string(8, '\0'), cut}) {
    PinnedRkey p = pinSharedMemorySegments(bad);
    EXPECT_EQ(p.packed(), bad);
    EXPECT_EQ(p.pinned(), 0);
    EXPECT_EQ(p.dropped(), 0);
  }
}

TEST(PinSharedMemoryTest, ALiveSegmentIsPinnedAndRenamedAsThisProcesssOwn) {
  auto pool = sharedMemoryPool(1 << 20);
  ASSERT_NE(pool, nullptr);
  auto t = UcxTransport::start({.host = "127.0.0.1", .port = 0, .pool = pool}, {});
  ASSERT_TRUE(t.ok()) << t.status();
  PackedRkey original;
  ASSERT_TRUE(parsePackedRkey((*t)->packedRkey(), original));
  const int i = procLinkPartIndex(original);
  ASSERT_GE(i, 0);
  ProcLinkSegment owner;
  ASSERT_TRUE(procLinkSegment(original.parts[i], owner));

  PinnedRkey pinned = pinSharedMemorySegments((*t)->packedRkey());
  EXPECT_EQ(pinned.pinned(), 1);
  EXPECT_EQ(pinned.dropped(), 0);
  PackedRkey now;
  ASSERT_TRUE(parsePackedRkey(pinned.packed(), now));
  ASSERT_EQ(now.parts.size(), original.parts.size());
  ProcLinkSegment renamed;
  ASSERT_TRUE(procLinkSegment(now.parts[i], renamed));
  EXPECT_EQ(renamed.pid, ::getpid());
  EXPECT_NE(renamed.fd, owner.fd) << "named by the pin, a descriptor of its own";
  EXPECT_EQ(inodeOf(strCat("/proc/self/fd/", renamed.fd)), inodeOf(strCat("/proc/self/fd/", owner.fd)))
      << "the pin holds the peer's segment file";
  // Everything else in the part (address, length, flags) is as packed.
  EXPECT_EQ(now.parts[i].bytes.substr(8), original.parts[i].bytes.substr(8));
  EXPECT_EQ(now.parts[i].bytes[7] & 0xf0, original.parts[i].bytes[7] & 0xf0);
  for (size_t k = 0; k < now.parts.size(); ++k) {
    if (static_cast<int>(k) == i) continue;
    EXPECT_EQ(now.parts[k].bytes, original.parts[k].bytes);
  }
}

// The crash this guards against: D unpacks the rkey of a P whose process
// has exited, so UCX cannot open the segment the rkey names. Played here
// by an rkey naming a reaped process's descriptor: the segment is left out
// (UCX 1.13 would crash in ucp_ep_rkey_unpack), the connection still
// serves messages, and the same connection given a live rkey reads exactly.
TEST(PinSharedMemoryTest, AnRkeyWhoseOwnerExitedIsUnpackedWithoutItsSegmentAndNothingCrashes) {
  auto p_pool = sharedMemoryPool(1 << 20);
  auto d_pool = sharedMemoryPool(1 << 20);
  ASSERT_TRUE(p_pool && d_pool);
  // P answers every message; D counts the answers.
  std::mutex mu;
  int answers = 0;
  std::unique_ptr<UcxTransport>* p_ptr = nullptr;
  TransportCallbacks p_cb;
  p_cb.on_message = [&](ConnId from, std::vector<uint8_t>) { (*p_ptr)->send(from, {2}); };
  TransportCallbacks d_cb;
  d_cb.on_message = [&](ConnId, std::vector<uint8_t>) {
    std::lock_guard l(mu);
    ++answers;
  };
  auto p = UcxTransport::start({.host = "127.0.0.1", .port = 0, .pool = p_pool}, p_cb);
  ASSERT_TRUE(p.ok()) << p.status();
  p_ptr = &*p;
  auto d = UcxTransport::start({.host = "127.0.0.1", .port = 0, .pool = d_pool}, d_cb);
  ASSERT_TRUE(p.ok() && d.ok());

  PackedRkey rkey;
  ASSERT_TRUE(parsePackedRkey((*p)->packedRkey(), rkey));
  const int i = procLinkPartIndex(rkey);
  ASSERT_GE(i, 0);
  ProcLinkSegment seg;
  ASSERT_TRUE(procLinkSegment(rkey.parts[i], seg));
  setProcLinkSegment(rkey.parts[i], {deadPid(), seg.fd});
  const std::string orphaned = serializePackedRkey(rkey);
  {
    PinnedRkey pinned = pinSharedMemorySegments(orphaned);
    EXPECT_EQ(pinned.dropped(), 1);
    EXPECT_EQ(pinned.pinned(), 0);
    PackedRkey left;
    ASSERT_TRUE(parsePackedRkey(pinned.packed(), left));
    EXPECT_EQ(left.parts.size() + 1, rkey.parts.size());
    EXPECT_LT(procLinkPartIndex(left), 0);
  }

  ConnId c = (*d)->connect("127.0.0.1", (*p)->port());
  // Both before the wire-up (tcp alone reaches P then) and after it (when
  // UCX would open the segment), as the agents set it.
  (*d)->setRemoteRegion(c, (*p)->regionBase(), (*p)->regionLength(), orphaned);
  (*d)->send(c, {1});
  // The wire-up is over once P has answered through it.
  ASSERT_TRUE(waitFor([&] {
    std::lock_guard l(mu);
    return answers == 1;
  }));
  (*d)->setRemoteRegion(c, (*p)->regionBase(), (*p)->regionLength(), orphaned);
  GetWaiter w;
  (*d)->get(c, d_pool->bytes().data(), 0, 64 << 10, w.callback());
  const absl::Status first = w.wait();
  {
    std::lock_guard l(w.mu);
    ASSERT_EQ(w.calls, 1) << "a get through the rkey without its segment never completed: " << first;
  }

  (*d)->setRemoteRegion(c, (*p)->regionBase(), (*p)->regionLength(), (*p)->packedRkey());
  GetWaiter w2;
  (*d)->get(c, d_pool->bytes().data(), 4096, 256 << 10, w2.callback());
  const absl::Status second = w2.wait();
  ASSERT_TRUE(second.ok()) << second;
  EXPECT_EQ(std::memcmp(d_pool->bytes().data(), p_pool->bytes().data() + 4096, 256 << 10), 0);
}

}  // namespace
}  // namespace tandem::transport
