#!/usr/bin/env bash
# Runs on the device machine from the repo root (see bench/gpu/RESULTS.md for the call):
# points the carried OpenCL ICD loader at NVIDIA's OpenCL driver, then runs gpu_svc's
# conformance tests and the bench. Logs and JSON go to $OUT.
set -uo pipefail
source bench/gpu/device_env.sh || exit 2
status=0
if [ "${PREPARE_ONLY:-0}" = 1 ]; then  # only compile the program into the cache, timed
  (time "$dev/bin/gpu_svc" --prepare) 2>&1 | tee -a "$out/env.txt"
  exit "${PIPESTATUS[0]}"
fi
for t in ${TESTS:-gpu_kernels_test gpu_packed_test gpu_runner_test gpu_service_test gpu_timing_test gpu_kquant_matmul_test gpu_attention_test gpu_kv_pieces_test gpu_e0m4_matmul_test gpu_low_priority_test}; do
  "$dev/bin/$t" >"/tmp/$t.log" 2>&1 || status=1
  cat "/tmp/$t.log" >>"$out/tests.log"  # one file: the run tool brings back at most 8
  echo "$t: $(grep -E '^\[  (PASSED|FAILED)' "/tmp/$t.log" | tr '\n' ' ')"
done
[ "${BENCH:-1}" = 0 ] && exit $status  # conformance only
variants=l32r2,l32r4,l32r8,l16r8,l64r4,l128r4,l16r4p,l16r8p,l32r4p,l32r8p,l64r4p,l16r4x,l16r8x,l32r4x,l64r4x  # GpuKernels::kGemvTuningVariants, side by side
"$dev/bin/gpu_bench" --reps 20 --gemv-rows 28672 --gemm-tokens 256 --copy-mb 1024 \
  --gemv-variants $variants >"$out/bench.json" 2>"$out/bench.err" || status=1
# The down projection's shape too (long rows: [4096, 14336]).
"$dev/bin/gpu_bench" --reps 20 --gemv-rows 4096 --gemv-cols 14336 --gemm-tokens 16 --copy-mb 1024 \
  --gemv-variants $variants >"$out/bench_down.json" 2>>"$out/bench.err" || status=1
# And a square one ([4096, 4096]: the attention projections).
"$dev/bin/gpu_bench" --reps 20 --gemv-rows 4096 --gemv-cols 4096 --gemm-tokens 16 --copy-mb 1024 \
  --gemv-variants $variants >"$out/bench_square.json" 2>>"$out/bench.err" || status=1
# E0M4 (duet's FP4) against Q4_0 and Q4_K on Transformer-Lite's Table 1 shapes ([K, N] =
# [4096, 4096], [4096, 11008], [11008, 4096] as rows N x cols K), 1 and 128 tokens, the types'
# order rotated over 5 rounds (best of each): host wall clock per matmul call, every path.
"$dev/bin/gpu_bench" --reps 20 --rounds 5 --paths 1,128 --path-types E0M4,Q4_0,Q4_K \
  --path-shapes 4096x4096,11008x4096,4096x11008 >"$out/bench_e0m4.json" 2>>"$out/bench.err" || status=1
cat "$out/bench.json" "$out/bench_down.json" "$out/bench_square.json" "$out/bench_e0m4.json" "$out/bench.err"
exit $status
