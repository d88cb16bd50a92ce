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
python3 -m json.tool "$root/bench/tokenizer/results.json"
