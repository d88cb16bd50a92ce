#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) into build-fuzz/ and runs each for a
# bounded time over its corpus in fuzz/corpus/<target>/. Fails on any crash, leak or sanitizer
# report. New inputs go to a scratch dir, never into the repo (`--merge` folds them in by hand).
#   deploy/fuzz.sh [seconds per target, default 20]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
jobs=${DUET_JOBS:-$(nproc)}
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DDUET_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j "$jobs" --target fuzz_gguf fuzz_tokenizer fuzz_messages
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=0
for t in gguf tokenizer messages; do
  mkdir -p "$scratch/$t"
  echo "fuzz_$t: ${secs}s"
  if ! build-fuzz/bin/fuzz_$t -max_total_time="$secs" -rss_limit_mb=4096 -max_len=65536 \
      -print_final_stats=1 -artifact_prefix="$scratch/" "$scratch/$t" "fuzz/corpus/$t" \
      >"$scratch/$t.log" 2>&1; then
    echo "fuzz_$t FAILED:"; tail -60 "$scratch/$t.log"; failed=1
    # The artifact dies with the scratch dir: print it, so a CI log is enough to reproduce it
    # (xxd -r -p turns the hex back into the input).
    for a in "$scratch"/crash-* "$scratch"/leak-* "$scratch"/timeout-* "$scratch"/oom-*; do
      [[ -f $a && $(stat -c %s "$a") -le 65536 ]] || continue
      echo "$(basename "$a") as hex:"; od -An -v -tx1 "$a" | tr -d ' \n' | fold -w 128; echo
    done
  else
    grep -E "stat::number_of_executed_units|Done" "$scratch/$t.log" | tail -2
  fi
done
exit $failed
