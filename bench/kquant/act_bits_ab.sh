#!/usr/bin/env bash
# 16- against 8-bit activations (DUET_GPU_INT8_ACT_BITS, config gpu.int8_act_bits) on a K-quant
# file through the full stack (gpu-only), alternating stacks: prefill and decode tok/s after 64-
# and 512-token prompts, and the read limit (read_bandwidth_bench) right before each run.
# env: TYPE (q4_k_m), N (3 alternations), BIN (build/bin). One JSON line per run into
# bench/kquant/act_bits_ab.jsonl.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${BIN:-build/bin}
model=build-bench/models/llama3.2-1b-${TYPE:-q4_k_m}-llama3.gguf
[ -f "$model" ] || "$bin/duet" mkmodel --shape llama3.2-1b --type "${TYPE:-q4_k_m}" \
  --vocab tests/data/vocab/llama3.gguf --ctx 1024 --out "$model" >&2
stack=actbits$$
trap '"$bin/duet" stack down --stack $stack >/dev/null 2>&1 || true' EXIT
for i in $(seq "${N:-3}"); do
  for bits in 16 8; do
    DUET_GPU_INT8_ACT_BITS=$bits "$bin/duet" stack up --stack $stack --model "$model" \
      --plan gpu-only --timeout 300 >/dev/null
    for p in 64 512; do  # untimed: each shape's first launches
      "$bin/stack_bench" --stack $stack --plan gpu-only --model "$model" --prompt $p --gen 4 \
        --prompt-salt 1 --ignore-eos >/dev/null 2>&1
    done
    for p in 64 512; do
      bw=$("$bin/read_bandwidth_bench" --threads 2 --model "$model")
      run=$("$bin/stack_bench" --stack $stack --plan gpu-only --model "$model" --prompt $p \
        --prompt-salt $((p + 7 + 100 * i)) --gen 32 --ignore-eos 2>/dev/null | tail -n 1)
      echo "{\"type\":\"${TYPE:-q4_k_m}\",\"i\":$i,\"bits\":$bits,\"prompt\":$p,\"bandwidth\":$bw,\"duet\":$run}" |
        tee -a bench/kquant/act_bits_ab.jsonl
    done
    "$bin/duet" stack down --stack $stack >/dev/null
  done
done
