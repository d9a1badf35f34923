#!/usr/bin/env bash
# Runs determinism_digest under every variant of the CPU this machine can
# imitate and requires one digest (docs/engine.md, "Determinism"):
#   - each SIMD level of the engine's kernels it can run (TANDEM_CPU_SIMD);
#   - glibc's libm on its code paths for CPUs without AVX2, FMA and AVX-512
#     (GLIBC_TUNABLES hwcaps), with the portable kernels: as close to an old
#     x86-64 CPU as this machine gets;
#   - OpenBLAS told to use another core (the engine must not care).
# usage: cross_cpu_determinism.sh DIGEST_BINARY
set -euo pipefail
bin=$1
variant_script="$(dirname "$0")/../cpu_variant.sh"
no_vector_libm="glibc.cpu.hwcaps=-AVX2,-FMA,-AVX512F,-AVX512DQ,-AVX512BW,-AVX512VL,-AVX512CD"
want=""
status=0
check() {
  local name=$1; shift
  local out rc=0
  out=$("$@" 2>&1) || rc=$?
  if [[ $rc -eq 77 ]]; then
    echo "$name: $(echo "$out" | grep skipped)"
    return
  fi
  if [[ $rc -ne 0 ]]; then
    echo "FAIL $name: exit status $rc: $out"
    status=1
    return
  fi
  local digest
  digest=$(echo "$out" | grep '^logits ' | sed 's/ (simd.*//')
  echo "$name: $(echo "$out" | grep '^logits ')"
  if [[ -z $want ]]; then
    want=$digest
  elif [[ $digest != "$want" ]]; then
    echo "FAIL $name: digest differs from the first variant's ($want)"
    status=1
  fi
}
check "default" "$bin"
for level in portable avx2 avx512; do
  check "simd=$level" "$variant_script" simd "$level" "$bin"
done
check "simd=portable, glibc without AVX2/FMA/AVX-512" env GLIBC_TUNABLES="$no_vector_libm" "$variant_script" simd portable "$bin"
check "glibc without AVX2/FMA/AVX-512" env GLIBC_TUNABLES="$no_vector_libm" "$bin"
check "openblas=Prescott" "$variant_script" openblas Prescott "$bin"
if [[ $status -eq 0 ]]; then echo "one digest for every variant: $want"; fi
exit $status
