# Sourced on the `run` tool's device machine from the repo root (bench/gpu/device_run.sh,
# device_run_kq.sh, bench/puzzle/device_check.sh): unpacks the carried binaries
# (bench/gpu/prepare_device.sh; PACK: another pack) into $dev and points the carried OpenCL ICD
# loader at NVIDIA's OpenCL driver. Sets root, dev, out; returns 2 when the machine has no NVIDIA
# OpenCL driver. SRC_DIR: another tree the tests were built in (a worktree), linked to this one.
root=$(pwd)
dev=/tmp/build-gpu-device
mkdir -p "$dev" && tar -C "$dev" -xJf "$root/${PACK:-build-gpu-pack/gpu-device.tar.xz}"
out=${OUT:-/tmp/out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$dev/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nv=$(find / -xdev \( -name 'libnvidia-opencl.so.1' -o -name 'libnvidia-opencl.so.*' \) 2>/dev/null | head -1)
[ -z "$nv" ] && nv=$(find /usr /lib /opt -name 'libnvidia-opencl.so*' 2>/dev/null | head -1)
echo "nvidia opencl: ${nv:-none found}" | tee "$out/env.txt"
[ -z "$nv" ] && return 2
mkdir -p /tmp/icd && echo "$nv" >/tmp/icd/nvidia.icd
# DUET_CACHE_DIR may be given (a folder in the repo dir survives between calls on a warm
# machine, and can be carried back in): NVIDIA's compile of the program takes minutes.
export OCL_ICD_VENDORS=/tmp/icd OCL_ICD_FILENAMES=$nv DUET_CACHE_DIR=${DUET_CACHE_DIR:-/tmp/duet-cache}
# Tests find their data through the path they were built in.
for d in /work/main ${SRC_DIR:-}; do [ -e "$d" ] || { mkdir -p "$(dirname "$d")" && ln -s "$root" "$d"; }; done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$out/env.txt" 2>&1
# A MODELS entry NAME=PATH or NAME=mkmodel:SHAPE:TYPE (random weights of a real shape, llama3's
# vocabulary, written to /tmp/NAME.gguf): prints the model's path.
device_model() {
  local name=${1%%=*} model=${1#*=} shape type
  if [[ $model == mkmodel:* ]]; then
    IFS=: read -r _ shape type <<<"$model"
    "$dev/bin/duet" mkmodel --shape "$shape" --type "$type" --vocab tests/data/vocab/llama3.gguf \
      --out "/tmp/$name.gguf" >/dev/null || return 1
    model=/tmp/$name.gguf
  fi
  echo "$model"
}
return 0
