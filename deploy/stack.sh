#!/usr/bin/env bash
# The stack verbs, same as `duet stack ...`:
#   deploy/stack.sh up [--model PATH] [--soc PROFILE] [--stack ID]   start, wait until healthy
#        [--http [ADDR:]PORT] [--api-key-file F]                      ... with http_svc (OpenAI API)
#   deploy/stack.sh down [--stack ID]                                 stop, remove everything
#   deploy/stack.sh status [--json] [--stack ID]                      pid, uptime, restarts, heartbeat age
#   deploy/stack.sh restart SERVICE [--stack ID]                      frontend|gpu_svc|npu_svc|solver_svc|http_svc
#   deploy/stack.sh logs SERVICE [-n LINES] [--stack ID]              a service's (or supervisor's) log
# Uses $DUET_BIN, else build/bin/duet (run deploy/build.sh first). Test hook for the supervisor's
# restart-intensity limit: DUET_CRASH_AT_START=<service> makes that service abort at start.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
duet="${DUET_BIN:-$root/build/bin/duet}"
if [ ! -x "$duet" ]; then
  echo "stack.sh: $duet not found: build first (deploy/build.sh) or set DUET_BIN" >&2
  exit 1
fi
if [ $# -eq 0 ]; then
  exec "$duet" stack --help
fi
exec "$duet" stack "$@"
