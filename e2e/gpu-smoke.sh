#!/usr/bin/env bash
# GPU smoke test: builds the CUDA kernels and their device check with
# `./tandem check cuda` (build-cuda/), then runs build-cuda/bin/tandem-gpu-kernel-check,
# which runs every portable kernel on the GPU and on the CPU executor and
# compares them (bitwise; attention within 1e-5 relative), prints each
# kernel's throughput, and then (--model) runs the tiny model and a small
# model of each family through the CUDA backend (KernelBackend on a CUDA
# device with cuBLASLt) against the CPU backend's logits, and with two GPUs
# a tensor-parallel group of two processes (NCCL, wired through a rendezvous
# socket). Then a short P/D serving run: a prefill and a decode agent with
# --device cuda (the KV pool in GPU memory, staged through host memory for
# UCX) against one --device cuda agent alone: the same greedy answers, and
# the decode agent's throughput (cuda_pd_smoke below).
#
# For whoever first has a machine with an NVIDIA GPU (built for compute
# capability 9.0: H100/H200) and the CUDA toolkit at /usr/local/cuda (or
# CUDACXX=/path/to/nvcc). This project's machines have no GPU, so this script
# has NEVER RUN end to end: expect to debug it. Exit status: the check's
# (0 all PASS, 1 a FAIL or CUDA error, 2 no CUDA device), or the build's.
# docs/cuda-build.md says what has and has not been run.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CHECK="$ROOT/build-cuda/bin/tandem-gpu-kernel-check"

# P/D serving on the GPU: prefill and decode agents (both on GPU 0, tiny
# model, KV over UCX on loopback) answer what one agent answers, with every
# KV block's checksum verified; prints requests/s and tokens/s through D.
cuda_pd_smoke() {
  local bin=${TANDEM_SMOKE_BIN:-$ROOT/build-cuda/bin} device=${TANDEM_SMOKE_DEVICE:-cuda} work pids=() rc=0
  work=$(mktemp -d)
  "$bin/tandem-make-model" --out "$work/tiny" >/dev/null  # served as model "tiny"
  start() {  # NAME ARGS...: starts an agent, waits for /readyz, sets $port_NAME and $kv_NAME
    local name=$1; shift
    "$bin/tandem-agent" --listen 127.0.0.1:0 --port-file "$work/$name.port" --model-dir "$work/tiny" \
      --device "$device" --num-blocks 256 "$@" >"$work/$name.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 600); do
      if [[ -s $work/$name.port ]]; then
        { read -r p; read -r k; } <"$work/$name.port"
        if curl -sf "http://127.0.0.1:$p/readyz" >/dev/null; then printf -v "port_$name" %s "$p"; printf -v "kv_$name" %s "${k:-0}"; return 0; fi
      fi
      kill -0 "${pids[-1]}" 2>/dev/null || { echo "gpu-smoke: $name agent exited:"; tail -20 "$work/$name.log"; return 1; }
      sleep 0.2
    done
    echo "gpu-smoke: $name agent not ready in 120 s"; tail -20 "$work/$name.log"; return 1
  }
  complete() {  # PORT PROMPT: the completion's text
    curl -sf "http://127.0.0.1:$1/v1/completions" -H 'Content-Type: application/json' \
      -d "$(python3 -c 'import json,sys; print(json.dumps({"model":"tiny","prompt":sys.argv[1],"max_tokens":32,"temperature":0,"ignore_eos":True}))' "$2")" |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])'
  }
  if start mono && start prefill --role prefill --kv-listen 127.0.0.1:0 &&
     start decode --role decode --kv-listen 127.0.0.1:0 --checksum-rate 1 --prefill-peer "127.0.0.1:$kv_prefill"; then
    local prompt want got n=0 t0 t1
    for prompt in "x" "sixteen chars ok" "$(printf 'a prompt of several blocks %.0s' $(seq 20))"; do
      want=$(complete "$port_mono" "$prompt") && got=$(complete "$port_decode" "$prompt") || { rc=1; break; }
      if [[ "$want" != "$got" ]]; then echo "gpu-smoke: P/D FAIL: answers differ for a ${#prompt}-char prompt"; rc=1; fi
    done
    t0=$(date +%s.%N)
    for _ in $(seq 50); do complete "$port_decode" "throughput $RANDOM" >/dev/null || rc=1; n=$((n + 1)); done
    t1=$(date +%s.%N)
    python3 -c 'import sys; n,t=int(sys.argv[1]),float(sys.argv[3])-float(sys.argv[2]); print(f"gpu-smoke: P/D with --device {sys.argv[4]}, tiny model, one client: {n/t:.1f} requests/s, {32*n/t:.0f} output tokens/s ({n} requests of 32 tokens in {t:.1f} s)")' "$n" "$t0" "$t1" "$device"
    curl -sf "http://127.0.0.1:$port_decode/metrics" | grep -E '^tandem_kv_transfer_failures_total|^tandem_kv_checksum_verified_total' || true
    [[ $rc -ne 0 ]] || echo "gpu-smoke: P/D PASS: prefill and decode (--device $device) answer what one agent answers"
  else
    rc=1
  fi
  kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null
  [[ $rc -eq 0 ]] || for f in "$work"/*.log; do echo "--- $f"; tail -20 "$f"; done
  rm -rf "$work"
  return "$rc"
}

# --pd-only: only the P/D serving run, e.g. rehearsed on a CPU with
# TANDEM_SMOKE_DEVICE=cuda-emulator TANDEM_SMOKE_BIN=build/bin.
if [[ ${1:-} == --pd-only ]]; then
  cuda_pd_smoke
  exit $?
fi


echo "gpu-smoke: building: $ROOT/tandem check cuda"
"$ROOT/tandem" check cuda

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
else
  echo "gpu-smoke: fewer than 2 GPUs: the NCCL tensor-parallel check is skipped"
fi
if [[ $status -ne 2 ]]; then  # 2: no CUDA device, nothing to serve on
  echo "gpu-smoke: P/D serving run with --device cuda"
  pd_status=0
  cuda_pd_smoke || pd_status=$?
  echo "gpu-smoke: P/D serving run exited $pd_status"
  [[ $status -ne 0 ]] || status=$pd_status
fi
exit "$status"
