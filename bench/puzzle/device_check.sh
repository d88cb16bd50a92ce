#!/usr/bin/env bash
# Issue 25's device-in-the-loop check where the two processors are two: runs on the `run` tool's
# device machine (an NVIDIA GPU for gpu_svc, 16 CPU cores for npu_svc's emulator, the frontend and
# the rest) from the repo root, with the binaries of bench/gpu/prepare_device.sh (BINS below).
#   1. bench/modeled/run_host_check.sh on tiny-fortune: traces of gpu-only and npu-only requests
#      through the stack, `duet profile --from-trace --shared-cores 0` fits this machine's SoC
#      profile (its GPU is a discrete device: the two device processes do not take turns on
#      cores), and the timeline model is checked against every plan's measured steps;
#   2. puzzle_device_check on that profile (the GA searches for this machine) and on sd8gen3.
# Writes to $OUT: env.txt, host_check.jsonl, host.toml, check-host.json, check-sd8gen3.json,
# log.txt. env: ROUNDS (run_host_check's, 3), HOST_PROFILE (a profile fitted before, e.g.
# bench/puzzle/results/host-h100-fortune-q8_0.toml: step 1 is skipped), SOCS ("host sd8gen3"),
# REPEATS (puzzle_device_check's measured runs per candidate, 3). Local side (see bench/puzzle/RESULTS.md for the call):
#   cmake --build build --target duet duet-supervisor frontend gpu_svc npu_svc http_svc \
#     solver_svc stack_bench host_check puzzle_device_check
#   BINS="duet duet-supervisor frontend gpu_svc npu_svc http_svc solver_svc stack_bench \
#     host_check puzzle_device_check" bash bench/gpu/prepare_device.sh build
set -uo pipefail
source bench/gpu/device_env.sh || exit 2
bin=$dev/bin
export DUET_SOC_DIR=$root/deploy/soc
# Per-op device times in the traces (gpu.op_timing: auto leaves them off on discrete GPUs).
export DUET_GPU_OP_TIMING=${DUET_GPU_OP_TIMING:-on}
log=$out/log.txt
fortune=tests/data/tiny-fortune/fortune-q8_0.gguf
qwen=/tmp/tiny-qwen2.gguf
"$bin/duet" mkmodel --shape tiny-qwen2 --arch qwen2 --vocab tests/data/vocab/qwen2.gguf \
  --type q8_0 --std 0.08 --out "$qwen" >>"$log" 2>&1 || exit 3
(time "$bin/gpu_svc" --prepare) >>"$log" 2>&1  # NVIDIA's compile of the program, into the cache
status=0
if [ -n "${HOST_PROFILE:-}" ]; then
  cp "$HOST_PROFILE" "$out/host.toml" || exit 4
else
  DUET_BIN_DIR=$bin MODEL=$fortune SHARED_CORES=0 ROUNDS=${ROUNDS:-3} \
    bash bench/modeled/run_host_check.sh >>"$log" 2>&1 || status=1
  cp bench/modeled/results/host_check-fortune-q8_0.jsonl "$out/host_check.jsonl" 2>/dev/null
  cp bench/modeled/results/host-fortune-q8_0.toml "$out/host.toml" 2>/dev/null || exit 4
fi
for soc in ${SOCS:-host sd8gen3}; do
  s=$soc
  [ "$soc" = host ] && s=$out/host.toml
  "$bin/puzzle_device_check" --fortune "$fortune" --qwen "$qwen" --duet "$bin/duet" --soc "$s" \
    --stack "pdc$soc" --repeats "${REPEATS:-3}" --out "$out/check-$soc${RUN:+-$RUN}.json" \
    >>"$log" 2>&1 || status=1
done
tail -n 60 "$log"
exit $status
