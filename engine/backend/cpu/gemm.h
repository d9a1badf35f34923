#pragma once
// CpuBackend's GEMM, y[m, n] = x[m, k] · w[n, k]ᵀ (or y += x · wᵀ), with a
// reduction order fixed by construction, so the engine's batch invariance
// does not rest on any BLAS library's choice of kernel.
//
// Every output element is computed the same way, whatever m, the row's
// place in x, the tile or the thread that computes it, and the SIMD level:
//   lane l (0 <= l < 16) of an accumulator sums x[i][p] * w[j][p] for
//     p = l, l + 16, l + 32, ... < k, in that order, each step one fused
//     multiply-add (starting from +0; p past k contributes nothing);
//   the 16 lanes are added in one fixed tree (lane i + lane i+8, then + 4,
//     + 2, + 1: simd_vec.h's hsum);
//   with `accumulate`, y[i][j] + that sum (one rounding), else the sum.
// Threads split the outputs (blocks of rows x columns), never k; a tile of
// rows and columns only decides which outputs share loads. So a row's bits
// depend on its own x row and w alone: the same alone, in any batch, in a
// chunked or a one-shot prefill, on 1 or N threads, and on an AVX-512, AVX2
// or FMA-less CPU (docs/engine.md, "Determinism").
//
// Why this shape and not a BLAS: OpenBLAS picks kernels by shape and CPU
// (small-matrix, GEMV-forward, Haswell vs SkylakeX microkernels), each with
// its own summation order, so its rows changed with the batch size on some
// CPUs. Lanes across k read x and w in their natural row-major layout: no
// packing of the weights (no second copy, nothing per call), and a decode
// step's m = 1 reads w straight through like a GEMV.
//
// Not thread-safe: one thread calls run() at a time (the backend's owner).

#include <cstdint>

#include "engine/backend/cpu/simd.h"
#include "engine/backend/cpu/worker_pool.h"

namespace tandem::engine {

class Gemm {
 public:
  // Runs on `pool` (not owned; outlives this) at resolveSimdLevel(simd).
  Gemm(SimdLevel simd, WorkerPool* pool);

  // y = x · wᵀ (accumulate: y += x · wᵀ); x [m, k], w [n, k], y [m, n], all
  // row-major and dense. x, w and y must not overlap. m, n, k > 0.
  void run(const float* x, const float* w, float* y, int32_t m, int32_t n, int32_t k, bool accumulate);

  SimdLevel simdLevel() const { return simd_; }

  // The arguments of one call, as the per-level kernels see them (gemm.cc).
  struct Args {
    const float* x;
    const float* w;
    float* y;
    int32_t m, n, k;
    bool accumulate;
  };
  using BlockFn = void (*)(const Args& args, int32_t row_begin, int32_t row_end, int32_t col_begin, int32_t col_end);

 private:
  SimdLevel simd_;
  BlockFn block_;
  WorkerPool* pool_;
};

}  // namespace tandem::engine
