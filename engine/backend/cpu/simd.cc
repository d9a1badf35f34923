#include "engine/backend/cpu/simd.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "src/common/strings.h"

namespace tandem::engine {

SimdLevel bestSimdLevel() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return SimdLevel::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return SimdLevel::kAvx2;
  return SimdLevel::kPortable;
}

bool simdLevelSupported(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512:
      return bestSimdLevel() == SimdLevel::kAvx512;
    case SimdLevel::kAvx2:
      return bestSimdLevel() != SimdLevel::kPortable;
    default:
      return true;
  }
}

std::string_view simdLevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAuto:
      return "auto";
    case SimdLevel::kPortable:
      return "portable";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kAvx512:
      return "avx512";
  }
  return "?";
}

absl::StatusOr<SimdLevel> parseSimdLevel(std::string_view name) {
  for (SimdLevel level : {SimdLevel::kAuto, SimdLevel::kPortable, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (name == simdLevelName(level)) return level;
  }
  return absl::InvalidArgumentError(
      strCat("unknown SIMD level \"", name, "\": expected auto, portable, avx2 or avx512"));
}

absl::StatusOr<SimdLevel> simdLevelFromEnvironment() {
  const char* value = std::getenv("TANDEM_CPU_SIMD");
  if (value == nullptr || *value == '\0') return SimdLevel::kAuto;
  absl::StatusOr<SimdLevel> level = parseSimdLevel(value);
  if (!level.ok()) return absl::InvalidArgumentError(strCat("TANDEM_CPU_SIMD: ", level.status().message()));
  if (!simdLevelSupported(*level)) {
    return absl::InvalidArgumentError(strCat("TANDEM_CPU_SIMD=", value, ": this CPU cannot run that level (best: ",
                                             simdLevelName(bestSimdLevel()), ")"));
  }
  return *level;
}

SimdLevel resolveSimdLevel(SimdLevel requested) {
  if (requested == SimdLevel::kAuto) {
    absl::StatusOr<SimdLevel> from_env = simdLevelFromEnvironment();
    if (!from_env.ok()) {
      std::fprintf(stderr, "fatal: %s\n", std::string(from_env.status().message()).c_str());
      std::abort();
    }
    requested = *from_env;
  }
  if (requested == SimdLevel::kAuto || !simdLevelSupported(requested)) return bestSimdLevel();
  return requested;
}

}  // namespace tandem::engine
