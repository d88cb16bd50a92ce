#!/usr/bin/env bash
# Issue 19 on the device machine (the call: bench/gpu/RESULTS.md): NVIDIA's OpenCL as
# device_run.sh sets it up, then the K-quant conformance test (gpu_kquant_matmul_test; the
# integer path is CPU-only, so the fp32 GPU kernels run) and the matmul paths of Q4_0/Q8_0/Q4_K/
# Q6_K side by side (gpu_bench --paths). Logs and JSON go to $OUT.
set -uo pipefail
root=$(pwd)
dev=/tmp/build-gpu-device
mkdir -p "$dev" && tar -C "$dev" -xJf "$root/${PACK:-build-gpu-pack/gpu-device.tar.xz}"
out=${OUT:-/tmp/out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$dev/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nv=$(find / -xdev -name 'libnvidia-opencl.so*' 2>/dev/null | head -1)
echo "nvidia opencl: ${nv:-none found}" | tee "$out/env.txt"
[ -z "$nv" ] && exit 2
mkdir -p /tmp/icd && echo "$nv" >/tmp/icd/nvidia.icd
export OCL_ICD_VENDORS=/tmp/icd OCL_ICD_FILENAMES=$nv DUET_CACHE_DIR=/tmp/duet-cache
[ -e /work/main ] || { mkdir -p /work && ln -s "$root" /work/main; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$out/env.txt" 2>&1
status=0
for t in ${TESTS:-gpu_kquant_matmul_test gpu_kernels_test gpu_packed_test}; do
  "$dev/bin/$t" >"/tmp/$t.log" 2>&1 || status=1
  cat "/tmp/$t.log" >>"$out/tests.log"
  echo "$t: $(grep -E '^\[  (PASSED|FAILED)' "/tmp/$t.log" | tr '\n' ' ')"
done
"$dev/bin/gpu_bench" --reps ${REPS:-20} --paths 1,296 --path-types Q4_0,Q8_0,Q4_K,Q6_K \
  --path-shapes 8192x2048,2048x8192 >"$out/paths.json" 2>"$out/bench.err" || status=1
cat "$out/bench.err"
exit $status
