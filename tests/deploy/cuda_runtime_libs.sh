#!/usr/bin/env bash
# Every NVIDIA library a CUDA build's binaries load has its package in
# ./tandem's CUDA runtime list (`./tandem packages --runtime --cuda`), so the
# image (Dockerfile) does not ship a binary that cannot start. The CUDA
# toolkit on these machines is not installed by dpkg, so the library ->
# package map is NVIDIA's repository naming for CUDA 13 (libcudart.so.13 in
# cuda-cudart-13-0, libcublas*.so.13 in libcublas-13-0, libnccl.so.2 in
# libnccl2); a library of /usr/local/cuda the map does not know fails.
# Other libraries are Debian's and dockerfile_test.sh checks those.
# usage: cuda_runtime_libs.sh SOURCE_DIR CUDA_BIN_DIR
set -uo pipefail
src=$1
bin=$2
mapfile -t cuda_run < <("$src/tandem" packages --runtime --cuda)
failures=0
checked=0
for b in "$bin"/tandem-*; do
  [[ -x $b ]] || continue
  checked=$((checked + 1))
  while read -r lib; do
    case "$lib" in
      libcudart.so.13) pkg=cuda-cudart-13-0 ;;
      libcublas.so.13 | libcublasLt.so.13) pkg=libcublas-13-0 ;;
      libnccl.so.2) pkg=libnccl2 ;;
      libcuda.so.1) continue ;;  # the driver's, from the node (NVIDIA's container toolkit mounts it)
      libcu* | libnv* | libnccl*) echo "FAIL: $(basename "$b") loads $lib, which this check cannot map to an NVIDIA package"; failures=$((failures + 1)); continue ;;
      *) continue ;;
    esac
    if [[ " ${cuda_run[*]} " == *" $pkg "* ]]; then
      echo "ok: $(basename "$b") loads $lib <- $pkg"
    else
      echo "FAIL: $(basename "$b") loads $lib (NVIDIA's $pkg), which ./tandem's CUDA_RUNTIME_PACKAGES lacks"
      failures=$((failures + 1))
    fi
  done < <(readelf -d "$b" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
done
[[ $checked -gt 0 ]] || { echo "FAIL: no tandem-* binary in $bin"; exit 1; }
exit $((failures > 0))
