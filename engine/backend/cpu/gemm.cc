#include "engine/backend/cpu/gemm.h"

#include <algorithm>

#include "engine/backend/cpu/simd_vec.h"

// This file is compiled with -ffp-contract=off (engine/backend/CMakeLists.txt):
// every fused multiply-add is an explicit Vec::fma, identical on every level.

namespace tandem::engine {
namespace {

// Threads take blocks of this many rows x columns of the output (whole
// tiles of every level). A block's w rows (64 x k floats) stay in L2 while
// its x rows pass under them.
constexpr int32_t kBlockRows = 64;
constexpr int32_t kBlockCols = 64;
// Calls with fewer multiply-adds than this run on the calling thread:
// waking the pool (~10-20 us) costs more than sharing saves (decode steps
// of small batches).
constexpr int64_t kMinParallelFmas = int64_t{1} << 22;
// Floats of x and w rows a sub-block keeps in L1 (32 KiB of the 32-48 KiB
// L1 data caches of current x86-64 cores).
constexpr size_t kL1Floats = 12288;

namespace portable {
using Vec = simd_vec::portable::Vec;
constexpr int32_t kTileRows = 2;
constexpr int32_t kTileCols = 2;
#include "engine/backend/cpu/gemm_kernel.inc"
}  // namespace portable

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
using Vec = simd_vec::avx2::Vec;
// 2 x 2 accumulators of two ymm each, plus two x rows and a w row: 14 of
// the 16 ymm registers.
constexpr int32_t kTileRows = 2;
constexpr int32_t kTileCols = 2;
#include "engine/backend/cpu/gemm_kernel.inc"
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
namespace avx512 {
using Vec = simd_vec::avx512::Vec;
// 4 x 4 accumulators, four x rows and a w row: 21 of the 32 zmm registers;
// per 16 k, 8 loads feed 16 FMAs, and the 16 sums fold together (hsum16).
constexpr int32_t kTileRows = 4;
constexpr int32_t kTileCols = 4;
#include "engine/backend/cpu/gemm_kernel.inc"
}  // namespace avx512
#pragma GCC pop_options

}  // namespace

Gemm::Gemm(SimdLevel simd, WorkerPool* pool) : simd_(resolveSimdLevel(simd)), block_(forSimdLevel<BlockFn>(simd_, &portable::gemmBlock, &avx2::gemmBlock, &avx512::gemmBlock)), pool_(pool) {}

void Gemm::run(const float* x, const float* w, float* y, int32_t m, int32_t n, int32_t k, bool accumulate) {
  const Args args{.x = x, .w = w, .y = y, .m = m, .n = n, .k = k, .accumulate = accumulate};
  const int64_t fmas = static_cast<int64_t>(m) * n * k;
  if (pool_->numThreads() == 1 || fmas < kMinParallelFmas) {
    block_(args, 0, m, 0, n);
    return;
  }
  const int32_t row_blocks = (m + kBlockRows - 1) / kBlockRows;
  const int32_t col_blocks = (n + kBlockCols - 1) / kBlockCols;
  // Column blocks outermost: consecutive items share one block of w (hot in
  // L2, read once from memory per call) while x, the smaller operand of a
  // prefill chunk, passes under it.
  pool_->parallelFor(int64_t{row_blocks} * col_blocks, [&](int64_t item, int /*thread*/) {
    const auto cb = static_cast<int32_t>(item / row_blocks);
    const auto rb = static_cast<int32_t>(item % row_blocks);
    block_(args, rb * kBlockRows, std::min(m, (rb + 1) * kBlockRows), cb * kBlockCols,
           std::min(n, (cb + 1) * kBlockCols));
  });
}

}  // namespace tandem::engine
