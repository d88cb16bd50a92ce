#!/usr/bin/env bash
# Configures and builds duet into build/ (Release-ish, warnings as errors).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${DUET_JOBS:-$(nproc)}
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build build -j "$jobs"
# The OpenCL kernel program, built once per machine into the cache (a cold PoCL build takes
# longer than `duet stack up` waits for a healthy stack); instant when the cache is warm.
build/bin/gpu_svc --prepare
