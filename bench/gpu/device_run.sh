#!/usr/bin/env bash
# Runs on the device machine from the repo root (see bench/gpu/RESULTS.md for the call):
# points the carried OpenCL ICD loader at NVIDIA's OpenCL driver, then runs gpu_svc's
# conformance tests and the bench. Logs and JSON go to $OUT.
set -uo pipefail
root=$(pwd)
dev=/tmp/build-gpu-device
mkdir -p "$dev" && tar -C "$dev" -xJf "$root/build-gpu-pack/gpu-device.tar.xz"
out=${OUT:-/tmp/out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$dev/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nv=$(find / -xdev \( -name 'libnvidia-opencl.so.1' -o -name 'libnvidia-opencl.so.*' \) 2>/dev/null | head -1)
[ -z "$nv" ] && nv=$(find /usr /lib /opt -name 'libnvidia-opencl.so*' 2>/dev/null | head -1)
echo "nvidia opencl: ${nv:-none found}" | tee "$out/env.txt"
[ -z "$nv" ] && exit 2
mkdir -p /tmp/icd && echo "$nv" >/tmp/icd/nvidia.icd
export OCL_ICD_VENDORS=/tmp/icd OCL_ICD_FILENAMES=$nv DUET_CACHE_DIR=/tmp/duet-cache
# Tests find their data through the path they were built in.
[ -e /work/main ] || { mkdir -p /work && ln -s "$root" /work/main; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$out/env.txt" 2>&1
status=0
for t in gpu_kernels_test gpu_runner_test gpu_service_test gpu_timing_test; do
  "$dev/bin/$t" >"$out/$t.log" 2>&1 || status=1
  echo "$t: $(grep -E '^\[  (PASSED|FAILED)' "$out/$t.log" | tr '\n' ' ')"
done
"$dev/bin/gpu_bench" --reps 20 --gemv-rows 28672 --gemm-tokens 256 --copy-mb 1024 >"$out/bench.json" 2>"$out/bench.err" || status=1
cat "$out/bench.json" "$out/bench.err"
exit $status
