#!/usr/bin/env bash
# What can be checked of the Dockerfile without Docker (there is no Docker
# engine here, and no network): it parses into named stages, takes every
# package list from ./tandem and repeats none, ./tandem's lists agree with
# each other and with what the binaries load (dpkg's local database only),
# every product binary lands in /usr/local/bin, it runs as 65532, it
# exposes DESIGN.md §5's ports, and the commands the operator and the chart
# run are on the image's PATH. hadolint runs only where it is installed:
# Debian 12 does not package it.
# usage: dockerfile_test.sh SOURCE_DIR BIN_DIR
set -uo pipefail
src=$1
bin=$2
dockerfile=${TANDEM_DOCKERFILE:-$src/Dockerfile}  # another file: to test this test
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
ok() { echo "ok: $*"; }

# --- the Dockerfile as instructions: comments dropped, continuations joined
# (one instruction per line, "KEYWORD args").
mapfile -t instr < <(sed -e '/^[[:space:]]*#/d' "$dockerfile" |
  awk '{ if (sub(/\\[[:space:]]*$/, "")) { buf = buf $0 " " } else { print buf $0; buf = "" } }' |
  sed -e 's/[[:space:]]\+/ /g' -e 's/^ //' | grep -v '^$')
[[ ${#instr[@]} -gt 0 ]] || { echo "FAIL: no instructions in $dockerfile"; exit 1; }

# --- stages: every FROM names its stage; --from= only names earlier stages.
stages=()
final_start=0
for i in "${!instr[@]}"; do
  line=${instr[$i]}
  case "$line" in
    FROM\ *)
      if [[ $line =~ ^FROM\ (--platform=[^ ]+\ )?([^ ]+)\ [Aa][Ss]\ ([a-z0-9._-]+)$ ]]; then
        base=${BASH_REMATCH[2]} name=${BASH_REMATCH[3]}
        [[ " ${stages[*]} " == *" $name "* ]] && fail "stage $name is defined twice"
        if [[ " ${stages[*]} " != *" $base "* && $base != debian:bookworm* ]]; then
          fail "stage $name starts from $base, not Debian 12 (bookworm) or an earlier stage"
        fi
        stages+=("$name")
        final_start=$i
      else
        fail "FROM without AS <stage>: $line"
      fi
      ;;
    *--from=*)
      from=$(sed -n 's/.*--from=\([^ ]*\).*/\1/p' <<<"$line")
      [[ " ${stages[*]} " == *" $from "* ]] || fail "--from=$from names no earlier stage: $line"
      ;;
  esac
done
[[ ${#stages[@]} -ge 2 ]] && ok "stages: ${stages[*]}" || fail "fewer than two stages: ${stages[*]}"
final=("${instr[@]:$final_start}")

# --- package lists: only ./tandem names packages.
mapfile -t dev_pkgs < <("$src/tandem" packages)
mapfile -t run_pkgs < <("$src/tandem" packages --runtime)
mapfile -t cuda_build < <("$src/tandem" packages --cuda)
mapfile -t cuda_run < <("$src/tandem" packages --runtime --cuda)
[[ ${#dev_pkgs[@]} -gt 0 && ${#run_pkgs[@]} -gt 0 ]] || fail "./tandem packages printed nothing"
for line in "${instr[@]}"; do
  [[ $line == RUN\ * ]] || continue
  # Each `apt-get install` / `apt install` takes options only: its packages
  # come from ./tandem's list (xargs) or ./tandem installs them itself.
  rest=$line
  while [[ $rest =~ apt(-get)?\ install(.*)$ ]]; do
    args=${BASH_REMATCH[2]}
    rest=$args
    args=${args%%&&*}
    args=${args%%;*}
    for word in $args; do
      [[ $word == -* ]] || fail "a package named in the Dockerfile ('$word'): install from ./tandem's lists instead"
    done
  done
done
grep -q '\./tandem packages [^|]*--install' <<<"$(printf '%s\n' "${instr[@]}")" ||
  fail "the build stage does not install ./tandem's packages (./tandem packages ... --install)"
grep -q '\./tandem packages --runtime' <<<"$(printf '%s\n' "${instr[@]}")" ||
  fail "the runtime stage's libraries do not come from ./tandem packages --runtime"
ok "package lists: ${#dev_pkgs[@]} build, ${#run_pkgs[@]} runtime, from ./tandem only"

# ./tandem's runtime libraries: each one a -dev package of PACKAGES depends
# on (dpkg's database for installed packages, else apt-cache's local lists).
deps_of() {
  local d
  d=$(dpkg-query -W -f='${Depends}' "$1" 2>/dev/null) ||
    d=$(apt-cache depends --no-recommends --no-suggests "$1" 2>/dev/null | sed -n 's/^ *Depends: //p' | paste -sd, -)
  tr ',|' '\n\n' <<<"$d" | sed -e 's/(.*)//' -e 's/:any//' -e 's/ //g' -e '/^$/d' -e 's/^<\(.*\)>$/\1/'
}
declare -A provider=()
for d in "${dev_pkgs[@]}"; do
  [[ $d == *-dev ]] || continue
  while IFS= read -r dep; do provider[$dep]+="$d "; done < <(deps_of "$d")
done
if [[ ${#provider[@]} -eq 0 ]]; then
  echo "skip: neither dpkg nor apt-cache knows the -dev packages here; runtime list not cross-checked"
else
  for r in "${run_pkgs[@]}"; do
    [[ -n ${provider[$r]:-} ]] && ok "runtime $r <- ${provider[$r]}" ||
      fail "runtime package $r is no dependency of a -dev package in ./tandem's PACKAGES"
  done
fi
# With --cuda: the same libraries, NVIDIA's CUDA-enabled UCX for Debian's.
for r in "${run_pkgs[@]}"; do
  [[ $r == libucx0 ]] && continue
  [[ " ${cuda_run[*]} " == *" $r "* ]] || fail "./tandem packages --runtime --cuda lacks $r"
done
[[ " ${cuda_run[*]} " != *" libucx0 "* ]] || fail "./tandem packages --runtime --cuda keeps Debian's libucx0 (no CUDA transports)"
[[ ${#cuda_build[@]} -gt ${#dev_pkgs[@]} ]] || fail "./tandem packages --cuda adds no CUDA toolkit"

# --- product binaries: the executables CMake builds outside tests/ and
# bench/, and what build/bin holds that is not a benchmark.
mapfile -t products < <(cd "$src" && find . -name CMakeLists.txt -not -path './build*' -not -path './tests/*' \
  -not -path './bench/*' -not -path '*/node_modules/*' -exec sed -n 's/^ *add_executable(\([^ )]*\).*/\1/p' {} + | sort -u)
if [[ -d $bin ]]; then
  for f in "$bin"/*; do
    name=$(basename "$f")
    [[ -x $f && $name != bench_* ]] || continue
    [[ " ${products[*]} " == *" $name "* ]] || products+=("$name")
  done
else
  echo "note: $bin does not exist; products from the CMake files only"
fi
[[ ${#products[@]} -gt 0 ]] || fail "no product binaries found"
# The build stage's binary directory (cmake -B DIR) and what the final stage copies from it.
build_dir=$(printf '%s\n' "${instr[@]}" | sed -n 's/.*cmake -S [^ ]* -B \([^ ]*\).*/\1/p' | head -1)
[[ -n $build_dir ]] || fail "no 'cmake -S ... -B DIR' in the Dockerfile"
copies=()
for line in "${final[@]}"; do
  [[ $line =~ ^COPY\ --from=build\ (.+)\ (/usr/local/bin/?)$ ]] || continue
  for s in ${BASH_REMATCH[1]}; do copies+=("$s"); done
done
on_path=()
for p in "${products[@]}"; do
  found=""
  for s in "${copies[@]}"; do
    # shellcheck disable=SC2053  # $s is a glob on purpose
    [[ $build_dir/bin/$p == $s || $build_dir/bin/$p == ${s%/}/* ]] && found=$s
  done
  if [[ -n $found ]]; then on_path+=("$p"); else fail "product binary $p is not copied into /usr/local/bin"; fi
  [[ $p == bench_* ]] && fail "a benchmark is copied: $p"
done
ok "copied into /usr/local/bin: ${on_path[*]}"

# Every library a product binary loads directly comes from ./tandem's
# runtime list (or is part of every Debian image: libc, libstdc++, libgcc).
# A sanitizer build (./tandem check asan runs this test on build-asan/bin)
# loads libasan and what its flags pull in: the image ships Release
# binaries, so only those are held to the runtime list.
# (readelf's output is read whole first: with pipefail, `grep -q` exiting at
# the first match could fail the pipeline by SIGPIPE to readelf.)
sanitized=0
[[ -x $bin/tandem-agent ]] && [[ $(readelf -d "$bin/tandem-agent") == *NEEDED*libasan* ]] && sanitized=1
[[ $sanitized -eq 1 ]] && echo "note: $bin holds a sanitizer build; the runtime-library check applies to Release binaries"
base_pkgs=" libc6 libstdc++6 libgcc-s1 "
declare -A lib_users=()   # resolved library path -> the binaries that load it
for p in "${on_path[@]}"; do
  [[ $sanitized -eq 1 ]] && break
  [[ -x $bin/$p ]] || continue
  needed=" $(readelf -d "$bin/$p" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | paste -sd' ' -) "
  while read -r lib path; do
    [[ $needed == *" $lib "* ]] && lib_users[$path]+="$p "
  done < <(ldd "$bin/$p" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }')
done
if [[ ${#lib_users[@]} -gt 0 ]]; then
  # One dpkg -S for all (it reads the whole file list each call); a
  # library may be found under /lib while dpkg knows it as /usr/lib.
  declare -A owner=()
  paths=()
  for path in "${!lib_users[@]}"; do paths+=("$path" "/usr$path" "$(readlink -f "$path")"); done
  while IFS= read -r line; do
    pkg=${line%%: *}
    owner[${line#*: }]=${pkg%%:*}
  done < <(dpkg -S "${paths[@]}" 2>/dev/null)
  before=$failures
  for path in "${!lib_users[@]}"; do
    pkg=${owner[$path]:-${owner[/usr$path]:-${owner[$(readlink -f "$path")]:-}}}
    if [[ -z $pkg ]]; then
      fail "$path (loaded by ${lib_users[$path]% }): no installed package owns it"
    elif [[ $base_pkgs != *" $pkg "* && " ${run_pkgs[*]} " != *" $pkg "* ]]; then
      fail "$path (loaded by ${lib_users[$path]% }) is in $pkg, which ./tandem's RUNTIME_PACKAGES lacks"
    fi
  done
  [[ $failures -eq $before ]] && ok "every library the binaries load: ./tandem's runtime list or the base image's"
fi

# --- user: numeric and non-root, so runAsNonRoot can check it.
user=$(printf '%s\n' "${final[@]}" | sed -n 's/^USER //p' | tail -1)
[[ $user =~ ^65532(:65532)?$ ]] && ok "USER $user" || fail "the final stage runs as '${user:-root}', not 65532"

# --- ports: DESIGN.md §5 (router 8000, agent 8100, UCX 8200, operator
# 8080), as the operator's code has them.
want="8000 8080 8100 8200"
got=$(printf '%s\n' "${final[@]}" | sed -n 's/^EXPOSE //p' | tr ' ' '\n' | sed 's|/tcp||' | sort -u | paste -sd' ' -)
[[ $got == "$want" ]] && ok "EXPOSE $got" || fail "EXPOSE $got, want $want"
for c in "kRouterPort = 8000" "kAgentPort = 8100" "kKvPort = 8200"; do
  grep -q "constexpr int $c;" "$src/operator/children.h" || fail "operator/children.h no longer has $c"
done
grep -q 'listen = "0.0.0.0:8080"' "$src/operator/main.cc" || fail "the operator's default listener is no longer 8080"

# --- commands: what the operator's pods and the chart's run must be on PATH.
if printf '%s\n' "${final[@]}" | grep -q '^ENV PATH='; then
  printf '%s\n' "${final[@]}" | grep '^ENV PATH=' | tail -1 | grep -q '/usr/local/bin' ||
    fail "the final stage's PATH leaves out /usr/local/bin"
fi
commands=()
mapfile -t -O 0 commands < <(sed -n 's/.*{"command", json::array({"\([^"]*\)".*/\1/p' "$src/operator/children.cc")
[[ ${#commands[@]} -gt 0 ]] || fail "no command found in operator/children.cc"
if [[ -d $src/helm/tandem/templates ]]; then
  # `command: [a, b]` or `command:` followed by `- a` lines.
  while IFS= read -r c; do commands+=("$c"); done < <(awk '
    /^[[:space:]]*command:[[:space:]]*\[/ { s = $0; sub(/.*\[[[:space:]]*/, "", s); sub(/[,\]].*/, "", s); print s; next }
    /^[[:space:]]*command:[[:space:]]*$/ { want = 1; next }
    want && /^[[:space:]]*-/ { s = $0; sub(/^[[:space:]]*-[[:space:]]*/, "", s); print s; want = 0; next }
    { want = 0 }' "$src"/helm/tandem/templates/*.yaml | tr -d "\"'")
fi
for c in "${commands[@]}"; do
  c=${c#/usr/local/bin/}
  [[ " ${on_path[*]} " == *" $c "* ]] && ok "command $c is in /usr/local/bin" || fail "command '$c' is not on the image's PATH"
done
entry=$(printf '%s\n' "${final[@]}" | sed -n 's/^ENTRYPOINT \["\([^"]*\)".*/\1/p' | tail -1)
if [[ -n $entry ]]; then
  grep -qF "> $entry" <<<"$(printf '%s\n' "${final[@]}")" || [[ " ${on_path[*]} " == *" ${entry##*/} "* ]] ||
    fail "ENTRYPOINT $entry is neither written nor copied in the final stage"
fi

# The CUDA build's binaries (./tandem check cuda), where one was built: the
# NVIDIA libraries they load are in ./tandem's CUDA runtime list.
if [[ -d $src/build-cuda/bin ]]; then
  "$src/tests/deploy/cuda_runtime_libs.sh" "$src" "$src/build-cuda/bin" || fail "the CUDA build loads a library the image lacks"
else
  echo "note: no build-cuda/bin (./tandem check cuda builds it); the CUDA binaries' libraries are checked there"
fi

if command -v hadolint >/dev/null; then
  hadolint "$dockerfile" || fail "hadolint"
else
  echo "note: hadolint not installed (Debian 12 does not package it); not run"
fi

if [[ $failures -gt 0 ]]; then echo "$failures failure(s)"; exit 1; fi
echo "all checks passed"
