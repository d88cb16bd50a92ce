#!/usr/bin/env bash
# Every test: installs what is missing, builds, runs the whole ctest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh
deploy/build.sh
cd build
ctest --output-on-failure -j "${DUET_TEST_JOBS:-2}" "$@"
