#!/usr/bin/env bash
# Records bench/figures/data/trace_tensor.json: `duet trace` of one real request through a stack
# running the tensor plan (tiny-fortune, a 200-token prompt, 4 new tokens), for layer_gantt.
# Keeps the prefill step's events only (the figure's), so the committed file stays small.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-build/bin}
ID=figtrace-$$
OUT=bench/figures/data/trace_tensor.json
TMP=$(mktemp /tmp/duet-figtrace-XXXXXX.json)
trap '"$BIN/duet" stack down --stack "$ID" >/dev/null 2>&1 || true; rm -f "$TMP"' EXIT
"$BIN/duet" stack up --stack "$ID" --plan tensor --timeout 120 >/dev/null
PROMPT=$(python3 -c 'print(" ".join(["the river and the stone"] * 40))')
"$BIN/duet" generate --stack "$ID" --max-tokens 4 --ignore-eos --json "$PROMPT" >/dev/null
"$BIN/duet" trace --stack "$ID" --last --out "$TMP"
python3 - "$TMP" "$OUT" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
steps = [e for e in t["traceEvents"] if e.get("ph") == "X" and e["cat"] == "step" and e["pid"] == 1
         and e["tid"] == 1]
prefill = max(steps, key=lambda e: e["args"]["tokens"])
n = prefill["args"]["step"]
t["traceEvents"] = [e for e in t["traceEvents"] if e.get("ph") == "M" or e["args"].get("step") == n]
t["otherData"]["figure_step"] = n
t["otherData"]["figure_what"] = f"tiny-fortune prefill of {prefill['args']['tokens']} tokens"
json.dump(t, open(sys.argv[2], "w"), separators=(",", ":"))
print(f"{sys.argv[2]}: step {n}, {len(t['traceEvents'])} events")
PY
