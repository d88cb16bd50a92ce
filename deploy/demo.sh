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
# `stack up` warmed the engines up (built them, ran each token bucket once); gpu_svc still
# measures its two queues for small steps over the first decodes: a short request first, not
# measured.
echo "--- warm-up (16 tokens, not measured):"
$duet generate --stack "$stack" --max-tokens 16 --ignore-eos "$prompt" >/dev/null
echo "--- generate (greedy, 64 tokens) through frontend -> gpu_svc (OpenCL) + npu_svc (NPU emulator):"
greedy=$($duet generate --stack "$stack" --max-tokens 64 --json "$prompt")
echo "$greedy" | python3 -c 'import json, sys; print(json.load(sys.stdin)["text"])'
echo
echo "--- the same prompt, sampled (temperature 0.8, top-p 0.95):"
$duet generate --stack "$stack" --max-tokens 64 --temperature 0.8 --top-p 0.95 --seed 7 "$prompt"
echo
echo "--- stack status:"
$duet stack status --stack "$stack"
echo "--- speed of the greedy run (measured here and modelled on the SoC profile):"
echo "$greedy" | python3 -c '
import json, sys
s = json.load(sys.stdin)["stats"]
print("plan %s: measured %.1f tok/s (%d prompt tokens, TTFT %.1f ms; %d generated, TPOT %.2f ms); modelled on the SoC: TTFT %.1f ms, TPOT %.2f ms" % (
    s["plan"], s["tokens_per_s"], s["prompt_tokens"], s["ttft_ms"], s["generated_tokens"], s["tpot_ms"],
    s["modeled_ttft_ms"], s["modeled_tpot_ms"]))
print("  executed here: %s\n  modelled on the SoC: %s" % (s.get("executed_plan", "?"), s.get("modeled_plan", "?")))
'
