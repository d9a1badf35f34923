#!/usr/bin/env bash
# GPU smoke test: builds the CUDA kernels and their device check with
# `./tandem check cuda` (build-cuda/), then runs build-cuda/bin/tandem-gpu-kernel-check,
# which runs every portable kernel on the GPU and on the CPU executor and
# compares them (bitwise; attention within 1e-5 relative), prints each
# kernel's throughput, and then (--model) runs the tiny model and a small
# model of each family through the CUDA backend (KernelBackend on a CUDA
# device with cuBLASLt) against the CPU backend's logits, and with two GPUs
# a tensor-parallel group of two processes (NCCL, wired through a rendezvous
# socket) and an agent with --tensor-parallel 2 against one agent alone
# (cuda_tp_smoke). Then a short P/D serving run: a prefill and a decode agent with
# --device cuda (the KV pool in GPU memory, staged through host memory for
# UCX) against one --device cuda agent alone: the same greedy answers, and
# the decode agent's throughput (cuda_pd_smoke below), with --dtype float32
# and then with --dtype bfloat16 --kv-dtype bfloat16 (TANDEM_SMOKE_DTYPE and
# TANDEM_SMOKE_KV_DTYPE pick the ones --pd-only runs). Prefill and decode run
# with --kv-device-transport auto (TANDEM_SMOKE_KV_TRANSPORT): where the
# agents' UCX reads GPU memory and the node has GPUDirect RDMA
# (nvidia-peermem) that is the direct path (UCX registers the pool, no
# staging), and then one more float32 run is staged, so both paths run;
# where auto stayed staged but the machine has a UCX with CUDA support
# (find_cuda_ucx; TANDEM_SMOKE_UCX_LIBS names one), one more float32 run is
# forced direct through that UCX. Each run prints the path its agents took
# and, where auto stayed staged, why.
#
# For a machine with an NVIDIA GPU (built for compute capability 9.0:
# H100/H200) and either the CUDA toolkit at /usr/local/cuda (or
# CUDACXX=/path/to/nvcc) with this project's build dependencies, or a
# bundle made elsewhere by e2e/gpu-bundle.sh (--bundle DIR: nothing is
# built). Exit status: the check's (0 all PASS, 1 a FAIL or CUDA error, 2 no
# CUDA device), or the build's. It has run on an H200, from a bundle;
# docs/cuda-build.md says what has and has not been run.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CHECK="$ROOT/build-cuda/bin/tandem-gpu-kernel-check"

# P/D serving on the GPU: prefill and decode agents (both on GPU 0, tiny
# model, KV over UCX on loopback) answer what one agent answers, with KV
# moved from P to D (checksums verified, no transfer failure, no failover to
# computing on D); prints requests/s and output tokens/s through D. Called in
# an `||` context (set -e does not apply inside); every request has a time
# limit, and the agents are stopped on every path (AGENT_PIDS, trap below).
# shellcheck source=e2e/start-agent.sh
source "$ROOT/e2e/start-agent.sh"
trap 'kill "${AGENT_PIDS[@]}" 2>/dev/null || true' EXIT
# PORT NAME: the sum of the series of NAME on an agent's /metrics (0 when absent).
metric() {
  curl -sf --max-time 10 "http://127.0.0.1:$1/metrics" |
    awk -v m="$2" '$1 == m || index($1, m "{") == 1 { s += $2 } END { print s + 0 }'
}
# WORK RC: stops the run's agents, shows the tail of their logs when RC is
# not 0, removes WORK, and returns RC.
end_run() {
  stop_agents
  if [[ $2 -ne 0 ]]; then
    local f
    for f in "$1"/*.log; do echo "--- $f"; tail -20 "$f"; done
  fi
  rm -rf "$1"
  return "$2"
}
# A folder holding a UCX with CUDA support (libucp.so.0, and a CUDA
# transport module in ucx/): TANDEM_SMOKE_UCX_LIBS, NVIDIA's HPC-X or DOCA
# UCX, or a RAPIDS libucx wheel. Prints it; fails when there is none.
find_cuda_ucx() {
  local d
  if [[ -n ${TANDEM_SMOKE_UCX_LIBS:-} ]]; then  # named: that one or none
    d=$TANDEM_SMOKE_UCX_LIBS
    if [[ -f $d/libucp.so.0 ]] && compgen -G "$d/ucx/libuct_cuda*.so*" >/dev/null; then
      echo "$d"
      return 0
    fi
    echo "gpu-smoke: TANDEM_SMOKE_UCX_LIBS=$d has no libucp.so.0 with a ucx/libuct_cuda* module" >&2
    return 1
  fi
  for d in /opt/hpcx/ucx/lib /opt/ucx/lib /usr/local/ucx/lib /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib \
           /usr/local/lib/python3*/dist-packages/libucx/lib /usr/local/lib/python3*/site-packages/libucx/lib \
           /usr/lib/python3*/site-packages/libucx/lib /opt/*/.venv/lib/python3*/site-packages/libucx/lib; do
    if [[ -f $d/libucp.so.0 ]] && compgen -G "$d/ucx/libuct_cuda*.so*" >/dev/null; then
      echo "$d"
      return 0
    fi
  done
  return 1
}
cuda_pd_smoke() {
  local bin=${TANDEM_SMOKE_BIN:-$ROOT/build-cuda/bin} device=${TANDEM_SMOKE_DEVICE:-cuda} work rc=0
  local dtype=${TANDEM_SMOKE_DTYPE:-float32}  # every agent's --dtype, the --device cpu reference's too
  local kv_dtype=${TANDEM_SMOKE_KV_DTYPE:-float32}  # and --kv-dtype
  local kv_transport=${TANDEM_SMOKE_KV_TRANSPORT:-auto}  # P's and D's --kv-device-transport
  work=$(mktemp -d)
  "$bin/tandem-make-model" --out "$work/tiny" >/dev/null || { rm -rf "$work"; return 1; }  # served as model "tiny"
  start() {  # NAME DEVICE ARGS...: start_agent (e2e/start-agent.sh) with this run's binaries and model
    start_agent "$bin" "$work" "$@" --num-blocks 256 --log-level info --dtype "$dtype" --kv-dtype "$kv_dtype" ||
      { echo "gpu-smoke: the $1 agent did not start"; return 1; }
  }
  # The client: compares D's answers with one agent's, then times 50
  # requests through D (only answered ones count). It also says how many
  # answers are the CPU backend's: the same tokens are expected but not
  # required (the GPU's logits are within 1e-4 of the CPU's, not bitwise, and
  # a near-tie can pick another token; tandem-gpu-kernel-check --model
  # compares the logits themselves).
  client() {
    PYTHONPATH="$ROOT/e2e" python3 - "$port_mono" "$port_decode" "$device --dtype $dtype --kv-dtype $kv_dtype" "$port_cpu" <<'PY'
import sys
from smoke_client import PROMPTS, complete, same_answers, throughput
mono, decode, device, cpu = sys.argv[1:5]
ok = True
for prompt in PROMPTS:
    if complete(mono, prompt)[0] != complete(decode, prompt)[0]:
        print(f"gpu-smoke: P/D FAIL: answers differ for a {len(prompt)}-char prompt")
        ok = False
print(f"gpu-smoke: P/D: {same_answers(mono, cpu)} of {len(PROMPTS)} answers of --device {device} are --device cpu's, "
      "token for token")
# Seeded sampling (the engine samples on the device): reported, not
# required: the GPU's logits are the CPU's only to within 1e-4.
seeded = {"temperature": 0.8, "top_p": 0.9, "top_k": 40, "seed": 7}
print(f"gpu-smoke: P/D: seeded sampling (temperature 0.8, top-p 0.9, top-k 40): {same_answers(mono, decode, seeded)} "
      f"of {len(PROMPTS)} answers through D are one agent's, {same_answers(mono, cpu, seeded)} of {len(PROMPTS)} "
      "are --device cpu's")
ok = throughput(decode, 50, f"gpu-smoke: P/D with --device {device}, tiny model, one client", "gpu-smoke: P/D FAIL") and ok
sys.exit(0 if ok else 1)
PY
  }
  if start cpu cpu && start mono "$device" &&
     start prefill "$device" --role prefill --kv-listen 127.0.0.1:0 --kv-device-transport "$kv_transport" &&
     start decode "$device" --role decode --kv-listen 127.0.0.1:0 --checksum-rate 1 --prefill-peer "127.0.0.1:$kv_prefill" \
       --kv-device-transport "$kv_transport"; then
    PD_KV_MEMORY=$(grep -o 'kv_memory="[^"]*"' "$work/prefill.log" | head -1)  # the path taken (read by the caller)
    PD_WHY_STAGED=$(grep -o 'the KV pool is staged through host memory.*' "$work/prefill.log" | head -1 || true)
    client || rc=1
    local verified failures failovers
    verified=$(metric "$port_decode" tandem_kv_checksum_verified_total)
    failures=$(metric "$port_decode" tandem_kv_transfer_failures_total)
    failovers=$(metric "$port_decode" tandem_kv_prefill_failovers_total)
    echo "gpu-smoke: P/D on D: $verified layer blocks checksummed, $failures transfer failures, $failovers failovers"
    local role port bytes seconds
    for role in mono decode; do  # decode steps as CUDA graphs (docs/cuda.md); all 0 with TANDEM_CUDA_GRAPHS=off
      port=port_$role
      echo "gpu-smoke: P/D $role: CUDA graph steps: $(curl -sf --max-time 10 "http://127.0.0.1:${!port}/metrics" |
        sed -n 's/^tandem_cuda_graph_steps_total{.*outcome="\([a-z]*\)".*} \(.*\)$/\1 \2/p' | paste -sd, -)"
    done
    for role in prefill decode; do  # where its pool is, and what staging it cost
      port=port_$role
      bytes=$(metric "${!port}" tandem_kv_staged_bytes_total)
      seconds=$(metric "${!port}" tandem_kv_staging_seconds_total)
      echo "gpu-smoke: P/D $role: $(grep -o 'kv_memory="[^"]*"' "$work/$role.log" | head -1), $bytes bytes staged in $seconds s"
    done
    if [[ $verified == 0 || $failures != 0 || $failovers != 0 ]]; then
      echo "gpu-smoke: P/D FAIL: the KV did not move from prefill to decode cleanly"
      rc=1
    fi
    [[ $rc -ne 0 ]] ||
      echo "gpu-smoke: P/D PASS: prefill and decode (--device $device --dtype $dtype --kv-dtype $kv_dtype" \
        "--kv-device-transport $kv_transport: $PD_KV_MEMORY) answer what one agent answers"
  else
    rc=1
  fi
  end_run "$work" "$rc"
}

# An agent with --tensor-parallel 2 (two processes, one per GPU, NCCL's
# all-reduce) against one agent alone on GPU 0: how many greedy answers
# agree (expected, not required: NCCL sums in its own order, so the logits
# agree to rounding only), every request answered, and requests/s and
# tokens/s of each; then a prefill group of two feeding a decode group of
# two (the same GPUs): answers, and a FAIL unless D verified checksums with
# no transfer failure. Needs two GPUs; rehearsed on a CPU with
# TANDEM_SMOKE_DEVICE=cuda-emulator TANDEM_SMOKE_BIN=build/bin --tp-only.
cuda_tp_smoke() {
  local bin=${TANDEM_SMOKE_BIN:-$ROOT/build-cuda/bin} device=${TANDEM_SMOKE_DEVICE:-cuda} work rc=0
  work=$(mktemp -d)
  "$bin/tandem-make-model" --out "$work/tiny" >/dev/null || { rm -rf "$work"; return 1; }
  if start_agent "$bin" "$work" one "$device" --num-blocks 256 --log-level info &&
     start_agent "$bin" "$work" tp2 "$device" --tensor-parallel 2 --num-blocks 256 --log-level info; then
    grep 'msg="tensor-parallel group ready"' "$work/tp2.log" | head -1 | sed 's/^.*msg=/gpu-smoke: TP: /'
    PYTHONPATH="$ROOT/e2e" python3 - "$port_one" "$port_tp2" "$device" <<'PY' || rc=1
import sys
from smoke_client import PROMPTS, same_answers, throughput
one, tp2, device = sys.argv[1:4]
print(f"gpu-smoke: TP: {same_answers(one, tp2)} of {len(PROMPTS)} greedy answers of --tensor-parallel 2 are one "
      "agent's, token for token")
ok = True
for name, port in (("one agent", one), ("--tensor-parallel 2", tp2)):
    ok = throughput(port, 30, f"gpu-smoke: TP: {name} (--device {device}, tiny model, one client)",
                    f"gpu-smoke: TP FAIL: {name}") and ok
sys.exit(0 if ok else 1)
PY
    # Prefill and decode groups of two on the same two GPUs: the KV of both
    # ranks moves through rank 0's staging copy.
    if start_agent "$bin" "$work" tp_prefill "$device" --tensor-parallel 2 --num-blocks 256 --role prefill \
         --kv-listen 127.0.0.1:0 &&
       start_agent "$bin" "$work" tp_decode "$device" --tensor-parallel 2 --num-blocks 256 --role decode \
         --kv-listen 127.0.0.1:0 --checksum-rate 1 --prefill-peer "127.0.0.1:$kv_tp_prefill"; then
      PYTHONPATH="$ROOT/e2e" python3 - "$port_one" "$port_tp_decode" <<'PY' || rc=1
import sys
from smoke_client import PROMPTS, same_answers
print(f"gpu-smoke: TP P/D: {same_answers(sys.argv[1], sys.argv[2])} of {len(PROMPTS)} greedy answers through a decode "
      "group of 2 fed by a prefill group of 2 are one agent's")
PY
      local verified failures
      verified=$(metric "$port_tp_decode" tandem_kv_checksum_verified_total)
      failures=$(metric "$port_tp_decode" tandem_kv_transfer_failures_total)
      echo "gpu-smoke: TP P/D: $verified layer blocks checksummed on D, $failures transfer failures"
      [[ $verified != 0 && $failures == 0 ]] || { echo "gpu-smoke: TP P/D FAIL: the KV did not move cleanly"; rc=1; }
    else
      echo "gpu-smoke: TP P/D FAIL: a prefill or decode group did not start"
      rc=1
    fi
    [[ $rc -ne 0 ]] || echo "gpu-smoke: TP PASS: --tensor-parallel 2 (--device $device) served every request, alone and as P/D"
  else
    echo "gpu-smoke: TP FAIL: an agent did not start"
    rc=1
  fi
  end_run "$work" "$rc"
}

if [[ ${1:-} == --tp-only ]]; then
  tp_status=0
  cuda_tp_smoke || tp_status=$?
  exit "$tp_status"
fi

# --pd-only: only the P/D serving run, e.g. rehearsed on a CPU with
# TANDEM_SMOKE_DEVICE=cuda-emulator TANDEM_SMOKE_BIN=build/bin.
if [[ ${1:-} == --pd-only ]]; then
  pd_status=0
  cuda_pd_smoke || pd_status=$?
  exit "$pd_status"
fi

# --bundle DIR: run the binaries e2e/gpu-bundle.sh packed into DIR (built on
# another machine) instead of building here: for a GPU machine without this
# project's build dependencies.
if [[ ${1:-} == --bundle ]]; then
  [[ -n ${2:-} && -x $2/bin/tandem-gpu-kernel-check ]] ||
    { echo "gpu-smoke: --bundle DIR: DIR/bin/tandem-gpu-kernel-check not found (make DIR with e2e/gpu-bundle.sh)" >&2; exit 1; }
  bundle=$(cd "$2" && pwd)
  CHECK=$bundle/bin/tandem-gpu-kernel-check
  export TANDEM_SMOKE_BIN=${TANDEM_SMOKE_BIN:-$bundle/bin}
  command -v curl >/dev/null || PATH=$bundle/tools:$PATH  # the bundle's stand-in
  echo "gpu-smoke: running the binaries bundled in $bundle"
else
  echo "gpu-smoke: building: $ROOT/tandem check cuda"
  "$ROOT/tandem" check cuda
fi
for tool in curl python3; do
  command -v "$tool" >/dev/null || { echo "gpu-smoke: the P/D serving run needs $tool on PATH" >&2; exit 1; }
done

if command -v nvidia-smi >/dev/null; then
  echo "gpu-smoke: nvidia-smi -L:"
  nvidia-smi -L || true  # informational; the check itself reports a missing device
fi

echo "gpu-smoke: running: $CHECK --model"
status=0
"$CHECK" --model || status=$?
echo "gpu-smoke: $CHECK exited $status"

# Tensor parallelism across processes (NCCL) when there are two GPUs: two
# ranks of the tiny model, wired through a rendezvous socket.
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [[ ${gpus:-0} -ge 2 ]]; then
  sock=$(mktemp -u /tmp/tandem-tp-XXXXXX.sock)
  echo "gpu-smoke: running: $CHECK --tp 0 2 $sock and --tp 1 2 $sock"
  # NCCL has no timeout of its own: a rank that fails can leave the other waiting.
  timeout 600 "$CHECK" --tp 1 2 "$sock" &
  rank1=$!
  tp_status=0
  timeout 600 "$CHECK" --tp 0 2 "$sock" || tp_status=$?
  wait "$rank1" || tp_status=$?
  echo "gpu-smoke: tensor parallel ranks exited $tp_status"
  [[ $status -ne 0 ]] || status=$tp_status
  echo "gpu-smoke: serving run with --tensor-parallel 2 --device cuda"
  tp_status=0
  cuda_tp_smoke || tp_status=$?
  echo "gpu-smoke: tensor-parallel serving run exited $tp_status"
  [[ $status -ne 0 ]] || status=$tp_status
else
  echo "gpu-smoke: fewer than 2 GPUs: the NCCL tensor-parallel check is skipped"
fi
if [[ $status -ne 2 ]]; then  # 2: no CUDA device, nothing to serve on
  for dtype in float32 bfloat16; do  # bfloat16: bf16 projections and a bf16 KV cache (docs/cuda.md)
    echo "gpu-smoke: P/D serving run with --device cuda --dtype $dtype --kv-dtype $dtype"
    pd_status=0
    TANDEM_SMOKE_DTYPE=$dtype TANDEM_SMOKE_KV_DTYPE=$dtype cuda_pd_smoke || pd_status=$?
    echo "gpu-smoke: P/D serving run (--dtype $dtype --kv-dtype $dtype) exited $pd_status"
    [[ $status -ne 0 ]] || status=$pd_status
    if [[ $dtype == float32 ]]; then
      float32_path=${PD_KV_MEMORY:-}
      float32_why=${PD_WHY_STAGED:-}
    fi
  done
  if [[ ${float32_path:-} == *"registered with UCX directly"* ]]; then  # auto went direct: the staged path too
    echo "gpu-smoke: P/D serving run with --device cuda --kv-device-transport staged"
    pd_status=0
    TANDEM_SMOKE_KV_TRANSPORT=staged cuda_pd_smoke || pd_status=$?
    echo "gpu-smoke: P/D serving run (staged) exited $pd_status"
    [[ $status -ne 0 ]] || status=$pd_status
  elif [[ -n ${float32_why:-} ]] && echo "gpu-smoke: auto stayed staged: $float32_why" && ucx_dir=$(find_cuda_ucx); then
    echo "gpu-smoke: P/D serving run with --device cuda --kv-device-transport direct through the UCX in $ucx_dir"
    pd_status=0
    TANDEM_UCX_LIBS=$ucx_dir LD_LIBRARY_PATH=$ucx_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} UCX_MODULE_DIR=$ucx_dir/ucx \
      TANDEM_SMOKE_KV_TRANSPORT=direct cuda_pd_smoke || pd_status=$?
    echo "gpu-smoke: P/D serving run (direct, $ucx_dir) exited $pd_status"
    [[ $status -ne 0 ]] || status=$pd_status
  else
    echo "gpu-smoke: auto stayed staged (${float32_path:-no P/D run}) and no UCX with CUDA support was found" \
      "(TANDEM_SMOKE_UCX_LIBS names one): the direct path did not run"
  fi
fi
exit "$status"
