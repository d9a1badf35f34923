// The CPU executor runs a launch grid faithfully: every thread of every
// block once with its indices, barriers and warp exchanges respected in
// order and in shuffled order, uninitialised shared memory visible as NaN,
// a missing barrier caught by shuffling, syncWarp within a warp, load4's
// alignment, and the launches the subset forbids
// or that would hang a GPU refused with an error that says why.

#include "engine/backend/cuda/cpu_executor.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <set>
#include <tuple>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/backend/cuda/portable.h"

namespace tandem::gpu {
namespace {

using ::testing::HasSubstr;

CpuExecutor::Options inOrder() { return {}; }
CpuExecutor::Options shuffled(uint64_t seed) { return {.shuffle = true, .seed = seed}; }

struct IndexArgs {
  int* seen;  // [grid z][grid y][grid x][block]
};
TANDEM_KERNEL recordIndices(const IndexArgs a) {
  const int linear = ((blockZ() * gridDimY() + blockY()) * gridDimX() + blockX()) * blockDimX() + threadX();
  a.seen[linear] += 1;
}

TEST(CpuExecutorTest, RunsEveryThreadOfEveryBlockOnceWithItsIndices) {
  CpuExecutor ex(inOrder());
  const LaunchConfig c{{3, 2, 2}, {64, 1, 1}, 0};
  std::vector<int> seen(3 * 2 * 2 * 64, 0);
  ASSERT_TRUE(ex.launch(c, &recordIndices, IndexArgs{seen.data()}).ok());
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), static_cast<long>(seen.size()));
}

// Thread t writes s[t], waits, reads its mirror: needs the barrier.
struct MirrorArgs {
  float* out;
  bool barrier;
};
TANDEM_KERNEL mirror(const MirrorArgs a) {
  float* s = sharedMemory<float>();
  const int t = threadX(), n = blockDimX();
  s[t] = static_cast<float>(blockX() * 1000 + t);
  if (a.barrier) syncThreads();
  a.out[blockX() * n + t] = s[n - 1 - t];
}

std::vector<float> runMirror(const CpuExecutor::Options& o, bool barrier) {
  CpuExecutor ex(o);
  std::vector<float> out(2 * 128);
  EXPECT_TRUE(ex.launch({{2, 1, 1}, {128, 1, 1}, 128 * sizeof(float)}, &mirror, MirrorArgs{out.data(), barrier}).ok());
  return out;
}

std::vector<float> expectedMirror() {
  std::vector<float> e(2 * 128);
  for (int b = 0; b < 2; ++b) {
    for (int t = 0; t < 128; ++t) e[static_cast<size_t>(b * 128 + t)] = static_cast<float>(b * 1000 + 127 - t);
  }
  return e;
}

TEST(CpuExecutorTest, ABarrierOrdersSharedMemoryInEveryRunOrder) {
  EXPECT_EQ(runMirror(inOrder(), true), expectedMirror());
  for (uint64_t seed = 1; seed <= 5; ++seed) EXPECT_EQ(runMirror(shuffled(seed), true), expectedMirror()) << seed;
}

TEST(CpuExecutorTest, AMissingBarrierShowsAsUninitialisedSharedMemory) {
  // In order, the first half reads slots the second half has not written:
  // NaN, as the executor fills shared memory at every block's start.
  const std::vector<float> in_order = runMirror(inOrder(), false);
  EXPECT_TRUE(std::isnan(in_order[0]));
  EXPECT_NE(in_order, expectedMirror());
  // Shuffled, every seed gets some reads wrong, and different seeds different ones.
  std::set<std::vector<bool>> patterns;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    const std::vector<float> out = runMirror(shuffled(seed), false);
    std::vector<bool> wrong;
    for (size_t i = 0; i < out.size(); ++i) wrong.push_back(out[i] != expectedMirror()[i]);
    EXPECT_GT(std::count(wrong.begin(), wrong.end(), true), 0) << seed;
    patterns.insert(wrong);
  }
  EXPECT_GT(patterns.size(), 1u);
}

// Warp exchanges: xor partners, a broadcast, and the butterfly sum whose
// bits every lane shares.
struct WarpArgs {
  float* xor1;
  float* from5;
  float* sum;
  const float* in;
};
TANDEM_KERNEL warpOps(const WarpArgs a) {
  const int t = threadX();
  const float v = a.in[t];
  a.xor1[t] = shflXor(v, 1);
  a.from5[t] = shflIdx(v, 5);
  a.sum[t] = warpSum(v);
}

TEST(CpuExecutorTest, WarpExchangesSeeTheirPartnersInEveryRunOrder) {
  std::vector<float> in(64);
  for (int i = 0; i < 64; ++i) in[static_cast<size_t>(i)] = 1.0f / static_cast<float>(i + 3);
  // The butterfly's order, spelled out for warp w: stage by stage, lane i adds lane i ^ mask.
  std::vector<float> expected_sum(64);
  for (int w = 0; w < 2; ++w) {
    std::vector<float> v(in.begin() + w * 32, in.begin() + w * 32 + 32);
    for (int mask = 16; mask > 0; mask /= 2) {
      std::vector<float> next(32);
      for (int i = 0; i < 32; ++i) next[static_cast<size_t>(i)] = v[static_cast<size_t>(i)] + v[static_cast<size_t>(i ^ mask)];
      v = next;
    }
    for (int i = 0; i < 32; ++i) expected_sum[static_cast<size_t>(w * 32 + i)] = v[0];
  }
  for (const CpuExecutor::Options& o : {inOrder(), shuffled(7), shuffled(8)}) {
    CpuExecutor ex(o);
    std::vector<float> xor1(64), from5(64), sum(64);
    ASSERT_TRUE(ex.launch({{1, 1, 1}, {64, 1, 1}, 0}, &warpOps, WarpArgs{xor1.data(), from5.data(), sum.data(), in.data()})
                    .ok());
    for (int i = 0; i < 64; ++i) {
      EXPECT_EQ(xor1[static_cast<size_t>(i)], in[static_cast<size_t>(i ^ 1)]) << i;
      EXPECT_EQ(from5[static_cast<size_t>(i)], in[static_cast<size_t>((i / 32) * 32 + 5)]) << i;
    }
    EXPECT_EQ(sum, expected_sum);
  }
}

// syncWarp orders shared memory within a warp: lane i reads its mirror
// lane's slot of its own warp. Warps do not wait for each other (warp 1
// stops at its barrier while warp 0 runs on).
struct WarpMirrorArgs {
  float* out;
  bool barrier;
};
TANDEM_KERNEL warpMirror(const WarpMirrorArgs a) {
  float* s = sharedMemory<float>();
  const int t = threadX(), base = warpId() * kWarpSize;
  s[t] = static_cast<float>(t);
  if (a.barrier) syncWarp();
  a.out[t] = s[base + kWarpSize - 1 - laneId()];
}

TEST(CpuExecutorTest, SyncWarpOrdersSharedMemoryWithinAWarp) {
  std::vector<float> expected(64);
  for (int t = 0; t < 64; ++t) expected[static_cast<size_t>(t)] = static_cast<float>((t / 32) * 32 + 31 - t % 32);
  const LaunchConfig c{{1, 1, 1}, {64, 1, 1}, 64 * sizeof(float)};
  for (const CpuExecutor::Options& o : {inOrder(), shuffled(3), shuffled(4)}) {
    CpuExecutor ex(o);
    std::vector<float> out(64);
    ASSERT_TRUE(ex.launch(c, &warpMirror, WarpMirrorArgs{out.data(), true}).ok());
    EXPECT_EQ(out, expected);
  }
  // Without it, in order, lane 0 reads lane 31's slot before lane 31 wrote it.
  CpuExecutor ex(inOrder());
  std::vector<float> out(64);
  ASSERT_TRUE(ex.launch(c, &warpMirror, WarpMirrorArgs{out.data(), false}).ok());
  EXPECT_TRUE(std::isnan(out[0]));
}

// load4 reads 16 aligned bytes; from a misaligned address a GPU faults, and
// the executor stops the program saying where.
struct Load4Args {
  const float* in;
  float* out;
};
TANDEM_KERNEL loadFour(const Load4Args a) {
  const Float4 v = load4(a.in + 4 * threadX());
  a.out[threadX()] = v.x + v.y + v.z + v.w;
}

TEST(CpuExecutorTest, Load4ReadsAlignedFloatsAndStopsOnAMisalignedOne) {
  alignas(16) float in[4 * 32 + 1];
  for (int i = 0; i < 4 * 32 + 1; ++i) in[i] = static_cast<float>(i);
  std::vector<float> out(32);
  CpuExecutor ex(inOrder());
  ASSERT_TRUE(ex.launch({{1, 1, 1}, {32, 1, 1}, 0}, &loadFour, Load4Args{in, out.data()}).ok());
  for (int t = 0; t < 32; ++t) EXPECT_EQ(out[static_cast<size_t>(t)], static_cast<float>(16 * t + 6)) << t;
  EXPECT_DEATH(
      {
        CpuExecutor misaligned(inOrder());
        (void)misaligned.launch({{1, 1, 1}, {32, 1, 1}, 0}, &loadFour, Load4Args{in + 1, out.data()});
      },
      "a 16-byte vector load from 0x[0-9a-f]+, not 16-byte aligned \\(thread 0 of block \\(0, 0, 0\\)\\)");
}

// load4Bf16: four bf16 values widened exactly, from an 8-byte aligned
// address; a misaligned one stops the program.
struct Load4Bf16Args {
  const uint16_t* in;
  float* out;
};
TANDEM_KERNEL loadFourBf16(const Load4Bf16Args a) {
  const Float4 v = load4Bf16(a.in + 4 * threadX());
  a.out[4 * threadX()] = v.x;
  a.out[4 * threadX() + 1] = v.y;
  a.out[4 * threadX() + 2] = v.z;
  a.out[4 * threadX() + 3] = v.w;
}

TEST(CpuExecutorTest, Load4Bf16WidensAlignedValuesAndStopsOnAMisalignedOne) {
  alignas(8) uint16_t in[4 * 32 + 1];
  for (int i = 0; i < 4 * 32 + 1; ++i) in[i] = engine::kmath::bf16Bits(static_cast<float>(i) * 0.5f - 3.0f);
  std::vector<float> out(4 * 32);
  CpuExecutor ex(inOrder());
  ASSERT_TRUE(ex.launch({{1, 1, 1}, {32, 1, 1}, 0}, &loadFourBf16, Load4Bf16Args{in, out.data()}).ok());
  for (int i = 0; i < 4 * 32; ++i) EXPECT_EQ(out[static_cast<size_t>(i)], static_cast<float>(i) * 0.5f - 3.0f) << i;
  EXPECT_DEATH(
      {
        CpuExecutor misaligned(inOrder());
        (void)misaligned.launch({{1, 1, 1}, {32, 1, 1}, 0}, &loadFourBf16, Load4Bf16Args{in + 1, out.data()});
      },
      "a 8-byte vector load from 0x[0-9a-f]+, not 8-byte aligned \\(thread 0 of block \\(0, 0, 0\\)\\)");
}

// Threads that return before a barrier count as arrived (as on the hardware).
struct EarlyArgs {
  int* out;
};
TANDEM_KERNEL earlyReturn(const EarlyArgs a) {
  if (threadX() >= 64) return;
  int* s = sharedMemory<int>();
  s[threadX()] = threadX();
  syncThreads();
  a.out[threadX()] = s[63 - threadX()];
}

TEST(CpuExecutorTest, ThreadsThatReturnedDoNotHoldABarrier) {
  CpuExecutor ex(shuffled(3));
  std::vector<int> out(64, -1);
  ASSERT_TRUE(ex.launch({{1, 1, 1}, {128, 1, 1}, 64 * sizeof(int)}, &earlyReturn, EarlyArgs{out.data()}).ok());
  for (int t = 0; t < 64; ++t) EXPECT_EQ(out[static_cast<size_t>(t)], 63 - t);
}

// Half a warp at syncThreads, the other half at an exchange: a real GPU
// hangs or corrupts; the executor says where the threads are.
struct DivergentArgs {
  float* out;
};
TANDEM_KERNEL divergent(const DivergentArgs a) {
  if (laneId() < 16) {
    syncThreads();
  } else {
    a.out[threadX()] = shflXor(1.0f, 1);
  }
}
TANDEM_KERNEL exchangeWithReturnedLanes(const DivergentArgs a) {
  if (laneId() == 31) return;
  a.out[threadX()] = shflXor(1.0f, 1);
}

TEST(CpuExecutorTest, DivergentBarriersAreAnErrorNotAHang) {
  CpuExecutor ex(inOrder());
  std::vector<float> out(64);
  const absl::Status s = ex.launch({{2, 1, 1}, {64, 1, 1}, 0}, &divergent, DivergentArgs{out.data()});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("block (0,0,0): divergent barriers"));
  EXPECT_THAT(s.message(), HasSubstr("warp 0 has 16 lanes at syncThreads and 16 at an exchange"));

  const absl::Status r = ex.launch({{1, 1, 1}, {32, 1, 1}, 0}, &exchangeWithReturnedLanes, DivergentArgs{out.data()});
  EXPECT_THAT(r.message(), HasSubstr("warp 0: a warp exchange (shflXor/shflIdx) with 1 of its lanes returned"));

  // The executor is usable after an abandoned block.
  std::vector<int> seen(64, 0);
  ASSERT_TRUE(ex.launch({{1, 1, 1}, {64, 1, 1}, 0}, &recordIndices, IndexArgs{seen.data()}).ok());
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 64);
}

TEST(CpuExecutorTest, LaunchShapesOutsideTheSubsetAreRefusedByName) {
  CpuExecutor ex(inOrder());
  std::vector<int> seen(4096, 0);
  const IndexArgs args{seen.data()};
  const std::vector<std::tuple<LaunchConfig, std::string>> bad = {
      {{{1, 1, 1}, {0, 1, 1}, 0}, "a block of 0x1x1 threads"},
      {{{1, 1, 1}, {48, 1, 1}, 0}, "a block of 48x1x1 threads"},
      {{{1, 1, 1}, {2048, 1, 1}, 0}, "a block of 2048x1x1 threads"},
      {{{1, 1, 1}, {32, 2, 1}, 0}, "a block of 32x2x1 threads"},
      {{{0, 1, 1}, {32, 1, 1}, 0}, "a grid of 0x1x1 blocks"},
      {{{1, 70000, 1}, {32, 1, 1}, 0}, "a grid of 1x70000x1 blocks"},
      {{{1, 1, 1}, {32, 1, 1}, 49 * 1024}, "50176 bytes of shared memory per block, over 49152"},
  };
  for (const auto& [config, message] : bad) {
    const absl::Status s = ex.launch(config, &recordIndices, args);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_THAT(s.message(), HasSubstr(message));
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 0), 4096) << "a refused launch ran threads";
}

TEST(CpuExecutorTest, ShuffleModeComesFromTheEnvironment) {
  const char* was = std::getenv("TANDEM_GPU_EXECUTOR_SHUFFLE");
  const std::string saved = was != nullptr ? was : "";
  ::setenv("TANDEM_GPU_EXECUTOR_SHUFFLE", "42", 1);
  const CpuExecutor::Options o = CpuExecutor::optionsFromEnvironment();
  ::unsetenv("TANDEM_GPU_EXECUTOR_SHUFFLE");
  EXPECT_TRUE(o.shuffle);
  EXPECT_EQ(o.seed, 42u);
  EXPECT_FALSE(CpuExecutor::optionsFromEnvironment().shuffle);
  if (was != nullptr) ::setenv("TANDEM_GPU_EXECUTOR_SHUFFLE", saved.c_str(), 1);
}

}  // namespace
}  // namespace tandem::gpu
