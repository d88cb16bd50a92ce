#!/usr/bin/env bash
# Decode cost with gpu_svc's fused launches on and off (DUET_GPU_FUSE=1|0, alternating stacks;
# VARIANTS: FUSE@BINDIR items, e.g. "1@build/bin 1@/tmp/other/bin 0@build/bin" to compare builds
# too): per model, round and variant, gpu_svc's CPU ms per decode token ((a 68-token generation - a 4-token one)
# / 64, after a 64-token prompt, from /proc/PID/stat), the wall ms per decode token (stack_bench's
# tpot of the 68-token one), and from `duet trace --last` of it the kernels per decode step (ops
# with a span of their own) and the gaps between them (fuse_trace.py). One JSON line per run.
#
#   MODELS="a.gguf b.gguf" ROUNDS=2 bash bench/kquant/fuse_decode.sh
set -uo pipefail  # a failed run prints an error line; the others go on
bin=build/bin
stack=${STACK:-fusebench$$}
trap '"$bin/duet" stack down --stack $stack >/dev/null 2>&1 || true' EXIT
cpu_ms() {  # utime + stime of a process, ms
  [ -n "$1" ] && awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) * 1000 / hz }' "/proc/$1/stat"
}
bench() {  # prompt gen salt: stack_bench's JSON line
  "$bin/stack_bench" --stack $stack --plan gpu-only --model "$model" --prompt "$1" --gen "$2" \
    --prompt-salt "$3" --ignore-eos 2>/dev/null | tail -n 1
}
for round in $(seq "${ROUNDS:-1}"); do
  for model in ${MODELS:?}; do
    for variant in ${VARIANTS:-1@build/bin 0@build/bin}; do
      fuse=${variant%%@*} bin=${variant#*@}
      DUET_GPU_FUSE=$fuse "$bin/duet" stack up --stack $stack --model "$model" --plan gpu-only \
        --timeout 300 >&2
      for salt in 1 2 3; do bench 64 4 $salt >/dev/null || true; done  # untimed warm-up
      pid=$(pgrep -f "gpu_svc --stack $stack " | head -n 1)
      c0=$(cpu_ms "$pid")
      bench 64 4 11 >/dev/null
      c1=$(cpu_ms "$pid")
      r=$(bench 64 68 12)
      c2=$(cpu_ms "$pid")
      if [ -z "$r" ] || [ -z "$c0" ] || [ -z "$c2" ]; then
        echo "{\"model\":\"$(basename "$model")\",\"round\":$round,\"fuse\":$fuse,\"bin\":\"$bin\",\"error\":\"a request failed\"}"
        "$bin/duet" stack down --stack $stack >&2
        continue
      fi
      trace=$(mktemp --suffix=.json)
      "$bin/duet" trace --stack $stack --last --out "$trace" >/dev/null
      t=$(python3 bench/kquant/fuse_trace.py "$trace")
      rm -f "$trace"
      echo "{\"model\":\"$(basename "$model")\",\"round\":$round,\"fuse\":$fuse,\"bin\":\"$bin\"," \
        "\"loadavg\":\"$(cut -d' ' -f1 /proc/loadavg)\",\"time\":\"$(date -u +%H:%M:%S)\"," \
        "\"gpu_svc_cpu_ms_per_token\":$(awk -v a="$c0" -v b="$c1" -v c="$c2" 'BEGIN { print (c - b - (b - a)) / 64 }')," \
        "\"stack_bench\":$r,\"trace\":$t}"
      "$bin/duet" stack down --stack $stack >&2
    done
  done
done
