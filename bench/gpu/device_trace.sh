#!/usr/bin/env bash
# On the `run` tool's GPU machine from the repo root: one model served gpu-only by a whole stack
# there (gpu_svc on the NVIDIA GPU), a warm-up, then per MODELS entry one request of PROMPT tokens
# and GEN decode tokens through stack_bench, and `duet trace --last` of it: where a step's time
# goes on a discrete GPU (copies mode). Binaries: bench/gpu/prepare_device.sh with BINS="duet
# duet-supervisor frontend gpu_svc npu_svc http_svc solver_svc stack_bench". Writes
# $OUT/trace-<name>.json and $OUT/bench.jsonl.
# env: MODELS ("fortune=tests/data/tiny-fortune/fortune-q8_0.gguf 1b=mkmodel:llama3.2-1b:q4_0"),
#      PROMPT (64), GEN (32), DUET_KV_MEMORY (the stack's default budget unless given: a copying
#      gpu_svc uploads each KV page the first time a step names it, nothing at registration).
set -uo pipefail
source bench/gpu/device_env.sh || exit 2
bin=$dev/bin
export DUET_SOC_DIR=$root/deploy/soc
# Per-op device times in the traces (gpu.op_timing: auto leaves them off on discrete GPUs).
export DUET_GPU_OP_TIMING=${DUET_GPU_OP_TIMING:-on}
status=0
for entry in ${MODELS:-fortune=tests/data/tiny-fortune/fortune-q8_0.gguf 1b=mkmodel:llama3.2-1b:q4_0}; do
  name=${entry%%=*}
  model=$(device_model "$entry") || { status=1; continue; }
  stack=trace$name
  "$bin/duet" stack up --stack "$stack" --model "$model" --plan gpu-only --timeout 300 >/dev/null ||
    { status=1; continue; }
  "$bin/stack_bench" --stack "$stack" --plan gpu-only --model "$model" --prompt "${PROMPT:-64}" \
    --gen 4 --prompt-salt 1 --ignore-eos >/dev/null 2>&1
  "$bin/stack_bench" --stack "$stack" --plan gpu-only --model "$model" --prompt "${PROMPT:-64}" \
    --gen "${GEN:-32}" --prompt-salt 2 --ignore-eos | tail -n 1 >>"$out/bench.jsonl" || status=1
  "$bin/duet" trace --stack "$stack" --last --out "$out/trace-$name.json" >/dev/null || status=1
  "$bin/duet" stack down --stack "$stack" >/dev/null
done
cat "$out/bench.jsonl"
exit $status
