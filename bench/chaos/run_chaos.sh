#!/usr/bin/env bash
# The long chaos run: 8 concurrent clients on a real stack while random services (frontend,
# gpu_svc, npu_svc, solver_svc) are killed with SIGKILL every 0.5-3 s. Prints one line of counts.
# Usage: bench/chaos/run_chaos.sh [seconds=300] [build dir=build]
set -euo pipefail
seconds="${1:-300}"
build="${2:-build}"
cd "$(dirname "$0")/../.."
DUET_CHAOS_SECONDS="$seconds" "$build/bin/chaos_kill_tests" \
  --gtest_filter='ChaosRun.*' 2>&1 | grep -E '^\[chaos\]|OK|FAILED'
