#pragma once
// CpuBackend's GEMM, y[m, n] = x[m, k] · w[n, k]ᵀ (or y += x · wᵀ), with a
// reduction order fixed by construction, so the engine's batch invariance
// does not rest on any BLAS library's choice of kernel.
//
// Every output element is computed the same way, whatever m, the row's
// place in x, the tile or the thread that computes it, and the SIMD level:
//   s = +0; for p = 0, 1, ..., k-1 in order: s = fma(x[i][p], w[j][p], s)
//   (one fused multiply-add per step, one chain); y[i][j] = s, or with
//   `accumulate` y[i][j] + s (one rounding).
// Threads split the outputs (blocks of rows x columns), never k; a tile only
// decides which outputs share loads. So a row's bits depend on its own x row
// and w alone: the same alone, in any batch, in a chunked or a one-shot
// prefill, on 1 or N threads, and on an AVX-512, AVX2 or FMA-less CPU
// (docs/engine.md, "Determinism").
//
// The kernel is an outer product: 16 consecutive outputs of a row are one
// vector, each step adds x[i][p] (broadcast) times 16 weights w[j..j+16][p].
// So w is read in *panels*: 16 rows of w interleaved, [k][16] floats each
// (PackedMatrix). The model packs its weights once at load
// (Backend::prepareWeight); a call with a plain w packs it first (same bits).
//
// Why not a BLAS: OpenBLAS picks kernels by shape and CPU (small-matrix,
// GEMV-forward, Haswell vs SkylakeX microkernels), each with its own
// summation order, so its rows changed with the batch size on some CPUs.
//
// Not thread-safe: one thread calls run() at a time (the backend's owner).

#include <cstdint>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/simd.h"
#include "engine/backend/cpu/worker_pool.h"

namespace tandem::engine {

// w [n, k] as panels of 16 rows: panel q holds rows [16q, 16q + 16) as
// [k][16] floats, rows past n zero. What Gemm reads; immutable once made.
class PackedMatrix final : public PreparedWeight {
 public:
  static constexpr int32_t kPanelRows = 16;

  // Packs w (row-major [n, k]). n, k > 0.
  PackedMatrix(const float* w, int32_t n, int32_t k);

  int32_t numPanels() const { return (n() + kPanelRows - 1) / kPanelRows; }
  const float* panel(int32_t q) const {
    return panels_.data() + static_cast<size_t>(q) * static_cast<size_t>(k()) * kPanelRows;
  }

 private:
  std::vector<float> panels_;  // [numPanels][k][16]
};

class Gemm {
 public:
  // Runs on `pool` (not owned; outlives this) at resolveSimdLevel(simd).
  Gemm(SimdLevel simd, WorkerPool* pool);

  // y = x · wᵀ (accumulate: y += x · wᵀ); x [m, k] and y [m, n] row-major
  // and dense, with (n, k) = (w.n(), w.k()). x and y must not overlap. m > 0.
  void run(const float* x, const PackedMatrix& w, float* y, int32_t m, bool accumulate);

  SimdLevel simdLevel() const { return simd_; }

  // The arguments of one call, as the per-level kernels see them (gemm.cc).
  struct Args {
    const float* x;
    const PackedMatrix* w;
    float* y;
    int32_t m, n, k;
    bool accumulate;
  };
  // Rows [row_begin, row_end) x panels [panel_begin, panel_end) of the output.
  using BlockFn = void (*)(const Args& args, int32_t row_begin, int32_t row_end, int32_t panel_begin,
                           int32_t panel_end);

 private:
  SimdLevel simd_;
  BlockFn block_;
  WorkerPool* pool_;
};

}  // namespace tandem::engine
