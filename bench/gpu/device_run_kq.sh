#!/usr/bin/env bash
# Issue 19 on the device machine (the call: bench/gpu/RESULTS.md): NVIDIA's OpenCL as
# device_run.sh sets it up, then the K-quant conformance test (gpu_kquant_matmul_test; the
# integer path is CPU-only, so the fp32 GPU kernels run) and the matmul paths of Q4_0/Q8_0/Q4_K/
# Q6_K side by side (gpu_bench --paths). Logs and JSON go to $OUT.
set -uo pipefail
source bench/gpu/device_env.sh || exit 2
status=0
for t in ${TESTS:-gpu_kquant_matmul_test gpu_kernels_test gpu_packed_test gpu_runner_test}; do
  filter=
  [ "$t" = gpu_runner_test ] && filter=--gtest_filter=*KQuant*  # the K mixes, copies mode
  "$dev/bin/$t" $filter >"/tmp/$t.log" 2>&1 || status=1
  cat "/tmp/$t.log" >>"$out/tests.log"
  echo "$t: $(grep -E '^\[  (PASSED|FAILED)' "/tmp/$t.log" | tr '\n' ' ')"
done
"$dev/bin/gpu_bench" --reps ${REPS:-20} --paths 1,296 --path-types Q4_0,Q8_0,Q4_K,Q6_K \
  --path-shapes 8192x2048,2048x8192 >"$out/paths.json" 2>"$out/bench.err" || status=1
# GEMV GB/s (kernel profiling time) of every type next to the copy, both shapes.
for shape in "8192 2048" "2048 8192"; do
  set -- $shape
  "$dev/bin/gpu_bench" --reps 20 --gemv-rows $1 --gemv-cols $2 --gemm-tokens 16 --copy-mb 256 \
    >"$out/gemv_$1x$2.json" 2>>"$out/bench.err" || status=1
done
cat "$out/bench.err"
exit $status
