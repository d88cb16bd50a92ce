#!/usr/bin/env bash
# Issue 19: llama3.2-1b (mkmodel, random weights, the shape's real dims) as Q4_K_M, Q4_0 and Q8_0,
# through the full stack (`duet stack up --plan gpu-only`, stack_bench --stack) next to llama.cpp
# (bench/llamacpp, node-llama-cpp's prebuilt CPU build) on the same file and threads, in turn:
# prefill tok/s of 54- and 296-token prompts, decode tok/s after 64- and 512-token prompts.
# One JSON line per run into bench/kquant/results.jsonl.
# The model has Llama 3's real 128256-token vocabulary (tests/data/vocab/llama3.gguf), so the
# output projection is the real one (a quarter of the 1B's weights); VOCAB=0 for the small one.
# env: TYPES ("q4_k_m q4_0 q8_0"), ROUNDS (1), GEN (32), THREADS (nproc), BIN (build/bin), VOCAB,
#      PAIRS (1): duet / llama.cpp pairs per prompt, run alternately (each line carries its
#      "pair"); summarize.py takes the median of the pairs' ratios, so that one slow minute of
#      this shared host's memory bandwidth moves one pair, not the row.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${BIN:-build/bin}
threads=${THREADS:-$(nproc)}
gen=${GEN:-32}
out=bench/kquant/results.jsonl
mkdir -p build-bench/models
[ -d bench/llamacpp/node_modules/node-llama-cpp ] || bench/llamacpp/setup.sh >/dev/null
stack=kqbench$$
trap '"$bin/duet" stack down --stack $stack >/dev/null 2>&1 || true' EXIT
vocab=${VOCAB:-tests/data/vocab/llama3.gguf}
vocab_tag=$([ "$vocab" = 0 ] && echo small || basename "$vocab" .gguf)
for type in ${TYPES:-q4_k_m q4_0 q8_0}; do
  model=build-bench/models/llama3.2-1b-$type-$vocab_tag.gguf
  [ -f "$model" ] || "$bin/duet" mkmodel --shape llama3.2-1b --type "$type" --vocab "$vocab" \
    --ctx 1024 --out "$model" >&2
  for round in $(seq "${ROUNDS:-1}"); do
    # The decode limit of this machine now: read GB/s with the same threads, and the file's
    # weight bytes per token (bench/kquant/read_bandwidth.cpp).
    r=$("$bin/read_bandwidth_bench" --threads "$threads" --model "$model") &&
      echo "{\"type\":\"$type\",\"vocab\":\"$vocab_tag\",\"round\":$round,\"engine\":\"bandwidth\",\"loadavg\":\"$(cut -d' ' -f1 /proc/loadavg)\",\"result\":$r}" | tee -a "$out"
    "$bin/duet" stack up --stack $stack --model "$model" --plan gpu-only --timeout 300 >&2
    # Untimed: the first requests build the engine and let gpu_svc measure its queues per shape.
    # Another prompt salt: the stack's prefix cache would serve the timed prompts' prefill (the
    # synthetic prompts of one salt are prefixes of each other).
    for warm in 54 296 512; do
      "$bin/stack_bench" --stack $stack --plan gpu-only --model "$model" --prompt $warm --gen 4 \
        --prompt-salt 1 --ignore-eos >/dev/null 2>&1 || true
    done
    for prompt in 54 296 64 512; do
      emit() {  # engine, result JSON
        echo "{\"type\":\"$type\",\"vocab\":\"$vocab_tag\",\"round\":$round,\"pair\":$pair,\"prompt\":$prompt,\"gen\":$gen,\"engine\":\"$1\",\"loadavg\":\"$(cut -d' ' -f1 /proc/loadavg)\",\"result\":$2}" | tee -a "$out"
      }
      for pair in $(seq "${PAIRS:-1}"); do
        # The read limit again right before the pair (it moves by 2x within minutes here), so
        # that the pair's decode share compares with its own minute's bandwidth.
        r=$("$bin/read_bandwidth_bench" --threads "$threads" --model "$model") && emit bandwidth "$r"
        # A salt per prompt and pair: no timed prompt is a prefix of another.
        r=$("$bin/stack_bench" --stack $stack --plan gpu-only --model "$model" --prompt $prompt \
              --prompt-salt $((prompt + 1 + 1000 * pair)) --gen "$gen" --ignore-eos 2>/dev/null |
              tail -n 1) && emit duet "$r"
        r=$(node bench/llamacpp/llamacpp_bench.mjs "$model" $prompt "$gen" "$threads" 1024 \
              2>/dev/null | tail -n 1) && emit llama.cpp "$r"
      done
    done
    "$bin/duet" stack down --stack $stack >&2
  done
done
