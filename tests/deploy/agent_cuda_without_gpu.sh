#!/usr/bin/env bash
# The CUDA build's tandem-agent with --device cuda on a machine without a
# GPU: it loads the CUDA runtime, asks it for a device, and stops start-up
# with exit status 1 and a line that says there is no CUDA device (what the
# runtime said), instead of serving or crashing. Run by ./tandem check cuda.
#
#   agent_cuda_without_gpu.sh BIN_DIR   (BIN_DIR/tandem-agent, BIN_DIR/tandem-make-model)
set -uo pipefail
bin=${1:?usage: agent_cuda_without_gpu.sh BIN_DIR}
model=$(mktemp -d)
trap 'rm -rf "$model"' EXIT
"$bin/tandem-make-model" --out "$model" >/dev/null || { echo "FAIL: tandem-make-model" >&2; exit 1; }
out=$(timeout -k 10 120 "$bin/tandem-agent" --listen 127.0.0.1:0 --device cuda --model-dir "$model" 2>&1)
rc=$?
if [[ $rc -ne 1 ]]; then
  echo "FAIL: tandem-agent --device cuda exited $rc (want 1); it said:" >&2
  printf '%s\n' "$out" | tail -20 >&2
  exit 1
fi
if ! grep -q -- "--device cuda: no CUDA device" <<<"$out"; then
  echo "FAIL: tandem-agent --device cuda did not say there is no CUDA device; it said:" >&2
  printf '%s\n' "$out" | tail -20 >&2
  exit 1
fi
echo "PASS: tandem-agent --device cuda without a GPU exited 1 saying: $(grep -o -- '--device cuda: no CUDA device[^"]*' <<<"$out" | head -1)"
