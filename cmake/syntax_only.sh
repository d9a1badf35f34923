#!/usr/bin/env bash
# Compiler and linker launcher for `./tandem check tsa`. CMake calls it as
#   syntax_only.sh <compiler> <flags...> -o <object> -c <source>    (compile)
#   syntax_only.sh <compiler> <flags...> <objects...> -o <binary> ... (link)
# A compile runs with -fsyntax-only: clang parses the translation unit and
# runs its analyses (-Wthread-safety among them) but generates no code, which
# is several times cheaper than a build. Either way the output is left as an
# empty file, so Ninja sees the step done (a test's objects wait for the
# binary it starts) and a second run re-checks only the files whose
# dependencies changed. Nothing in that build directory can run.
# A source whose path ends with an entry of $TANDEM_TSA_SKIP (space-separated)
# is not compiled and gets no output, so it is tried again on every run.
set -euo pipefail
out=
src=
prev=
for arg in "$@"; do
  [[ $prev == -o ]] && out=$arg
  [[ $prev == -c ]] && src=$arg
  prev=$arg
done
if [[ -n $src ]]; then
  for skip in ${TANDEM_TSA_SKIP:-}; do
    if [[ $src == */"$skip" ]]; then echo "skipped (TSA_SKIP): $skip"; exit 0; fi
  done
  "$@" -fsyntax-only
fi
if [[ -n $out ]]; then : >"$out"; fi
