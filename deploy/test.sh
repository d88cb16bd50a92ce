#!/usr/bin/env bash
# Every test: installs what is missing, builds, fuzzes for a bounded time, runs the whole ctest
# suite (its summary is the last thing printed).
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh
deploy/build.sh
# libFuzzer over the GGUF reader, the tokenizer and every flatbuffer entry point, ~60 s in all.
deploy/fuzz.sh "${DUET_FUZZ_SECONDS:-20}"
cd build
ctest --output-on-failure -j "${DUET_TEST_JOBS:-2}" "$@"
