#!/usr/bin/env bash
# Compiler and linker launcher for `./tandem check tsa`. CMake calls it as
#   syntax_only.sh --skip=<a.cc,b.cc> <compiler> <flags...> -o <object> -c <source>
#   syntax_only.sh --skip=<a.cc,b.cc> <compiler> <flags...> <objects...> -o <binary> ...
# A compile runs with -fsyntax-only: clang parses the translation unit and
# runs its analyses (-Wthread-safety among them) but generates no code, which
# is several times cheaper than a build. Either way the output is left as an
# empty file, so Ninja sees the step done (archives and links of empty files
# succeed, and a test's objects wait for the binary it starts) and a second
# run re-checks only the files whose dependencies changed. Nothing in that
# build directory can run.
# A source whose path ends with an entry of --skip is not compiled. The list
# is part of every command line, so changing it re-checks everything.
set -euo pipefail
skips=${1#--skip=}
shift
out=
src=
prev=
for arg in "$@"; do
  [[ $prev == -o ]] && out=$arg
  [[ $prev == -c ]] && src=$arg
  prev=$arg
done
compile=1
for skip in ${skips//,/ }; do
  if [[ -n $src && $src == */"$skip" ]]; then echo "not checked (TSA_SKIP): $skip"; compile=0; fi
done
if [[ -n $src && $compile -eq 1 ]]; then "$@" -fsyntax-only; fi
if [[ -n $out ]]; then : >"$out"; fi
