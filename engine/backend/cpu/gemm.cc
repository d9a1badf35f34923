#include "engine/backend/cpu/gemm.h"

#include <algorithm>

#include "engine/backend/cpu/simd_vec.h"

// This file is compiled with -ffp-contract=off (engine/backend/CMakeLists.txt):
// every fused multiply-add is an explicit Vec::fma, identical on every level.

namespace tandem::engine {
namespace {

// Threads take blocks of this many rows x panels of the output (whole tiles
// of every level): a block's panels (12 x k x 16 floats) stay in L2 while its
// x rows pass under them.
constexpr int32_t kBlockRows = 48;
constexpr int32_t kBlockPanels = 12;
// Calls with fewer multiply-adds than this run on the calling thread:
// waking the pool (~10-20 us) costs more than sharing saves (decode steps
// of small batches).
constexpr int64_t kMinParallelFmas = int64_t{1} << 22;

namespace portable {
using Vec = simd_vec::portable::Vec;
constexpr int32_t kTileRows = 1;
constexpr int32_t kTilePanels = 1;
constexpr int32_t kFewRows = 1;
constexpr int32_t kFewRowsPanels = 1;
#include "engine/backend/cpu/gemm_kernel.inc"
}  // namespace portable

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
using Vec = simd_vec::avx2::Vec;
// 2 rows x 3 panels: 6 accumulators of two ymm each, one panel's weights and
// two broadcasts: 16 ymm registers.
constexpr int32_t kTileRows = 2;
constexpr int32_t kTilePanels = 3;
// 1 row x 6 panels: 12 ymm of accumulators.
constexpr int32_t kFewRows = 1;
constexpr int32_t kFewRowsPanels = 6;
#include "engine/backend/cpu/gemm_kernel.inc"
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
namespace avx512 {
using Vec = simd_vec::avx512::Vec;
// 6 rows x 4 panels: 24 accumulators, 4 panel vectors and a broadcast (29 of
// the 32 zmm registers); per step of p, 4 loads and 6 broadcasts feed 24 FMAs.
constexpr int32_t kTileRows = 6;
constexpr int32_t kTilePanels = 4;
// Up to 2 rows x 8 panels: 16 chains, 8 panel vectors and a broadcast.
constexpr int32_t kFewRows = 2;
constexpr int32_t kFewRowsPanels = 8;
#include "engine/backend/cpu/gemm_kernel.inc"
}  // namespace avx512
#pragma GCC pop_options

}  // namespace

PackedMatrix::PackedMatrix(const float* w, int32_t n, int32_t k)
    : PreparedWeight(n, k), panels_(static_cast<size_t>(numPanels()) * static_cast<size_t>(k) * kPanelRows, 0.0f) {
  for (int32_t j = 0; j < n; ++j) {
    float* dst = panels_.data() + static_cast<size_t>(j / kPanelRows) * static_cast<size_t>(k) * kPanelRows +
                 static_cast<size_t>(j % kPanelRows);
    const float* src = w + static_cast<size_t>(j) * static_cast<size_t>(k);
    for (int32_t p = 0; p < k; ++p) dst[static_cast<size_t>(p) * kPanelRows] = src[p];
  }
}

Gemm::Gemm(SimdLevel simd, WorkerPool* pool)
    : simd_(resolveSimdLevel(simd)),
      block_(forSimdLevel<BlockFn>(simd_, &portable::gemmBlock, &avx2::gemmBlock, &avx512::gemmBlock)),
      pool_(pool) {}

void Gemm::run(const float* x, const PackedMatrix& w, float* y, int32_t m, bool accumulate) {
  const Args args{.x = x, .w = &w, .y = y, .m = m, .n = w.n(), .k = w.k(), .accumulate = accumulate};
  const int32_t num_panels = w.numPanels();
  const int64_t fmas = static_cast<int64_t>(m) * w.n() * w.k();
  if (pool_->numThreads() == 1 || fmas < kMinParallelFmas) {
    block_(args, 0, m, 0, num_panels);
    return;
  }
  const int32_t row_blocks = (m + kBlockRows - 1) / kBlockRows;
  const int32_t panel_blocks = (num_panels + kBlockPanels - 1) / kBlockPanels;
  // Panel blocks outermost: consecutive items share one block of w (hot in
  // L2, read once from memory per call) while x passes under it.
  pool_->parallelFor(int64_t{row_blocks} * panel_blocks, [&](int64_t item, int /*thread*/) {
    const auto pb = static_cast<int32_t>(item / row_blocks);
    const auto rb = static_cast<int32_t>(item % row_blocks);
    block_(args, rb * kBlockRows, std::min(m, (rb + 1) * kBlockRows), pb * kBlockPanels,
           std::min(num_panels, (pb + 1) * kBlockPanels));
  });
}

}  // namespace tandem::engine
