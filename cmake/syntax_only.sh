#!/usr/bin/env bash
# Compiler launcher for `./tandem check tsa`. CMake calls it as
#   syntax_only.sh <compiler> <flags...> -o <object> -c <source>
# It runs the compile with -fsyntax-only: clang parses the translation unit
# and runs its analyses (-Wthread-safety among them) but generates no code,
# which is several times cheaper than a build. The empty object file it
# leaves tells Ninja the step is done, so a second run re-checks only the
# files whose dependencies changed. Nothing in that build directory links.
set -euo pipefail
out=
prev=
for arg in "$@"; do
  [[ $prev == -o ]] && out=$arg
  prev=$arg
done
"$@" -fsyntax-only
if [[ -n $out ]]; then : >"$out"; fi
