#!/usr/bin/env bash
# Packs the CUDA build (build-cuda/bin after `./tandem check cuda`) with the
# shared libraries it loads into one folder, for a GPU machine that has the
# NVIDIA driver but not this project's build dependencies (no Debian UCX,
# cpprestsdk, abseil ...; another distribution's C library).
#
#   e2e/gpu-bundle.sh OUT          # writes OUT/{bin,real,lib,system,cxx,ucx,tools} and OUT.tgz
#   e2e/gpu-smoke.sh --bundle OUT  # on the GPU machine: runs the checks from OUT
#
# OUT/bin/NAME runs OUT/real/NAME with OUT/lib first on its library path, so
# UCX (its transport modules in OUT/ucx), cpprestsdk, abseil and the rest are
# this machine's, whatever the GPU machine has. Where the GPU machine's C
# library is older than this machine's, the bundled one (OUT/system) runs
# the binary through its own dynamic loader; where its C++ runtime lacks a
# version the binaries use, the bundled one (OUT/cxx) is used. What is NOT bundled comes from the GPU machine: the driver
# (libcuda.so.1, which must match its kernel module) and cuBLASLt and NCCL
# (hundreds of MB each). The wrapper finds those in the CUDA toolkit there
# (/usr/local/cuda), the driver's folders, or a Python install's NVIDIA wheels,
# or in TANDEM_CUDA_LIBS (a colon-separated list of folders). TANDEM_UCX_LIBS
# (a folder with libucp.so.0 and its modules in ucx/) puts another UCX, one
# with CUDA support, in place of the bundled one: gpu-smoke.sh's direct-path
# run uses it where the GPU machine has one.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[[ $# -eq 1 && -n $1 && $1 != / ]] || { echo "usage: e2e/gpu-bundle.sh OUT (a folder to make)" >&2; exit 2; }
out=${1%/}
src=$ROOT/build-cuda/bin
bins=(tandem-agent tandem-gpu-kernel-check tandem-make-model)
for b in "${bins[@]}"; do
  [[ -x $src/$b ]] || { echo "gpu-bundle: $src/$b is missing: run ./tandem check cuda first" >&2; exit 1; }
done

rm -rf "$out"
mkdir -p "$out/bin" "$out/real" "$out/lib" "$out/system" "$out/cxx" "$out/ucx"
# The C library goes to system/: used only where the GPU machine's C library
# is older than this one's (a newer one runs these binaries, and the GPU
# machine's own CUDA libraries may need it). The C++ runtime goes to cxx/:
# used where the machine's lacks a version these binaries need.
system='^(ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so)'
cxx='^(libstdc\+\+\.so|libgcc_s\.so)'
getconf GNU_LIBC_VERSION | awk '{print $2}' >"$out/system/glibc-version"
# Left to the GPU machine: the driver and the two large CUDA libraries.
skip='^(linux-vdso\.so|libcuda\.so|libcublasLt\.so|libcublas\.so|libnccl\.so)'
for b in "${bins[@]}"; do
  cp "$src/$b" "$out/real/$b"
  while read -r name _ path _; do
    [[ $name =~ $skip ]] && continue
    [[ $name == /* ]] && path=$name  # the loader: "/lib64/ld-linux-x86-64.so.2 (0x...)"
    [[ -f ${path:-} ]] || { echo "gpu-bundle: $b needs $name, which ldd did not find" >&2; exit 1; }
    name=$(basename "$name")
    if [[ $name =~ $system ]]; then
      cp -L "$path" "$out/system/$name"
    elif [[ $name =~ $cxx ]]; then
      cp -L "$path" "$out/cxx/$name"
    else
      cp -L "$path" "$out/lib/$name"
    fi
  done < <(ldd "$src/$b" | sed 's/^[[:space:]]*//')
done
# UCX loads some transports as modules from a folder fixed at its build;
# UCX_MODULE_DIR points it at the bundled copies. Only cma (shared memory
# between processes) comes along: the smoke test runs on loopback, and the
# InfiniBand modules with their libraries would not fit the 64 MiB a GPU
# machine is sent here (tcp and the other shared-memory transports are in
# libuct itself).
ucx_modules=$(dirname "$(ldd "$src/tandem-agent" | awk '$1 ~ /^libucs\.so/ {print $3}')")/ucx
cma=$ucx_modules/libuct_cma.so.0
cp -L "$cma" "$out/ucx/libuct_cma.so"
while read -r name _ path _; do
  [[ $name =~ $skip || $name =~ $system || $name =~ $cxx || -f $out/lib/$name || ! -f ${path:-} ]] && continue
  cp -L "$path" "$out/lib/$name"
done < <(ldd "$cma" | sed 's/^[[:space:]]*//')

# The newest C++ runtime version the binaries and bundled libraries use.
grep -aoh 'GLIBCXX_3\.4\.[0-9]*' "$out"/real/* "$out"/lib/* "$out"/ucx/* | sort -uV | tail -1 >"$out/cxx/glibcxx-version"

for b in "${bins[@]}"; do
  cat >"$out/bin/$b" <<'SH'
#!/usr/bin/env bash
# Runs the bundled binary of this name with the bundled libraries (e2e/gpu-bundle.sh).
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cuda_libs=${TANDEM_CUDA_LIBS:-}
if [[ -z $cuda_libs ]]; then
  for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64 \
           /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
           /usr/local/lib/python3*/dist-packages/nvidia/*/lib /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib \
           /usr/lib/python3*/site-packages/nvidia/*/lib /usr/local/lib/python3*/site-packages/nvidia/*/lib; do
    [[ -d $d ]] && compgen -G "$d/lib*.so*" >/dev/null && cuda_libs+="${cuda_libs:+:}$d"
  done
fi
export UCX_MODULE_DIR="$here/ucx"
# The machine's C library where it is at least the bundle's (its CUDA
# libraries may need its version), else the bundled one through its loader;
# the machine's C++ runtime where it has the newest version these binaries
# use, else the bundled one.
built=$(cat "$here/system/glibc-version")
have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
libs=$here/lib
ldconfig=$(command -v ldconfig || echo /sbin/ldconfig)
[[ -x $ldconfig ]] || ldconfig=/usr/sbin/ldconfig
machine_cxx=$("$ldconfig" -p 2>/dev/null | awk '$1 == "libstdc++.so.6" && /x86-64/ {print $NF}' | head -1)
if [[ -z $machine_cxx ]] || ! grep -aq "$(cat "$here/cxx/glibcxx-version")" "$machine_cxx"; then
  libs=$here/cxx:$libs
fi
if [[ -n ${TANDEM_UCX_LIBS:-} ]]; then  # another UCX (one with CUDA support) before the bundled one
  libs=$TANDEM_UCX_LIBS:$libs
  export UCX_MODULE_DIR="$TANDEM_UCX_LIBS/ucx"
fi
if [[ -n $have && $(printf '%s\n%s\n' "$built" "$have" | sort -V | head -1) == "$built" ]]; then
  export LD_LIBRARY_PATH="$libs${cuda_libs:+:$cuda_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  exec "$here/real/$(basename "$0")" "$@"
fi
exec "$here/system/ld-linux-x86-64.so.2" \
  --library-path "$here/system:$here/cxx:${TANDEM_UCX_LIBS:+$TANDEM_UCX_LIBS:}$here/lib${cuda_libs:+:$cuda_libs}" \
  "$here/real/$(basename "$0")" "$@"
SH
  chmod +x "$out/bin/$b"
done
# gpu-smoke.sh's P/D run asks the agents with curl; GPU images often have
# python3 but no curl, so the bundle carries a stand-in for the one use it
# makes (curl -sf --max-time N URL), put on PATH only where curl is missing.
mkdir -p "$out/tools"
cat >"$out/tools/curl" <<'PY'
#!/usr/bin/env python3
# Stand-in for `curl -sf --max-time N URL` (e2e/gpu-bundle.sh): prints the
# body, exits 22 on an HTTP error and 7 when the request fails, as curl -f does.
import sys, urllib.error, urllib.request
args, timeout, url = sys.argv[1:], 30.0, None
while args:
    a = args.pop(0)
    if a == "--max-time":
        timeout = float(args.pop(0))
    elif not a.startswith("-"):
        url = a
try:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        sys.stdout.buffer.write(r.read())
except urllib.error.HTTPError:
    sys.exit(22)
except Exception:
    sys.exit(7)
PY
chmod +x "$out/tools/curl"
tar -C "$(dirname "$out")" -czf "$out.tgz" "$(basename "$out")"
libs=("$out"/lib/*.so* "$out"/system/*.so* "$out"/cxx/*.so*)
echo "gpu-bundle: $out: ${bins[*]} and ${#libs[@]} libraries, $(du -sh "$out" | cut -f1); $out.tgz: $(du -sh "$out.tgz" | cut -f1)"
