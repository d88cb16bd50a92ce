#!/usr/bin/env bash
# Issue 20: long contexts side by side. llama3.2-1b (`duet mkmodel`, random weights, the shape's
# real dimensions) through the full stack (`duet stack up --plan gpu-only`, f16 KV by default,
# stack_bench --stack) and llama.cpp (node-llama-cpp's prebuilt CPU build, f16 KV, bench/llamacpp)
# on the same file and the same cores, alternately within each round:
#   decode tok/s after a prompt of each --contexts size (GEN tokens: the decode context),
#   prefill tok/s of a --prefill-token prompt,
#   memory at the largest context: PSS summed over every process of the stack (so the shm
#   segments and the mmapped model count once) beside llama.cpp's process, with RSS and the
#   stack's touched shm (/dev/shm/duet-<stack>-*) too.
# One JSON line per measurement into bench/longctx/results.jsonl; summarize.py makes the table.
#
# usage: bench/longctx/run.sh [--threads N] [--contexts "512 4096 16384"] [--prefill 4096]
#          [--gen 32] [--rounds 1] [--type q4_0] [--kv-type f16] [--flash] [--no-llamacpp]
# Both engines are pinned to cores 0..N-1 (taskset; PoCL's POCL_CPU_MAX_CU_COUNT=N too).
# Hook: SHARED_PREFIX_CMD (a command printing one JSON line, run with the stack id and model as
# $1 $2 while the stack is up) adds a "ttft_shared_prefix" row (issue 20 item 4, prefix20).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${BIN:-build/bin}
threads=2 contexts="512 4096 16384" prefill=4096 gen=32 rounds=1 type=q4_0 kv_type=f16
flash="" llamacpp=1
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) threads=$2; shift 2 ;;
    --contexts) contexts=$2; shift 2 ;;
    --prefill) prefill=$2; shift 2 ;;
    --gen) gen=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --type) type=$2; shift 2 ;;
    --kv-type) kv_type=$2; shift 2 ;;
    --flash) flash=flash; shift ;;
    --no-llamacpp) llamacpp=0; shift ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
out=bench/longctx/results.jsonl
largest=$(printf '%s\n' $contexts $prefill | sort -n | tail -n 1)
model_ctx=$(( (largest + gen + 1023) / 1024 * 1024 ))
mkdir -p build-bench/models
model=build-bench/models/llama3.2-1b-$type-ctx$model_ctx.gguf
[ -f "$model" ] || "$bin/duet" mkmodel --shape llama3.2-1b --type "$type" --ctx "$model_ctx" \
  --out "$model" >&2
if [ "$llamacpp" = 1 ] && [ ! -d bench/llamacpp/node_modules/node-llama-cpp ]; then
  bench/llamacpp/setup.sh >/dev/null
fi
cores="0-$((threads - 1))"
stack=attn20lc$$
trap '"$bin/duet" stack down --stack $stack >/dev/null 2>&1 || true' EXIT

# Memory of the stack: PSS (and RSS) summed over its processes, and its touched shm.
stack_memory() {
  local pss=0 rss=0 pid
  for pid in $(pgrep -f -- "$stack" || true); do
    [ -r /proc/$pid/smaps_rollup ] || continue
    pss=$((pss + $(awk '/^Pss:/ {print $2}' /proc/$pid/smaps_rollup) * 1024))
    rss=$((rss + $(awk '/^Rss:/ {print $2}' /proc/$pid/smaps_rollup) * 1024))
  done
  # Allocated blocks, not du -b's apparent size: the KV pool's segment is as large as the whole
  # budget but holds only the pages written so far.
  local shm
  shm=$(du -sc --block-size=1 /dev/shm/duet-$stack-* 2>/dev/null | tail -n 1 | cut -f1)
  echo "{\"pss_bytes\":$pss,\"rss_bytes\":$rss,\"shm_touched_bytes\":${shm:-0}}"
}
emit() {  # engine, metric, size, result JSON
  echo "{\"metric\":\"$2\",\"size\":$3,\"engine\":\"$1\",\"round\":$round,\"threads\":$threads,\"type\":\"$type\",\"kv_type\":\"$kv_type\",\"attention\":\"${DUET_GPU_ATTENTION:-shared}\",\"gen\":$gen,\"loadavg\":\"$(cut -d' ' -f1 /proc/loadavg)\",\"commit\":\"$(git rev-parse --short HEAD)\",\"result\":$4}" |
    tee -a "$out"
}
duet_run() {  # prompt tokens
  taskset -c "$cores" "$bin/stack_bench" --stack $stack --plan gpu-only --model "$model" \
    --prompt "$1" --gen "$gen" --ignore-eos 2>/dev/null | tail -n 1
}
llama_run() {  # prompt tokens
  taskset -c "$cores" node bench/longctx/llamacpp_longctx.mjs "$model" "$1" "$gen" "$threads" \
    $(($1 + gen + 16)) $flash 2>/dev/null | tail -n 1
}

for round in $(seq "$rounds"); do
  # DUET_KV_PREFIX=off: every prompt here is a prefix of the longer ones (the same synthetic
  # ids), so with prefix sharing a prompt after the warm-up would be served from cached pages and
  # its prefill (and the decode run's context) would not be computed.
  POCL_CPU_MAX_CU_COUNT=$threads DUET_KV_TYPE=$kv_type DUET_KV_PREFIX=off taskset -c "$cores" \
    "$bin/duet" stack up --stack $stack --model "$model" --plan gpu-only --timeout 600 >&2
  # Untimed: the first requests build the engine and let gpu_svc measure its queues per shape.
  for warm in 64 600; do duet_run $warm >/dev/null || true; done
  # A decode run's prompt is a prefill of that size: where --prefill is one of --contexts, that
  # run's prefill_tok_s is the prefill row (the same measurement a separate run would repeat).
  for ctx in $contexts; do
    r=$(duet_run "$ctx") && emit duet decode "$ctx" "$r" &&
      { [ "$ctx" != "$prefill" ] || emit duet prefill "$ctx" "$r"; }
    [ "$ctx" = "$largest" ] && emit duet memory "$ctx" "$(stack_memory)"
    if [ "$llamacpp" = 1 ]; then
      r=$(llama_run "$ctx") && emit llama.cpp decode "$ctx" "$r" &&
        { [ "$ctx" != "$prefill" ] || emit llama.cpp prefill "$ctx" "$r"; }
      [ "$ctx" = "$largest" ] && emit llama.cpp memory "$ctx" "$r"
    fi
  done
  if ! printf '%s\n' $contexts | grep -qx -- "$prefill"; then
    r=$(duet_run "$prefill") && emit duet prefill "$prefill" "$r"
    if [ "$llamacpp" = 1 ]; then r=$(llama_run "$prefill") && emit llama.cpp prefill "$prefill" "$r"; fi
  fi
  if [ -n "${SHARED_PREFIX_CMD:-}" ]; then
    r=$($SHARED_PREFIX_CMD "$stack" "$model" | tail -n 1) && emit duet ttft_shared_prefix 0 "$r"
  fi
  "$bin/duet" stack down --stack $stack >&2
done
