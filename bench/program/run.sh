#!/usr/bin/env bash
# Issue 24 item 2 (symbolic shapes): programs registered, registration time, PoCL kernel binaries
# compiled, NPU graphs and arena bytes, per-bucket programs (before) against symbolic ones
# (after), on tiny-fortune and the llama3.2-1b shape, plus one greedy generation per run whose
# ids must be equal across the modes. Each (model, mode) runs in its own process with a fresh
# PoCL cache (POCL_CACHE_DIR), so pocl_binaries_compiled counts what that mode's steps compiled.
# Writes bench/program/results.jsonl; bench/program/summarize.py prints RESULTS.md's table.
# env: DUET_BIN_DIR (default build/bin), PLANS (default "gpu-only,npu-only,layer,tensor"),
#      MODELS ("tiny 1b"), PROMPT (40), DECODE (16)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${DUET_BIN_DIR:-build/bin}
out=bench/program/results.jsonl
plans=${PLANS:-gpu-only,npu-only,layer,tensor}
models=${MODELS:-"tiny 1b"}
model_1b=build-bench/models/llama3.2-1b-q4_k_m-llama3.gguf
mkdir -p build-bench/models
[ -f "$model_1b" ] || "$bin/duet" mkmodel --shape llama3.2-1b --type q4_k_m \
  --vocab tests/data/vocab/llama3.gguf --ctx 512 --out "$model_1b"
: > "$out"
kcache_root=$(mktemp -d /tmp/duet-progbench-kcache.XXXXXX)
trap 'rm -rf "$kcache_root"' EXIT
for m in $models; do
  model=models/fortune-q8_0.gguf
  [ "$m" = 1b ] && model=$model_1b
  for mode in per-bucket symbolic; do
    # The first plan's steps compile the kernels' work-group variants into the fresh cache; the
    # later plans of the same process find them there.
    dir="$kcache_root/$m-$mode"
    mkdir -p "$dir"
    POCL_CACHE_DIR=$dir nice -n 19 "$bin/program_bench" --model "$model" --plans "$plans" \
      --modes "$mode" --kcache "$dir" --prompt "${PROMPT:-40}" --decode "${DECODE:-16}" >> "$out"
  done
done
python3 bench/program/summarize.py "$out"
