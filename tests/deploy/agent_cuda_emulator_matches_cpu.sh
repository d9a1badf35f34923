#!/usr/bin/env bash
# The CUDA build's tandem-agent with --device cuda-emulator (the portable
# kernels on the CPU executor) answers what the same binary answers with
# --device cpu, greedy, token for token (agent_device_test's check, on the
# CUDA build). The CUDA build links nvcc's host stubs of the kernels beside
# their host-compiled copies; when the two shared a symbol the executor ran
# the stubs, which compute nothing, and this check is what sees that without
# a GPU. Run by ./tandem check cuda.
#
#   agent_cuda_emulator_matches_cpu.sh BIN_DIR   (BIN_DIR/tandem-agent, BIN_DIR/tandem-make-model)
set -uo pipefail
bin=${1:?usage: agent_cuda_emulator_matches_cpu.sh BIN_DIR}
work=$(mktemp -d)
trap 'kill "${AGENT_PIDS[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
"$bin/tandem-make-model" --out "$work/tiny" >/dev/null || { echo "FAIL: tandem-make-model" >&2; exit 1; }

# shellcheck source=e2e/start-agent.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../e2e/start-agent.sh"
start() {  # NAME DEVICE
  start_agent "$bin" "$work" "$1" "$2" --num-blocks 64 && return 0
  echo "FAIL: the --device $2 agent did not become ready; it said:" >&2
  tail -20 "$work/$1.log" >&2
  return 1
}
complete() {  # PORT PROMPT: the greedy answer's text
  curl -sf --max-time 60 "http://127.0.0.1:$1/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"model\":\"tiny\",\"prompt\":\"$2\",\"max_tokens\":16,\"temperature\":0,\"ignore_eos\":true}" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["text"])'
}

start cpu cpu && start emulated cuda-emulator || exit 1
for prompt in "x" "sixteen chars ok" "a prompt that spans more than one KV block of the tiny model"; do
  want=$(complete "$port_cpu" "$prompt") && got=$(complete "$port_emulated" "$prompt") ||
    { echo "FAIL: a completion request failed for \"$prompt\"" >&2; exit 1; }
  if [[ $got != "$want" ]]; then
    echo "FAIL: --device cuda-emulator answered \"$got\" where --device cpu answered \"$want\" (prompt \"$prompt\")" >&2
    exit 1
  fi
done
echo "PASS: the CUDA build's agent answers the same with --device cuda-emulator as with --device cpu"
