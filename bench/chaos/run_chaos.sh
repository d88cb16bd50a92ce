#!/usr/bin/env bash
# The long chaos run: 8 native clients and 3 HTTP clients (streaming /v1/completions through
# http_svc, retried as the OpenAI SDKs do) on a real stack while a random process (frontend,
# gpu_svc, npu_svc, solver_svc, http_svc or the supervisor, then adopted by the next `up`) is
# killed with SIGKILL every 0.5-3 s. Prints the counts, and each failure's message.
# Usage: bench/chaos/run_chaos.sh [seconds=300] [build dir=build]
set -euo pipefail
seconds="${1:-300}"
build="${2:-build}"
cd "$(dirname "$0")/../.."
DUET_CHAOS_SECONDS="$seconds" "$build/bin/chaos_kill_tests" \
  --gtest_filter='ChaosRun.*' 2>&1 | grep -E -A2 '^\[chaos\]|OK|FAILED|Failure'
