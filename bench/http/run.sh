#!/usr/bin/env bash
# The HTTP door against the native client (issue 21): for each model, a stack with http_svc, then
# build/bin/http_bench (tokens/s streamed through HTTP vs the native C++ client, alternated round
# by round; short completions per second with 1, 8 and 32 clients through both doors).
# Appends one JSON line per model to bench/http/results.jsonl.
# env: DUET_BIN_DIR (default build/bin), MODELS ("tiny 1b"), ROUNDS (5), SECONDS_PER_POINT (5),
#      GEN_TINY (256), GEN_1B (64)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${DUET_BIN_DIR:-build/bin}
out=bench/http/results.jsonl
models=${MODELS:-"tiny 1b"}
model_1b=build/models/llama3.2-1b-q4_0.gguf
export DUET_MAX_CTX=512

run_one() {  # name model gen
  local stack="httpb$$-$1"
  trap '"$bin/duet" stack down --stack "'"$stack"'" >/dev/null 2>&1 || true' EXIT
  "$bin/duet" stack up --stack "$stack" --model "$2" --http 0 --timeout 60 >/dev/null
  local r
  r=$("$bin/http_bench" --stack "$stack" --gen "$3" --rounds "${ROUNDS:-5}" \
    --seconds "${SECONDS_PER_POINT:-5}")
  "$bin/duet" stack down --stack "$stack" >/dev/null
  trap - EXIT
  python3 -c 'import json,sys,os; d=json.loads(sys.argv[1]); d.update(model=sys.argv[2], load=os.getloadavg()[0], date=sys.argv[3]); print(json.dumps(d))' \
    "$r" "$1" "$(date -u +%FT%TZ)" | tee -a "$out"
}

for m in $models; do
  case $m in
    tiny) run_one tiny models/fortune-q8_0.gguf "${GEN_TINY:-256}" ;;
    1b)
      mkdir -p "$(dirname "$model_1b")"
      [ -f "$model_1b" ] || "$bin/duet" mkmodel --shape llama3.2-1b --type q4_0 --ctx 512 --out "$model_1b"
      run_one 1b "$model_1b" "${GEN_1B:-64}" ;;
    *) echo "unknown model '$m' (tiny, 1b)" >&2; exit 1 ;;
  esac
done
