#include "agent/transport/ucx_transport.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <numeric>

#include "tests/agent/transport/get_waiter.h"
#include "tests/testing/wait.h"

namespace tandem::transport {
namespace {

using testutil::waitFor;

// One side of a connection: a transport plus what its callbacks saw.
struct Side {
  std::vector<std::byte> region;
  std::unique_ptr<UcxTransport> t;
  std::mutex mu;
  std::vector<ConnId> accepted;
  std::vector<std::pair<ConnId, std::vector<uint8_t>>> messages;
  std::vector<std::pair<ConnId, absl::Status>> disconnects;

  Side(size_t region_bytes, const std::string& tls) : region(region_bytes) {
    for (size_t i = 0; i < region.size(); ++i) region[i] = static_cast<std::byte>((i * 7 + 3) & 0xff);
    TransportCallbacks cb;
    cb.on_accept = [this](ConnId c) {
      std::lock_guard l(mu);
      accepted.push_back(c);
    };
    cb.on_message = [this](ConnId c, std::vector<uint8_t> m) {
      std::lock_guard l(mu);
      messages.emplace_back(c, std::move(m));
    };
    cb.on_disconnect = [this](ConnId c, absl::Status s) {
      std::lock_guard l(mu);
      disconnects.emplace_back(c, s);
    };
    auto r = UcxTransport::start({.host = "127.0.0.1", .port = 0, .region = region, .tls = tls}, cb);
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) t = std::move(*r);
  }
  // The transport goes first: its shutdown may still call on_disconnect,
  // which must find the vectors alive (members die after this body).
  ~Side() { t.reset(); }
  size_t numMessages() {
    std::lock_guard l(mu);
    return messages.size();
  }
  size_t numAccepted() {
    std::lock_guard l(mu);
    return accepted.size();
  }
  size_t numDisconnects() {
    std::lock_guard l(mu);
    return disconnects.size();
  }
};

// After a get's first completion, shows that it never completes again: a
// second run of `done` (or a second decrement of the in-flight count) would
// happen on the progress thread before shutdown() returns, since no callback
// runs after it, so checking after shutdown() cannot miss one.
void expectCompletedOnce(UcxTransport& t, GetWaiter& w) {
  t.shutdown();
  std::lock_guard l(w.mu);
  EXPECT_EQ(w.calls, 1);
  EXPECT_EQ(t.getsInFlight(), 0);
}

// D connects to P and learns P's region, ready for gets.
ConnId connectForGets(UcxTransport& d, UcxTransport& p) {
  ConnId c = d.connect("127.0.0.1", p.port());
  d.setRemoteRegion(c, p.regionBase(), p.regionLength(), p.packedRkey());
  return c;
}
// Waits until both ends of D's connection `c` to P finished the wire-up: a
// message each way. Tearing down a tcp connection whose wire-up is still
// running can trip an assertion inside UCX 1.13 (tcp_ep.c, `!(ep->flags &
// UCT_TCP_EP_FLAG_CTX_TYPE_TX)`: the process aborts), so a test that ends
// soon after connecting waits for this first.
void wireUp(Side& d, Side& p, ConnId c) {
  const size_t d_before = d.numMessages(), p_before = p.numMessages();
  d.t->send(c, {0});
  ASSERT_TRUE(waitFor([&] { return p.numMessages() > p_before; }));
  ConnId at_p = 0;
  {
    std::lock_guard l(p.mu);
    at_p = p.messages.back().first;
  }
  p.t->send(at_p, {0});
  ASSERT_TRUE(waitFor([&] { return d.numMessages() > d_before; }));
}
// D connects to P, learns P's region (before the wire-up finished, as the
// agents do) and waits for the wire-up: ready for gets.
ConnId connectForGets(Side& d, Side& p) {
  ConnId c = connectForGets(*d.t, *p.t);
  wireUp(d, p, c);
  return c;
}

// Two KV pools allocated by UCX for shared memory (as the agents allocate
// theirs): P's filled with `pattern(i)`, D's zeroed.
struct SharedMemoryPools {
  static constexpr const char* kTls = "posix,cma,tcp";
  std::shared_ptr<UcxRegion> p_pool, d_pool;
  std::span<std::byte> p_mem, d_mem;

  SharedMemoryPools(size_t bytes, std::byte (*pattern)(size_t)) {
    auto p = UcxRegion::allocate(bytes, {.tls = kTls});
    auto d = UcxRegion::allocate(bytes, {.tls = kTls});
    EXPECT_TRUE(p.ok() && d.ok());
    if (!p.ok() || !d.ok()) return;
    p_pool = *p;
    d_pool = *d;
    p_mem = p_pool->bytes();
    d_mem = d_pool->bytes();
    for (size_t i = 0; i < bytes; ++i) p_mem[i] = pattern(i);
    std::fill(d_mem.begin(), d_mem.end(), std::byte{0});
  }
  bool ok() const { return p_pool && d_pool; }
};

class UcxTransportTest : public ::testing::TestWithParam<std::string> {};

TEST_P(UcxTransportTest, MessagesBothWaysAndGetIntoOwnMemory) {
  Side p(4 << 20, GetParam()), d(4 << 20, GetParam());
  ASSERT_TRUE(p.t && d.t);
  ConnId to_p = d.t->connect("127.0.0.1", p.t->port());
  d.t->send(to_p, {1, 2, 3});
  ASSERT_TRUE(waitFor([&] { return p.numMessages() == 1; }));
  ConnId from_d = p.messages[0].first;
  EXPECT_EQ(p.messages[0].second, (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_EQ(p.numAccepted(), 1u);
  p.t->send(from_d, std::vector<uint8_t>(100000, 9));  // a large control message still arrives whole
  ASSERT_TRUE(waitFor([&] { return d.numMessages() == 1; }));
  EXPECT_EQ(d.messages[0].first, to_p);
  EXPECT_EQ(d.messages[0].second.size(), 100000u);

  // D pulls 1 MiB from P's region at an offset into its own region.
  d.t->setRemoteRegion(to_p, p.t->regionBase(), p.t->regionLength(), p.t->packedRkey());
  std::fill(d.region.begin(), d.region.end(), std::byte{0});
  GetWaiter w;
  d.t->get(to_p, d.region.data() + 4096, 65536, 1 << 20, w.callback());
  ASSERT_TRUE(w.wait().ok()) << w.status;
  EXPECT_EQ(std::memcmp(d.region.data() + 4096, p.region.data() + 65536, 1 << 20), 0);
  EXPECT_EQ(d.region[4095], std::byte{0});  // nothing written outside the destination
  EXPECT_EQ(w.calls, 1);
  EXPECT_EQ(d.t->bytesRead(), 1u << 20);
  EXPECT_EQ(d.t->getsInFlight(), 0);
}

TEST_P(UcxTransportTest, ManyConcurrentGetsEachCompleteOnce) {
  Side p(8 << 20, GetParam()), d(8 << 20, GetParam());
  ConnId c = connectForGets(d, p);
  constexpr int kGets = 64;
  std::atomic<int> ok{0}, calls{0};
  for (int i = 0; i < kGets; ++i) {
    size_t off = static_cast<size_t>(i) * 128 * 1024;
    d.t->get(c, d.region.data() + off, off, 128 * 1024, [&](absl::Status s) {
      calls.fetch_add(1);
      if (s.ok()) ok.fetch_add(1);
    });
  }
  ASSERT_TRUE(waitFor([&] { return calls.load() == kGets; }));
  EXPECT_EQ(ok.load(), kGets);
  EXPECT_EQ(std::memcmp(d.region.data(), p.region.data(), kGets * 128 * 1024), 0);
}

TEST_P(UcxTransportTest, BadGetsFailWithoutTouchingThePeer) {
  Side p(1 << 20, GetParam()), d(1 << 20, GetParam());
  ConnId c = d.t->connect("127.0.0.1", p.t->port());
  wireUp(d, p, c);
  GetWaiter no_region;
  d.t->get(c, d.region.data(), 0, 16, no_region.callback());
  EXPECT_EQ(no_region.wait().code(), absl::StatusCode::kFailedPrecondition);
  d.t->setRemoteRegion(c, p.t->regionBase(), p.t->regionLength(), p.t->packedRkey());
  GetWaiter out_of_range;
  d.t->get(c, d.region.data(), (1 << 20) - 8, 16, out_of_range.callback());
  EXPECT_EQ(out_of_range.wait().code(), absl::StatusCode::kOutOfRange);
  GetWaiter unknown;
  d.t->get(9999, d.region.data(), 0, 16, unknown.callback());
  EXPECT_EQ(unknown.wait().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(d.t->getsInFlight(), 0);
}

TEST_P(UcxTransportTest, CancelledGetStillCompletesExactlyOnce) {
  Side p(64 << 20, GetParam()), d(64 << 20, GetParam());
  ConnId c = connectForGets(d, p);
  GetWaiter w;
  GetId g = d.t->get(c, d.region.data(), 0, 64 << 20, w.callback());
  d.t->cancelGet(g);
  absl::Status s = w.wait();
  EXPECT_TRUE(s.ok() || s.code() == absl::StatusCode::kCancelled) << s;
  expectCompletedOnce(*d.t, w);
}

TEST_P(UcxTransportTest, PeerGoneFailsOutstandingGetsAndReportsDisconnect) {
  auto p = std::make_unique<Side>(64 << 20, GetParam());
  Side d(64 << 20, GetParam());
  ConnId c = d.t->connect("127.0.0.1", p->t->port());
  d.t->send(c, {7});
  ASSERT_TRUE(waitFor([&] { return p->numMessages() == 1; }));
  d.t->setRemoteRegion(c, p->t->regionBase(), p->t->regionLength(), p->t->packedRkey());
  GetWaiter w;
  d.t->get(c, d.region.data(), 0, 64 << 20, w.callback());
  p.reset();  // the prefill side goes away mid-transfer
  absl::Status s = w.wait();
  EXPECT_EQ(w.calls, 1);
  // Either the get won the race, or it failed: it never hangs, never completes twice.
  if (!s.ok()) {
    EXPECT_TRUE(s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kCancelled) << s;
  }
  ASSERT_TRUE(waitFor([&] { return d.numDisconnects() == 1; }));
  EXPECT_EQ(d.disconnects[0].first, c);
  // A get on the dead connection fails at once.
  GetWaiter after;
  d.t->get(c, d.region.data(), 0, 16, after.callback());
  EXPECT_FALSE(after.wait().ok());
}

TEST_P(UcxTransportTest, SegmentedGetMergesNeighboursAndCompletesOnce) {
  Side p(1 << 20, GetParam()), d(1 << 20, GetParam());
  ConnId c = connectForGets(d, p);
  std::fill(d.region.begin(), d.region.end(), std::byte{0});
  constexpr size_t kBlock = 8192;
  using Seg = UcxTransport::Segment;
  std::byte* dst = d.region.data();
  // Blocks 0-3 are contiguous on both sides (one UCX get); block 4 is
  // contiguous locally but not remotely, block 5 remotely but not locally.
  std::vector<Seg> segs;
  for (size_t i = 0; i < 4; ++i) segs.push_back({dst + i * kBlock, 65536 + i * kBlock, kBlock});
  segs.push_back({dst + 4 * kBlock, 0, kBlock});
  segs.push_back({dst + 10 * kBlock, kBlock, kBlock});
  segs.push_back({dst + 20 * kBlock, 0, 0});  // empty segments are skipped
  const uint64_t issued_before = d.t->ucxGetsIssued();
  GetWaiter w;
  d.t->getv(c, segs, w.callback());
  ASSERT_TRUE(w.wait().ok()) << w.status;
  EXPECT_EQ(d.t->ucxGetsIssued() - issued_before, 3u);
  EXPECT_EQ(std::memcmp(dst, p.region.data() + 65536, 4 * kBlock), 0);
  EXPECT_EQ(std::memcmp(dst + 4 * kBlock, p.region.data(), kBlock), 0);
  EXPECT_EQ(std::memcmp(dst + 10 * kBlock, p.region.data() + kBlock, kBlock), 0);
  EXPECT_EQ(dst[5 * kBlock], std::byte{0});  // nothing between the destinations
  EXPECT_EQ(d.t->bytesRead(), 6 * kBlock);
  expectCompletedOnce(*d.t, w);
}

TEST_P(UcxTransportTest, SegmentedGetWithOneBadSegmentReadsNothing) {
  Side p(1 << 20, GetParam()), d(1 << 20, GetParam());
  ConnId c = connectForGets(d, p);
  std::fill(d.region.begin(), d.region.end(), std::byte{0});
  const uint64_t issued_before = d.t->ucxGetsIssued();
  GetWaiter w;
  d.t->getv(c, {{d.region.data(), 0, 4096}, {d.region.data() + 4096, (1 << 20) - 100, 4096}}, w.callback());
  absl::Status s = w.wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_NE(std::string(s.message()).find("outside the peer's region"), std::string::npos) << s;
  EXPECT_EQ(d.t->ucxGetsIssued(), issued_before);
  EXPECT_EQ(d.region[0], std::byte{0});
  EXPECT_EQ(d.t->bytesRead(), 0u);
  EXPECT_EQ(d.t->getsInFlight(), 0);
}

TEST_P(UcxTransportTest, CancelledSegmentedGetCompletesOnceAfterAllParts) {
  Side p(64 << 20, GetParam()), d(64 << 20, GetParam());
  ConnId c = connectForGets(d, p);
  // 64 parts of 1 MiB, none mergeable (reversed order on the remote side).
  std::vector<UcxTransport::Segment> segs;
  for (size_t i = 0; i < 64; ++i) segs.push_back({d.region.data() + i * (1 << 20), (63 - i) * (1 << 20), 1 << 20});
  GetWaiter w;
  GetId g = d.t->getv(c, segs, w.callback());
  d.t->cancelGet(g);
  absl::Status s = w.wait();
  EXPECT_TRUE(s.ok() || s.code() == absl::StatusCode::kCancelled) << s;
  expectCompletedOnce(*d.t, w);
}

TEST(UcxTransportStartTest, BadOptionsAreClearErrors) {
  std::vector<std::byte> region(4096);
  auto bad_host = UcxTransport::start({.host = "not-an-ip", .port = 0, .region = region}, {});
  ASSERT_FALSE(bad_host.ok());
  EXPECT_NE(std::string(bad_host.status().message()).find("not-an-ip"), std::string::npos);
  auto bad_tls =
      UcxTransport::start({.host = "127.0.0.1", .port = 0, .region = region, .tls = "no_such_transport"}, {});
  EXPECT_FALSE(bad_tls.ok());
}

// Over shared memory, a get from a pool UCX allocated is a copy from the
// peer's mapped memory by the reader alone: it completes while the peer's
// progress thread is stuck. That must hold even when the peer's region was
// set right after connect(), before the endpoint's wire-up (UCX 1.13 would
// otherwise emulate every such get with active messages the peer serves).
TEST(UcxTransportSharedMemoryTest, GetNeedsNoPeerProgressEvenIfTheRegionWasSetBeforeWireup) {
  SharedMemoryPools pools(1 << 20, [](size_t i) { return static_cast<std::byte>((i * 13 + 5) & 0xff); });
  ASSERT_TRUE(pools.ok());
  const std::span<std::byte> p_mem = pools.p_mem, d_mem = pools.d_mem;
  // P's progress thread blocks in its first message callback until released.
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> p_blocked{false};
  TransportCallbacks p_cb;
  p_cb.on_message = [&](ConnId, std::vector<uint8_t>) {
    p_blocked = true;
    released.wait();
  };
  auto p = UcxTransport::start({.host = "127.0.0.1", .port = 0, .pool = pools.p_pool}, p_cb);
  auto d = UcxTransport::start({.host = "127.0.0.1", .port = 0, .pool = pools.d_pool}, {});
  ASSERT_TRUE(p.ok() && d.ok());
  ConnId c = connectForGets(**d, **p);  // the region set before the wire-up
  (*d)->send(c, {1});
  ASSERT_TRUE(waitFor([&] { return p_blocked.load(); }));
  GetWaiter w;
  (*d)->get(c, d_mem.data(), 4096, 256 << 10, w.callback());
  bool done_while_blocked = false;
  {
    std::unique_lock l(w.mu);
    done_while_blocked = w.cv.wait_for(l, std::chrono::seconds(10), [&] { return w.calls > 0; });
  }
  release.set_value();
  EXPECT_TRUE(done_while_blocked) << "the get waited for the peer's progress thread (emulated, not a direct copy)";
  ASSERT_TRUE(w.wait().ok()) << w.status;
  EXPECT_EQ(std::memcmp(d_mem.data(), p_mem.data() + 4096, 256 << 10), 0);
}

// A large get over shared memory is shared by several copy threads: every
// byte lands where it should (pieces split across segment boundaries, at
// odd sizes), and nothing between the segments is touched.
TEST(UcxTransportSharedMemoryTest, LargeGetsCopiedByEveryThreadCountAreExact) {
  SharedMemoryPools pools(24 << 20, [](size_t i) { return static_cast<std::byte>((i * 31 + i / 4093) & 0xff); });
  ASSERT_TRUE(pools.ok());
  const std::span<std::byte> p_mem = pools.p_mem, d_mem = pools.d_mem;
  for (int threads : {1, 2, 3}) {
    std::fill(d_mem.begin(), d_mem.end(), std::byte{0xEE});
    std::atomic<bool> hello{false};
    TransportCallbacks p_cb;
    p_cb.on_message = [&](ConnId, std::vector<uint8_t>) { hello = true; };
    auto p = UcxTransport::start({.host = "127.0.0.1", .port = 0, .pool = pools.p_pool}, p_cb);
    auto d = UcxTransport::start({.host = "127.0.0.1", .port = 0, .pool = pools.d_pool, .copy_threads = threads}, {});
    ASSERT_TRUE(p.ok() && d.ok());
    ConnId c = connectForGets(**d, **p);
    (*d)->send(c, {1});
    ASSERT_TRUE(waitFor([&] { return hello.load(); }));
    // Five segments of odd sizes (3 MiB + 1 .. 3 MiB + 5), 17 bytes apart
    // here and 4 KiB apart on P: nothing merges, 15 MiB in all.
    std::vector<UcxTransport::Segment> segs;
    size_t local = 100, remote = 5000;
    for (size_t k = 1; k <= 5; ++k) {
      const size_t len = (size_t{3} << 20) + k;
      segs.push_back({d_mem.data() + local, remote, len});
      local += len + 17;
      remote += len + 4096;
    }
    GetWaiter w;
    (*d)->getv(c, segs, w.callback());
    ASSERT_TRUE(w.wait().ok()) << w.status;
    size_t at = 0;
    for (const auto& seg : segs) {
      const auto* dst = static_cast<const std::byte*>(seg.local);
      for (; d_mem.data() + at < dst; ++at)
        ASSERT_EQ(d_mem[at], std::byte{0xEE}) << "threads " << threads << " byte " << at;
      ASSERT_EQ(std::memcmp(dst, p_mem.data() + seg.remote_offset, seg.length), 0) << "threads " << threads;
      at += seg.length;
    }
    EXPECT_EQ(d_mem[at], std::byte{0xEE});
    EXPECT_EQ((*d)->bytesRead(), 5 * (size_t{3} << 20) + 15);
  }
  std::vector<std::byte> region(4096);
  EXPECT_FALSE(UcxTransport::start({.host = "127.0.0.1", .port = 0, .region = region, .copy_threads = 0}, {}).ok());
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxTransportTest, ::testing::Values("tcp", "posix,cma,tcp"), [](const auto& info) {
  return info.param == "tcp" ? std::string("Tcp") : std::string("SharedMemory");
});

}  // namespace
}  // namespace tandem::transport
