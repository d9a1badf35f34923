#pragma once
// Which vector code the CPU backend's kernels run (GEMM, attention and the
// element-wise kernels), and how a level is chosen.
//
// Every level computes the same operations in the same order with the same
// fused multiply-adds, so all levels give bitwise-identical results; a level
// changes speed only (docs/engine.md, "Determinism"). That is also why a
// machine with AVX-512 and one with AVX2 only compute the same bits.
//
// The level is a switch so that tests can run every path the CPU supports:
// CpuBackendOptions::simd, or, for kAuto, the environment variable
// TANDEM_CPU_SIMD (auto | portable | avx2 | avx512), which lets a whole
// test binary or an agent run on one level without code changes.

#include <string_view>

#include "absl/status/statusor.h"

namespace tandem::engine {

enum class SimdLevel {
  kAuto,      // TANDEM_CPU_SIMD if set, else the best level this CPU supports
  kPortable,  // plain C++ (std::fma: slow on CPUs without FMA, where it is emulated)
  kAvx2,      // AVX2 + FMA
  kAvx512,    // AVX-512F
};

// Whether this CPU (and OS) can run `level`. kAuto and kPortable always can.
bool simdLevelSupported(SimdLevel level);

// The best level this CPU supports (never kAuto).
SimdLevel bestSimdLevel();

// "auto", "portable", "avx2" or "avx512".
std::string_view simdLevelName(SimdLevel level);

// Parses a level name as simdLevelName writes it; anything else is an
// InvalidArgument error naming the value and the accepted ones.
absl::StatusOr<SimdLevel> parseSimdLevel(std::string_view name);

// The level TANDEM_CPU_SIMD asks for: kAuto when unset or empty; an error
// when it names no level, or a level this CPU cannot run (so a test run
// meant for one path never silently runs another).
absl::StatusOr<SimdLevel> simdLevelFromEnvironment();

// The one of three per-level values (kernel entry points) that `level`
// (concrete, not kAuto) runs.
template <typename T>
T forSimdLevel(SimdLevel level, T portable, T avx2, T avx512) {
  switch (level) {
    case SimdLevel::kAvx512:
      return avx512;
    case SimdLevel::kAvx2:
      return avx2;
    default:
      return portable;
  }
}

// The concrete level a backend constructed with `requested` runs: kAuto
// resolves through simdLevelFromEnvironment() and then bestSimdLevel(); an
// explicit level the CPU cannot run falls back to bestSimdLevel(). Aborts
// with a message when TANDEM_CPU_SIMD is invalid (the agent checks it at
// start-up and reports it as a configuration error first).
SimdLevel resolveSimdLevel(SimdLevel requested);

}  // namespace tandem::engine
