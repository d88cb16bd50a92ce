#!/usr/bin/env bash
# The first request on a fresh stack, with and without `stack up`'s warm-up (frontend_warmup.cpp):
# per round, for each mode in turn, `stack up` (its wall time), then the first request's and
# the second request's TTFT and TPOT (stack_bench, a prompt salt of their own so the prefix cache
# serves neither), then `stack down`. One JSON line per stack into bench/stack/first_request.jsonl.
# env: MODEL (llama3.2-1b Q4_0 from mkmodel), PLAN (gpu-only), ROUNDS (3), PROMPT (64), GEN (8),
#      BIN (build/bin).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${BIN:-build/bin}
model=${MODEL:-build-bench/models/llama3.2-1b-q4_0-llama3.gguf}
plan=${PLAN:-gpu-only}
out=bench/stack/first_request.jsonl
mkdir -p "$(dirname "$model")"
[ -f "$model" ] || "$bin/duet" mkmodel --shape llama3.2-1b --type q4_0 \
  --vocab tests/data/vocab/llama3.gguf --ctx 1024 --out "$model" >&2
stack=firstreq$$
trap '"$bin/duet" stack down --stack $stack >/dev/null 2>&1 || true' EXIT
ms_now() { date +%s%3N; }
for round in $(seq "${ROUNDS:-3}"); do
  for mode in warmup no-warmup; do
    flag=$([ $mode = no-warmup ] && echo --no-warmup || true)
    t0=$(ms_now)
    "$bin/duet" stack up --stack $stack --model "$model" --plan "$plan" --timeout 300 $flag >&2
    up_ms=$(($(ms_now) - t0))
    req() {
      "$bin/stack_bench" --stack $stack --plan "$plan" --model "$model" --prompt "${PROMPT:-64}" \
        --gen "${GEN:-8}" --prompt-salt "$1" --ignore-eos 2>/dev/null | tail -n 1
    }
    first=$(req $((round * 10 + 1)))
    second=$(req $((round * 10 + 2)))
    "$bin/duet" stack down --stack $stack >/dev/null
    echo "{\"round\":$round,\"mode\":\"$mode\",\"plan\":\"$plan\",\"model\":\"$model\",\"up_ms\":$up_ms,\"loadavg\":\"$(cut -d' ' -f1 /proc/loadavg)\",\"first\":$first,\"second\":$second}" |
      tee -a "$out"
  done
done
