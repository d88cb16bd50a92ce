#!/usr/bin/env bash
# Issue 7, CPU devices: llama3.2-1b Q4_0 prefill/decode tokens/s through the gpu-only plan with
# all roles in one process (stack_bench --in-process) at the default activation bits, next to
# llama.cpp (bench/llamacpp, same GGUF, same threads) and optionally an earlier build
# (BEFORE_BIN), and optionally with DUET_GPU_INT8_ACT_BITS=$ACT_BITS (path "duet act_bits=..."),
# in turn ROUNDS times. Each run holds /work/helpers/bench.lock (when it exists)
# so that no other benchmark overlaps it. One JSON line per run.
# env: DUET_BIN_DIR (default build-prefill/bin), BEFORE_BIN, ACT_BITS, ROUNDS (3), MIXES ("54/8 296/8"),
#      THREADS (default nproc)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${DUET_BIN_DIR:-build-prefill/bin}
model=build-bench/models/llama3.2-1b-q4_0.gguf
threads=${THREADS:-$(nproc)}
lock=/work/helpers/bench.lock
export DUET_MAX_CTX=512
[ -f "$model" ] || "$bin/duet" mkmodel --shape llama3.2-1b --type q4_0 --ctx 512 --out "$model"
locked() { if [ -e "$lock" ]; then flock "$lock" "$@"; else "$@"; fi; }
emit() {  # label, result JSON
  echo "{\"round\":$round,\"mix\":\"$p/$g\",\"path\":\"$1\",\"loadavg\":\"$(cut -d' ' -f1 /proc/loadavg)\",\"result\":$2}"
}
duet() {  # label, bin dir, env assignments...
  local r label=$1 dir=$2
  shift 2
  if r=$(locked env "$@" "$dir/stack_bench" --in-process --plan gpu-only --model "$model" --max-ctx 512 \
           --prompt "$p" --gen "$g" --ignore-eos 2>/dev/null | tail -n 1); then emit "$label" "$r"
  else echo "note: $label $p/$g failed" >&2; fi
}
for round in $(seq "${ROUNDS:-3}"); do
  for mix in ${MIXES:-54/8 296/8}; do
    p=${mix%/*} g=${mix#*/}
    duet duet "$bin" DUET_UNUSED=1
    [ -z "${ACT_BITS:-}" ] || duet "duet act_bits=$ACT_BITS" "$bin" "DUET_GPU_INT8_ACT_BITS=$ACT_BITS"
    [ -z "${BEFORE_BIN:-}" ] || duet before "$BEFORE_BIN" DUET_UNUSED=1
    if r=$(locked node bench/llamacpp/llamacpp_bench.mjs "$model" "$p" "$g" "$threads" 512 \
             2>/dev/null | tail -n 1); then emit llama.cpp "$r"
    else echo "note: llama.cpp $p/$g failed" >&2; fi
  done
done
