#!/usr/bin/env bash
# Configures and builds duet into build/ (Release-ish, warnings as errors).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${DUET_JOBS:-$(nproc)}
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build build -j "$jobs"
