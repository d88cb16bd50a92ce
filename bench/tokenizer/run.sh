#!/usr/bin/env bash
# duet's tokenizer beside llama.cpp's on the same text and vocab-only GGUFs, one thread each,
# one after the other (never at the same time), writing bench/tokenizer/results.json.
# Needs: the tokenizer_bench target built (build/bin), bench/llamacpp/setup.sh run once.
# usage: bench/tokenizer/run.sh [BUILD_DIR] [REPEAT]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
repeat=${2:-5}
text=$(mktemp /tmp/duet-tokenizer-bench.XXXXXX.txt)
trap 'rm -f "$text"' EXIT
"$root/bench/tokenizer/make_text.sh" "$text" >&2
rows=()
for vocab in llama3 qwen2; do
  model=$root/tests/data/vocab/$vocab.gguf
  d=$(taskset -c 0 "$build/bin/tokenizer_bench" --model "$model" --text "$text" --repeat "$repeat")
  l=$(taskset -c 0 node "$root/bench/tokenizer/llamacpp_tokenize.mjs" "$model" "$text" "$repeat" \
      2>/dev/null | tail -1)
  echo "$vocab duet: $d" >&2
  echo "$vocab llama.cpp: $l" >&2
  rows+=("{\"vocab\": \"$vocab\", \"duet\": $d, \"llamacpp\": $l}")
done
joined=$(IFS=,; echo "${rows[*]}")
cat > "$root/bench/tokenizer/results.json" <<JSON
{"text": "bench/tokenizer/make_text.sh: Debian 12 man pages, 9 languages", "bytes": $(wc -c < "$text"),
 "machine": "$(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)", "results": [$joined]}
JSON
# Per vocab: duet / llama.cpp throughput, and whether both gave the same ids (hash of all ids).
python3 - "$root/bench/tokenizer/results.json" <<'PY'
import json, sys
path = sys.argv[1]
r = json.load(open(path))
for row in r["results"]:
    row["speedup"] = round(row["duet"]["mb_per_s"] / row["llamacpp"]["mb_per_s"], 2)
    row["same_ids"] = row["duet"]["ids_fnv1a"] == row["llamacpp"]["ids_fnv1a"] and \
        row["duet"]["tokens"] == row["llamacpp"]["tokens"]
json.dump(r, open(path, "w"), indent=1)
print(json.dumps(r, indent=1))
PY
