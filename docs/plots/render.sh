#!/usr/bin/env bash
# Renders the plots of docs/benchmarks.md into docs/img/ from fresh runs of
# tandem-sim and tandem-replay on ../shared/traces (about a minute on two
# cores; both tools run in simulated time, so the same commit gives the
# same pictures). Run it as `./tandem plots`, which builds the two tools and
# installs gnuplot (Debian's gnuplot-nox) first.
#
#   planner-policies.png        static-best, interval and the planner (tandem):
#                               SLO attainment and GPU-hours, Azure code trace x12
#                               and 1,200 agentic sessions, 64 GPUs
#   planner-replicas-azure.png  the planner's and interval's prefill/decode
#                               replicas per interval on the Azure trace (--log),
#                               and each interval's SLO attainment
#   routing-mooncake.png        tandem-replay's policies on the Mooncake trace
#   routing-agentic.png         tandem-replay's policies on 52 agentic sessions, 8 D and 7 D
#
# Environment: TANDEM_BIN_DIR (default build/bin), TANDEM_TRACES (default
# ../shared/traces next to the checkout), TANDEM_PLOTS_OUT (default docs/img).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PLOTS="$ROOT/docs/plots"
BIN=${TANDEM_BIN_DIR:-$ROOT/build/bin}
TRACES=${TANDEM_TRACES:-$ROOT/../shared/traces}
OUT=${TANDEM_PLOTS_OUT:-$ROOT/docs/img}
cd "$ROOT"  # the .gp files load docs/plots/common.gp
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

log() { printf '[plots] %s\n' "$*" >&2; }
command -v gnuplot >/dev/null || { log "gnuplot is missing: run ./tandem plots (it installs gnuplot-nox)"; exit 1; }
for t in tandem-sim tandem-replay; do
  [[ -x $BIN/$t ]] || { log "$BIN/$t is missing: run ./tandem plots (it builds it)"; exit 1; }
done
[[ -f $TRACES/azure_llm_2023_code.csv ]] || { log "no traces in $TRACES (TANDEM_TRACES)"; exit 1; }
mkdir -p "$OUT"

# The footnote of every plot: where the numbers come from.
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
log "commit $COMMIT"
git -C "$ROOT" diff --quiet HEAD -- 2>/dev/null ||
  log "note: the checkout differs from $COMMIT; the plots say $COMMIT, so commit first if the tools' code changed"

# Runs a command, echoing it with the paths shortened as docs/benchmarks.md writes them.
run() {
  local shown="$*"
  shown=${shown//$BIN\//build/bin/}
  shown=${shown//$TRACES\//../shared/traces/}
  shown=${shown//$WORK\//}
  log "$shown"
  "$@"
}

# jget KEY: the value of "KEY" in each line's flat JSON object (string quotes dropped).
jget() {
  awk -v k="\"$1\":" '{ i = index($0, k); if (!i) { print "?"; next }
    v = substr($0, i + length(k)); sub(/[,}].*/, "", v); gsub(/"/, "", v); print v }'
}
# 105828 -> 105,828
commas() { sed -e ':a' -e 's/\B[0-9]\{3\}\>/,&/' -e 'ta'; }
# field POLICY KEY FILE: KEY of the line whose policy is POLICY.
field() { grep "\"policy\":\"$1\"" "$3" | jget "$2"; }

# --- planner: the three policies on two inputs, 64 GPUs -------------------
run "$BIN/tandem-sim" --trace "$TRACES/azure_llm_2023_code.csv" --format azure --gpus 64 --load-scale 12 \
  --policy static-best,interval,tandem --json >"$WORK/azure.json"
run "$BIN/tandem-replay" generate --sessions 1200 --active 600 --out "$WORK/sessions1200.jsonl" >/dev/null
run "$BIN/tandem-sim" --trace "$WORK/sessions1200.jsonl" --gpus 64 --policy static-best,interval,tandem \
  --json >"$WORK/sessions.json"
{
  echo "# input att_static att_interval att_tandem gpuh_static gpuh_interval gpuh_tandem"
  for input in azure sessions; do
    f=$WORK/$input.json
    case $input in
      azure) label="Azure code trace ×12" ;;
      sessions) label="1,200 agentic sessions" ;;
    esac
    # Two lines under the cluster (gnuplot reads \n in quoted data as a line break).
    printf '"%s\\n%s requests\\nstatic-best: %s P:D"' "$label" "$(field tandem requests "$f" | commas)" \
      "$(field static-best size "$f")"
    for key in slo_attainment gpu_hours; do
      for p in static-best interval tandem; do printf ' %s' "$(field "$p" "$key" "$f")"; done
    done
    echo
  done
} >"$WORK/policies.dat"
gnuplot -e "dat='$WORK/policies.dat'; out='$OUT/planner-policies.png'; commit='$COMMIT'" "$PLOTS/planner-policies.gp"

# --- planner: replicas over time on the Azure trace (--log) ----------------
for p in tandem interval; do
  run "$BIN/tandem-sim" --trace "$TRACES/azure_llm_2023_code.csv" --format azure --gpus 64 --load-scale 12 \
    --policy "$p" --log >/dev/null 2>"$WORK/$p.log"
  # "tandem t=240 P=32->49 D=32->15 uncached_tok_s=590058 ..." -> minutes, P and D after the decision, demand (k tokens/s);
  # "tandem check t=250 P=..." (growth between intervals) -> the same with no demand (NaN: no box drawn)
  awk -v p="$p" '$1 == p && ($2 ~ /^t=/ || ($2 == "check" && $3 ~ /^t=/)) {
      c = $2 == "check"; t = substr($(2 + c), 3); split(substr($(3 + c), 3), P, "->"); split(substr($(4 + c), 3), D, "->")
      u = c ? "NaN" : substr($5, 16) / 1000
      printf "%g %d %d %s\n", t / 60, P[2], D[2], u }' "$WORK/$p.log" >"$WORK/$p.replicas"
  # "... attainment by interval (...): 1.00 - 0.74 ..." -> minute at the interval's end, attainment (no arrivals: left out)
  sed -n 's/.*attainment by interval[^:]*: //p' "$WORK/$p.log" |
    tr ' ' '\n' | awk 'NF { if ($1 != "-") printf "%g %s\n", NR * 0.5, $1 }' >"$WORK/$p.attain"
  [[ -s $WORK/$p.replicas && -s $WORK/$p.attain ]] || { log "tandem-sim --log printed nothing to plot for $p"; exit 1; }
done
gnuplot -e "dir='$WORK'; out='$OUT/planner-replicas-azure.png'; commit='$COMMIT'" "$PLOTS/planner-replicas.gp"

# --- routing: tandem-replay's policies -------------------------------------
policies=round_robin,least_load,cache_aware,tandem
run "$BIN/tandem-replay" --trace "$TRACES/mooncake_synthetic_trace.jsonl" --workers 8 --cache-fraction 0.5 \
  --policy "$policies" --json >"$WORK/mooncake.json"
run "$BIN/tandem-replay" generate --sessions 52 --shape 32K --seed 1 --out "$WORK/agentic-32k.jsonl" >/dev/null
run "$BIN/tandem-replay" --trace "$WORK/agentic-32k.jsonl" --workers 8 --cache-blocks 256 \
  --policy "$policies" --json >"$WORK/agentic8.json"
run "$BIN/tandem-replay" --trace "$WORK/agentic-32k.jsonl" --workers 7 --cache-blocks 195 \
  --policy "$policies" --json >"$WORK/agentic7.json"
# One row per policy: hit_ratio hit_bound p99_wait_s direct_share min_session_direct_share
for f in mooncake agentic8 agentic7; do
  paste -d' ' <(jget policy <"$WORK/$f.json") <(jget hit_ratio <"$WORK/$f.json") <(jget hit_bound <"$WORK/$f.json") \
    <(jget p99_wait_s <"$WORK/$f.json") <(jget direct_share <"$WORK/$f.json") \
    <(jget min_session_direct_share <"$WORK/$f.json") | sed 's/null/0/g' >"$WORK/$f.dat"
done
gnuplot -e "dat='$WORK/mooncake.dat'; out='$OUT/routing-mooncake.png'; commit='$COMMIT'" "$PLOTS/routing-mooncake.gp"
gnuplot -e "dir='$WORK'; out='$OUT/routing-agentic.png'; commit='$COMMIT'" "$PLOTS/routing-agentic.gp"

for png in planner-policies planner-replicas-azure routing-mooncake routing-agentic; do
  log "wrote docs/img/$png.png ($(($(stat -c %s "$OUT/$png.png") / 1024)) KB)"
done
