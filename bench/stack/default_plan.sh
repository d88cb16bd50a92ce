#!/usr/bin/env bash
# Issue 23 item 5: what a new user gets from the default plan. Three stacks of one model side by
# side: the default (auto: the solver's plan for this host, measured, executed; the solver's plan
# for the SoC modelled), `--plan gpu-only`, and the old default (`--timing modeled`: auto
# executing the SoC's plan). Rounds interleave the three, so load drifts hit all alike.
#
#   bench/stack/default_plan.sh [results.jsonl]      # env: MODEL, ROUNDS (3), TOKENS (16)
#
# The auto stack first waits until its frontend serves the solver's measured plans (solver_svc
# profiles this host once per model, cached on disk; until then the buckets run gpu-only).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-build/bin}
MODEL=${MODEL:-build-bench/llama3.2-1b-q4_0.gguf}
ROUNDS=${ROUNDS:-3}
TOKENS=${TOKENS:-16}
OUT=${1:-bench/stack/default_plan.jsonl}
base=dp$$
declare -A args=([auto]="" [gpu-only]="--plan gpu-only" [auto-modeled]="--timing modeled")
declare -A id=([auto]="$base-auto" [gpu-only]="$base-gpu" [auto-modeled]="$base-mod")
order=(auto gpu-only auto-modeled)
cleanup() { for k in "${order[@]}"; do "$BIN/duet" stack down --stack "${id[$k]}" >/dev/null 2>&1 || true; done; }
trap cleanup EXIT
for k in "${order[@]}"; do
  # shellcheck disable=SC2086
  "$BIN/duet" stack up --stack "${id[$k]}" --model "$MODEL" --kv-memory 512M --timeout 180 ${args[$k]} >/dev/null
done
PROMPT="Once upon a time there was a little robot who lived in a lighthouse by the sea and"
gen() {  # stack, tokens
  timeout 300 "$BIN/duet" generate --stack "$1" --max-tokens "$2" --ignore-eos --json "$PROMPT" 2>/dev/null | tail -1
}
for k in "${order[@]}"; do gen "${id[$k]}" 4 >/dev/null; done   # build the engines
# The auto stack: until every bucket's plan came from solver_svc (measured).
deadline=$((SECONDS + 600))
while :; do
  st=$("$BIN/duet" status --stack "${id[auto]}" --json)
  if echo "$st" | /usr/bin/python3 -c '
import json, sys
e = json.load(sys.stdin)["frontend"]["engine"]
src = e.get("plan_sources", {})
sys.exit(0 if src and all(v.startswith("solver_svc (measured)") for v in src.values()) else 1)'; then
    break
  fi
  [ $SECONDS -lt $deadline ] || { echo "auto never got measured plans" >&2; exit 1; }
  sleep 3
  gen "${id[auto]}" 1 >/dev/null   # an idle, old fallback engine is rebuilt by the next request
done
started=$(date -u +%H:%M:%S)
for r in $(seq 1 "$ROUNDS"); do
  for k in "${order[@]}"; do
    j=$(gen "${id[$k]}" "$TOKENS")
    echo "{\"round\": $r, \"stack\": \"$k\", \"model\": \"$MODEL\", \"load\": \"$(cut -d' ' -f1-3 /proc/loadavg)\", \"started_utc\": \"$started\", \"result\": $j}" >> "$OUT"
  done
done
# The auto stack's buckets: what ran and what the SoC was modelled running.
"$BIN/duet" status --stack "${id[auto]}" --json | /usr/bin/python3 -c '
import json, sys
f = json.load(sys.stdin)["frontend"]
print(json.dumps({"stack": "auto-status", "executed_plan": f["executed_plan"], "modeled_plan": f["modeled_plan"],
                  "buckets": f["engine"]["buckets"]}))' >> "$OUT"
/usr/bin/python3 - "$OUT" "$started" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if r.get("started_utc") == sys.argv[2]]
for k in ("auto", "gpu-only", "auto-modeled"):
    s = [r["result"]["stats"] for r in rows if r["stack"] == k]
    med = lambda key: statistics.median(x[key] for x in s)
    print(f"{k:13s} TPOT {med('tpot_ms'):7.2f} ms  TTFT {med('ttft_ms'):8.1f} ms  modelled TPOT {med('modeled_tpot_ms'):6.2f} ms"
          f"  executed: {s[-1]['executed_plan']}  modelled: {s[-1]['modeled_plan']}")
PY
