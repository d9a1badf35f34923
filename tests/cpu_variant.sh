#!/usr/bin/env bash
# Runs a test binary under one CPU variant, for the CTest variants that
# tandem_test_variants registers (cmake/tandem.cmake):
#
#   cpu_variant.sh simd LEVEL COMMAND...       TANDEM_CPU_SIMD=LEVEL (portable, avx2, avx512)
#   cpu_variant.sh openblas CORE COMMAND...    OPENBLAS_CORETYPE=CORE (Prescott, Nehalem,
#                                              Sandybridge, Haswell, Zen, SkylakeX, Cooperlake)
#
# Where this CPU cannot run the variant, prints which flag it lacks and exits
# 77, which CTest reports as skipped (SKIP_RETURN_CODE).
set -euo pipefail
if [[ $# -lt 3 ]]; then
  echo "usage: $0 simd|openblas VALUE COMMAND [ARGS...]" >&2
  exit 2
fi
kind=$1 value=$2
shift 2
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
need() {
  for f in "$@"; do
    if [[ $flags != *" $f "* ]]; then
      echo "skipped: $kind=$value needs the CPU flag '$f', which this CPU lacks"
      exit 77
    fi
  done
}
case $kind in
  simd)
    case $value in
      portable) ;;
      avx2) need avx2 fma ;;
      avx512) need avx512f avx2 fma ;;
      *) echo "$0: unknown SIMD level '$value' (portable, avx2, avx512)" >&2; exit 2 ;;
    esac
    export TANDEM_CPU_SIMD=$value
    ;;
  openblas)
    case $value in
      Prescott) need sse2 pni ;;
      Nehalem) need ssse3 sse4_2 ;;
      Sandybridge) need avx ;;
      Haswell | Zen) need avx2 fma ;;
      SkylakeX) need avx512f avx512cd avx512bw avx512dq avx512vl ;;
      Cooperlake) need avx512f avx512cd avx512bw avx512dq avx512vl avx512_bf16 ;;
      *) echo "$0: unknown OpenBLAS core type '$value'" >&2; exit 2 ;;
    esac
    export OPENBLAS_CORETYPE=$value
    ;;
  *) echo "$0: unknown variant kind '$kind' (simd, openblas)" >&2; exit 2 ;;
esac
echo "running under $kind=$value: $*"
exec "$@"
