#!/usr/bin/env bash
# TTFT with and without a shared prompt prefix (issue 20 item 4), through a real stack:
#   bench/prefix/ttft.sh [--model M] [--prefix-words N] [--rounds R] [--stack ID]
# Each round makes a fresh prefix of N words (~2.7 tokens each: 750 words ~ 2k tokens), sends
# prefix + "question A" (computes it all, publishes its blocks), then prefix + "question B" (borrows
# the prefix, computes only its tail), and prints one JSON line per round: both TTFTs, their
# ratio, prompt tokens and the blocks the stack reports as shared. Default model: tiny-llama3's
# shape with 8192 positions (made with duet mkmodel into a temp dir). Stops its stack at the end.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
duet="$root/build/bin/duet"
model="" words=750 rounds=3 stack="prefix20_bench$$"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --prefix-words) words=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --stack) stack=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
tmp=$(mktemp -d)
trap '"$duet" stack down --stack "$stack" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
if [[ -z "$model" ]]; then
  model="$tmp/long-ctx.gguf"
  "$duet" mkmodel --shape tiny-llama3 --type f16 --ctx 8192 --out "$model" >/dev/null
fi
"$duet" stack up --stack "$stack" --model "$model" --kv-memory 256M >/dev/null
"$duet" generate --stack "$stack" --max-tokens 2 --json hello >/dev/null  # builds the engine

gen() {  # prompt file -> JSON
  "$duet" generate --stack "$stack" --max-tokens 8 --ignore-eos --json "$(cat "$1")"
}
for r in $(seq "$rounds"); do
  python3 - "$words" "$r" > "$tmp/prefix" <<'PY'
import sys
w = ["alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "music", "paper", "light"]
n, salt = int(sys.argv[1]), int(sys.argv[2])
print(" ".join(w[(i * 7 + i // 10 + salt * 3) % 10] for i in range(n)), end=" ")
PY
  { cat "$tmp/prefix"; echo "question one"; } > "$tmp/a"
  { cat "$tmp/prefix"; echo "question two"; } > "$tmp/b"
  gen "$tmp/a" > "$tmp/a.json"
  gen "$tmp/b" > "$tmp/b.json"
  "$duet" status --stack "$stack" --json > "$tmp/status.json"
  python3 - "$tmp/a.json" "$tmp/b.json" "$tmp/status.json" "$r" <<'PY'
import json, sys
a, b, st = (json.load(open(p)) for p in sys.argv[1:4])
e = st["frontend"]["engine"]
print(json.dumps({"round": int(sys.argv[4]), "prompt_tokens": b["stats"]["prompt_tokens"],
                  "ttft_first_ms": a["stats"]["ttft_ms"], "ttft_shared_ms": b["stats"]["ttft_ms"],
                  "ratio": round(b["stats"]["ttft_ms"] / a["stats"]["ttft_ms"], 4),
                  "hit_tokens_total": e["kv_prefix"]["hit_tokens"],
                  "pages_cached": e["kv_pages_cached"], "pages_used": e["kv_pages_used"]}))
PY
done
