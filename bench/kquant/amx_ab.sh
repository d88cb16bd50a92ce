#!/usr/bin/env bash
# AMX GEMMs off / on (DUET_GPU_INT8_AMX, config gpu.int8_amx) through the full stack (gpu-only):
# both stacks up at once, requests alternating arm by arm, so that a minute of this shared host's
# memory bandwidth moves both arms. Prints "TYPE ARM pPROMPT rROUND prefill_tok_s decode_tok_s"
# for 54- and 296-token prompts (8 generated tokens). The RESULTS.md 2026-12-08 tables came from
# this loop. env: TYPES (q4_k_m q4_0), ROUNDS (3), BIN (build/bin).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${BIN:-build/bin}
trap '"$bin/duet" stack down --stack amxoff$$ >/dev/null 2>&1 || true
      "$bin/duet" stack down --stack amxon$$ >/dev/null 2>&1 || true' EXIT
for type in ${TYPES:-q4_k_m q4_0}; do
  model=build-bench/models/llama3.2-1b-$type-llama3.gguf
  [ -f "$model" ] || "$bin/duet" mkmodel --shape llama3.2-1b --type "$type" \
    --vocab tests/data/vocab/llama3.gguf --ctx 1024 --out "$model" >&2
  for arm in off on; do
    DUET_GPU_INT8_AMX=$([ $arm = on ] && echo 1 || echo 0) "$bin/duet" stack up \
      --stack amx$arm$$ --model "$model" --plan gpu-only --timeout 300 >/dev/null
    # Untimed: the first request builds the engine.
    "$bin/stack_bench" --stack amx$arm$$ --plan gpu-only --model "$model" --prompt 64 --gen 2 \
      --prompt-salt 1 --ignore-eos >/dev/null 2>&1 || true
  done
  for round in $(seq "${ROUNDS:-3}"); do
    for prompt in 54 296; do
      for arm in off on; do
        r=$("$bin/stack_bench" --stack amx$arm$$ --plan gpu-only --model "$model" \
              --prompt $prompt --gen 8 --prompt-salt $((round * 1000 + prompt)) --ignore-eos \
              2>/dev/null | tail -n 1)
        echo "$type $arm p$prompt r$round $(echo "$r" | python3 -c 'import json, sys
d = json.loads(sys.stdin.read()); print(round(d["prefill_tok_s"], 1), round(d["decode_tok_s"], 1))')"
      done
    done
  done
  for arm in off on; do "$bin/duet" stack down --stack amx$arm$$ >/dev/null; done
done
