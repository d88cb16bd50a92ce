#!/usr/bin/env bash
# Packs gpu_svc's test and bench binaries (built in the build dir $1, default build-gpu/) and the shared libraries they
# need beyond the C/C++ runtime into build-gpu-device/ (git-ignored), for the `run` tool's
# device machine, which has NVIDIA's OpenCL driver but no ICD loader or our dependencies.
set -euo pipefail
cd "$(dirname "$0")/../.."
src=${1:-build-gpu}
dst=build-gpu-device
rm -rf "$dst"
mkdir -p "$dst/bin" "$dst/lib"
bins=${BINS:-"gpu_kernels_test gpu_packed_test gpu_runner_test gpu_service_test gpu_timing_test gpu_bench gpu_kquant_matmul_test gpu_attention_test gpu_kv_pieces_test gpu_e0m4_matmul_test gpu_low_priority_test gpu_svc"}
for b in $bins; do
  strip -o "$dst/bin/$b" "$src/bin/$b"
done
# The libc family and the C++ runtime stay the device's own (newer and compatible).
for b in $bins; do ldd "$src/bin/$b"; done | awk '/=>/ {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libpthread|libdl|librt|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" "$dst/lib/"; done
# The working tree travels too (64 MiB in all): carry the pack compressed.
mkdir -p build-gpu-pack
tar -C "$dst" -cJf build-gpu-pack/gpu-device.tar.xz .
du -sh build-gpu-pack
