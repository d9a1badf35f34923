#!/usr/bin/env bash
# The engine's results must not depend on which BLAS kernels a machine picks
# (docs/engine.md, "Determinism"): no binary that runs the engine may load a
# BLAS library at all. OpenBLAS is the benchmark's yardstick and a
# test-only cross-check, nothing else.
# usage: no_blas_test.sh BINARY...
set -euo pipefail
status=0
for bin in "$@"; do
  if [[ ! -x $bin ]]; then
    echo "FAIL: $bin is not an executable"
    status=1
    continue
  fi
  blas=$(ldd "$bin" | grep -Ei 'blas|lapack' || true)
  if [[ -n $blas ]]; then
    echo "FAIL: $bin loads a BLAS library:"
    echo "$blas"
    status=1
  else
    echo "ok: $bin loads no BLAS library"
  fi
done
exit $status
