#!/usr/bin/env bash
# Resource faults on a real stack (issue 22 part 5), each in a private mount namespace with its
# own small tmpfs for /dev/shm and for the run directory, so filling them touches nothing else:
#   - an unwritable run directory and a /dev/shm too small for the KV pool are refused at `up`
#     with the reason;
#   - a run/log directory that fills up while the stack runs: requests, status and a service
#     restart go on (log lines are lost, nothing else);
#   - /dev/shm filling up while the stack runs: running engines keep serving (their segments
#     are reserved up front), a service restart works, a request that needs a new segment gets
#     a clear error naming /dev/shm, and succeeds once space is back;
#   - an HTTP client that never reads its stream: another client's request gets its own tokens,
#     the stalled one ends, and no KV page stays held.
# Usage: resource_faults.sh BUILD_BIN_DIR (run as root: it mounts; exits 77, skipped, if it cannot)
set -uo pipefail
BIN=$(cd "$1" && pwd)
D="$BIN/duet"
REPO=$(cd "$(dirname "$0")/../.." && pwd)

if [[ "${DUET_IN_FAULT_NS:-}" != 1 ]]; then
  if ! unshare -m --propagation private true 2>/dev/null; then
    echo "SKIP: needs a private mount namespace (unshare -m): run as root"
    exit 77
  fi
  DUET_IN_FAULT_NS=1 exec unshare -m --propagation private "$0" "$@"
fi

cd "$REPO"
ID="rf$$"
WORK=$(mktemp -d /tmp/duet-rf-XXXXXX)
failures=0
check() {  # check "what" command...: the command must succeed
  local what=$1
  shift
  if "$@"; then echo "ok   - $what"; else echo "FAIL - $what"; failures=$((failures + 1)); fi
}
contains() { grep -qF -- "$2" <<<"$1"; }
cleanup() {
  DUET_RUN_ROOT="$WORK/run" "$D" stack down --stack "$ID" >/dev/null 2>&1
  umount "$WORK/run" "$WORK/ro" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

mount -t tmpfs -o size=64m tmpfs /dev/shm
mkdir -p "$WORK/run" "$WORK/ro"
mount -t tmpfs -o size=4m tmpfs "$WORK/run"
mount -t tmpfs -o ro,size=1m tmpfs "$WORK/ro"
export DUET_RUN_ROOT="$WORK/run"
fill() { fallocate -l "$(df --output=avail -B1 "$1" | tail -1)" "$1/filler"; }
gen() { "$D" generate --stack "$ID" --max-tokens 24 --ignore-eos "Q: Why" 2>&1; }

echo "# refused at up"
out=$(DUET_RUN_ROOT="$WORK/ro" "$D" stack up --stack "$ID" 2>&1)
check "an unwritable run directory is refused at up, naming it" \
  contains "$out" "cannot create directory '$WORK/ro/$ID': Read-only file system"
mount -o remount,size=1m /dev/shm
out=$("$D" stack up --stack "$ID" 2>&1)
check "a /dev/shm too small for one sequence is refused at up, naming /dev/shm" \
  contains "$out" "free or enlarge /dev/shm"
mount -o remount,size=64m /dev/shm

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
out=$("$D" stack up --stack "$ID" --http "127.0.0.1:$PORT" 2>&1)
check "the stack comes up in a 64 MiB /dev/shm and a 4 MiB run directory" contains "$out" "is up"
solo=$(gen)
check "a solo generation" contains "$solo" "finish length"
solo_text=$(head -1 <<<"$solo")
eval_ids="1 1342 347"
ev() { "$D" eval --stack "$ID" --plan "$1" --ids "$eval_ids" --logits-out "$WORK/logits.f32" 2>&1; }
ev npu-only >/dev/null  # builds that engine

service_pid() {
  "$D" stack status --stack "$ID" --json 2>/dev/null |
    python3 -c "import json,sys; print([s['pid'] for s in json.load(sys.stdin)['services'] if s['name']=='$1'][0])"
}
wait_healthy() {
  for _ in $(seq 100); do
    "$D" stack status --stack "$ID" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}

echo "# the run directory fills up"
fill "$WORK/run"
check "a generation with the log directory full has the solo tokens" \
  contains "$(gen)" "$solo_text"
kill -9 "$(service_pid npu_svc)"
sleep 0.5
check "npu_svc killed with the log directory full is restarted" wait_healthy
check "and the next generation has the solo tokens" contains "$(gen)" "$solo_text"
rm -f "$WORK/run/filler"

echo "# /dev/shm fills up"
fill /dev/shm
check "a generation with /dev/shm full has the solo tokens" contains "$(gen)" "$solo_text"
kill -9 "$(service_pid gpu_svc)"
sleep 0.5
check "gpu_svc killed with /dev/shm full is restarted" wait_healthy
check "and the next generation has the solo tokens" contains "$(gen)" "$solo_text"
out=$(ev gpu-only)
check "a request needing a new segment gets a clear error naming /dev/shm" \
  contains "$out" "No space left on device"
rm -f /dev/shm/filler
check "the same request succeeds once /dev/shm has room" ev gpu-only

echo "# a client that never reads its stream"
python3 - "$PORT" >"$WORK/stalled.out" 2>&1 <<'PY' &
import json, socket, sys, time
body = json.dumps({"prompt": "Q: Why", "max_tokens": 400, "stream": True}).encode()
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
time.sleep(20)  # never reads
PY
stalled=$!
sleep 1
check "another client's generation meanwhile has the solo tokens" contains "$(gen)" "$solo_text"
idle=0
for _ in $(seq 150); do
  if "$D" status --stack "$ID" --json 2>/dev/null | python3 -c '
import json, sys
e = json.load(sys.stdin)["frontend"]["engine"]
sys.exit(0 if e["open_sequences"] == 0 and e["kv_pages_free"] == e["kv_pages_total"] else 1)'; then
    idle=1
    break
  fi
  sleep 0.1
done
check "the stalled request ends and holds no KV page (within 15 s)" test "$idle" -eq 1
kill "$stalled" 2>/dev/null
wait "$stalled" 2>/dev/null

out=$("$D" stack down --stack "$ID" 2>&1)
check "down" contains "$out" "is down"
left=$(ls /dev/shm | grep -c "duet-$ID" || true)
check "no segment of the stack is left" test "$left" -eq 0
echo "$failures failed"
exit $((failures > 0))
