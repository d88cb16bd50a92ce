#!/usr/bin/env bash
# Issue 7, CPU devices: llama3.2-1b Q4_0 prefill/decode through the gpu-only plan (stack_bench
# --in-process, all roles in one process) with each matmul path, next to llama.cpp
# (bench/llamacpp, same GGUF, same threads), in turn ROUNDS times so load hits every side.
# Paths: before (BEFORE_BIN's stack_bench, e.g. a build of the tree without these kernels; skipped
# when unset), fp32 (DUET_GPU_INT8_MATMUL=0), int8-a16 (the default), int8-a8
# (DUET_GPU_INT8_ACT_BITS=8). Prints one JSON line per run.
# env: DUET_BIN_DIR (default build-int8/bin), BEFORE_BIN, ROUNDS (3), MIXES ("54/8 296/8"), THREADS
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${DUET_BIN_DIR:-build-int8/bin}
model=build-bench/models/llama3.2-1b-q4_0.gguf
threads=${THREADS:-$(nproc)}
export DUET_MAX_CTX=512
[ -f "$model" ] || "$bin/duet" mkmodel --shape llama3.2-1b --type q4_0 --ctx 512 --out "$model"
run() {  # label, stack_bench binary, env assignments...
  local label=$1 sb=$2
  shift 2
  local r
  if r=$(env "$@" "$sb" --in-process --plan gpu-only --model "$model" --max-ctx 512 \
           --prompt "$p" --gen "$g" --ignore-eos 2>/dev/null | tail -n 1); then
    echo "{\"round\":$round,\"mix\":\"$p/$g\",\"path\":\"$label\",\"loadavg\":\"$(cut -d' ' -f1 /proc/loadavg)\",\"result\":$r}"
  else echo "note: $label $p/$g failed" >&2; fi
}
for round in $(seq "${ROUNDS:-3}"); do
  for mix in ${MIXES:-54/8 296/8}; do
    p=${mix%/*} g=${mix#*/}
    [ -z "${BEFORE_BIN:-}" ] || run before "$BEFORE_BIN/stack_bench" DUET_UNUSED=1
    run fp32 "$bin/stack_bench" DUET_GPU_INT8_MATMUL=0
    run int8-a16 "$bin/stack_bench" DUET_GPU_INT8_ACT_BITS=16
    run int8-a8 "$bin/stack_bench" DUET_GPU_INT8_ACT_BITS=8
    r=$(node bench/llamacpp/llamacpp_bench.mjs "$model" "$p" "$g" "$threads" 512 2>/dev/null | tail -n 1)
    echo "{\"round\":$round,\"mix\":\"$mix\",\"path\":\"llama.cpp\",\"loadavg\":\"$(cut -d' ' -f1 /proc/loadavg)\",\"result\":$r}"
  done
done
