#!/usr/bin/env bash
# Soak (issue 22): a stack on the default model under N clients of short requests for SECONDS;
# bench/soak/soak.py samples RSS, fds, shm and log bytes and prints the slopes per 1000 requests.
# env: SECONDS_RUN (120), CLIENTS (4). Appends to bench/soak/results.jsonl.
set -euo pipefail
cd "$(dirname "$0")/../.."
stack=soak$$
trap 'build/bin/duet stack down --stack $stack >/dev/null 2>&1 || true' EXIT
build/bin/duet stack up --stack $stack >&2
PYTHONPATH=build/python /usr/bin/python3 bench/soak/soak.py --stack $stack \
  --seconds "${SECONDS_RUN:-120}" --clients "${CLIENTS:-4}" | tee -a bench/soak/results.jsonl
