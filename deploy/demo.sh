#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install what is missing, build, start the stack on
# the default model (models/fortune-q8_0.gguf), generate text through it, print the speed, stop.
#   deploy/demo.sh ["prompt"] [--plan auto|tensor|gpu-only|npu-only|layer|reference]
set -euo pipefail
cd "$(dirname "$0")/.."
prompt=${1:-"Once upon a time"}
shift || true
deploy/install-deps.sh
deploy/build.sh
duet=build/bin/duet
stack="demo-$$"
$duet stack up --stack "$stack" "$@"
trap '$duet stack down --stack "$stack" >/dev/null' EXIT
echo "--- generate (greedy, 64 tokens) through frontend -> gpu_svc (OpenCL) + npu_svc (NPU emulator):"
$duet generate --stack "$stack" --max-tokens 64 "$prompt"
echo
echo "--- the same prompt, sampled (temperature 0.8, top-p 0.95):"
$duet generate --stack "$stack" --max-tokens 64 --temperature 0.8 --top-p 0.95 --seed 7 "$prompt"
echo
echo "--- stack status:"
$duet stack status --stack "$stack"
echo "--- speed (measured here and modelled on the SoC profile):"
$duet status --stack "$stack" --json | python3 -c '
import json, sys
s = json.load(sys.stdin)["frontend"]
m = s["metrics"]
print("plan %s: measured %.1f tok/s (TTFT %.1f ms, TPOT %.2f ms); modelled on the SoC: TTFT %.1f ms, TPOT %.2f ms" % (
    s["engine"].get("plan"), m["measured"]["tokens_per_s"], m["measured"]["ttft_ms"], m["measured"]["tpot_ms"],
    m["modeled"]["ttft_ms"], m["modeled"]["tpot_ms"]))
' || true
