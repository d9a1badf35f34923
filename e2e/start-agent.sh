# shellcheck shell=bash
# Sourced by e2e/gpu-smoke.sh and tests/deploy/agent_cuda_emulator_matches_cpu.sh:
# starting a tandem-agent on loopback and waiting until it is ready.
#
# stop_agents
#   Sends SIGTERM to every agent in AGENT_PIDS, waits up to 30 s for them
#   (an agent drains, and ends its tensor-parallel ranks), kills those still
#   running, and empties AGENT_PIDS.
#
# start_agent BIN WORK NAME DEVICE ARGS...
#   Starts BIN/tandem-agent with --device DEVICE serving the model in WORK/tiny
#   (made by tandem-make-model), logging to WORK/NAME.log, and waits up to
#   120 s for its /readyz. Appends its pid to AGENT_PIDS and sets port_NAME
#   (its HTTP port) and kv_NAME (its KV port, 0 without one). Returns 1,
#   saying why on stderr, when it exits or is not ready in time.
AGENT_PIDS=()
start_agent() {
  local bin=$1 work=$2 name=$3 device=$4 p k
  shift 4
  "$bin/tandem-agent" --listen 127.0.0.1:0 --port-file "$work/$name.port" --model-dir "$work/tiny" \
    --device "$device" "$@" >"$work/$name.log" 2>&1 &
  AGENT_PIDS+=($!)
  for _ in $(seq 600); do
    if [[ -s $work/$name.port ]] && { read -r p; read -r k; } <"$work/$name.port" &&
       curl -sf --max-time 5 "http://127.0.0.1:$p/readyz" >/dev/null; then
      printf -v "port_$name" %s "$p"
      printf -v "kv_$name" %s "${k:-0}"
      return 0
    fi
    kill -0 "${AGENT_PIDS[-1]}" 2>/dev/null || { echo "the $name agent (--device $device) exited during start-up" >&2; return 1; }
    sleep 0.2
  done
  echo "the $name agent (--device $device) was not ready in 120 s" >&2
  return 1
}

stop_agents() {
  local pid
  for pid in "${AGENT_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for _ in $(seq 150); do
    local alive=0
    for pid in "${AGENT_PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [[ $alive -eq 1 ]] || break
    sleep 0.2
  done
  for pid in "${AGENT_PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  AGENT_PIDS=()
}
