#!/usr/bin/env bash
# Measured benchmarks of issue 7 on this machine, side by side in one run:
#   per plan, prefill and decode tokens/s through a running stack (measured and modelled on sd8gen3),
#   the same generation with all roles in one process (stack overhead), and llama.cpp
#   (bench/llamacpp, node-llama-cpp's prebuilt CPU build) on the same GGUF with the same threads.
# Writes bench/stack/results.jsonl and bench/stack/RESULTS.md.
# env: DUET_BIN_DIR (default build-bench/bin), MIXES_TINY / MIXES_1B ("prompt/gen ..."),
#      PLANS, PLANS_1B, MODELS ("tiny 1b"), APPEND=1, THREADS (default nproc), SKIP_LLAMACPP=1,
#      STOP_AT_EOS=1 (default: every run decodes exactly the mix's tokens, EOS or not, so that
#      the modes compare the same number of steps)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${DUET_BIN_DIR:-build-bench/bin}
out=bench/stack/results.jsonl
threads=${THREADS:-$(nproc)}
plans=${PLANS:-"gpu-only npu-only layer tensor reference"}
plans_1b=${PLANS_1B:-"gpu-only npu-only layer tensor"}  # reference (fp32 oracle) is too slow at 1B
# Table 4 mixes 54/374, 296/340, 1787/5, scaled to the 512-position context and to 2 shared cores.
mixes_tiny=${MIXES_TINY:-"54/32 296/32 448/4"}
mixes_1b=${MIXES_1B:-"54/8 296/8"}
# The 1B is the file people download: Q4_K_M with Llama 3's real vocabulary (TYPE_1B, VOCAB_1B;
# results before 2026-11-25 12:00 UTC were Q4_0 with the small synthetic vocabulary).
type_1b=${TYPE_1B:-q4_k_m}
vocab_1b=${VOCAB_1B:-tests/data/vocab/llama3.gguf}
model_1b=build-bench/models/llama3.2-1b-$type_1b-$(basename "$vocab_1b" .gguf).gguf
export DUET_MAX_CTX=512
[ -f "$model_1b" ] || "$bin/duet" mkmodel --shape llama3.2-1b --type "$type_1b" --vocab "$vocab_1b" \
  --ctx 512 --out "$model_1b"
if [ -z "${SKIP_LLAMACPP:-}" ] && [ ! -d bench/llamacpp/node_modules/node-llama-cpp ]; then
  bench/llamacpp/setup.sh
fi
[ -n "${APPEND:-}" ] || : > "$out"
eos_flag=--ignore-eos
[ -z "${STOP_AT_EOS:-}" ] || eos_flag=
tiny_model=models/fortune-q8_0.gguf
[ -f "$tiny_model" ] || tiny_model=tests/data/tiny-fortune/fortune-q8_0.gguf

tag() { python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d.update(json.loads(sys.argv[2])); print(json.dumps(d))' "$1" "$2"; }

bench_model() {  # name path mixes plans
  local name=$1 model=$2 mixes=$3 plans=$4 stack="bench$$-${1//./_}"
  trap '"$bin/duet" stack down --stack "'"$stack"'" >/dev/null 2>&1 || true' EXIT
  for plan in $plans; do  # a stack serves one plan (other plans only when it runs 'auto')
    "$bin/duet" stack up --stack "$stack" --model "$model" --plan "$plan" --timeout 60 >/dev/null
    # Warm-up: the plan's engine is built (programs registered, NPU graphs compiled) on first use.
    "$bin/stack_bench" --stack "$stack" --plan "$plan" --model "$model" --prompt 64 --gen 2 >/dev/null
    "$bin/stack_bench" --stack "$stack" --plan "$plan" --model "$model" --prompt 8 --gen 2 >/dev/null
    for mix in $mixes; do
      local p=${mix%/*} g=${mix#*/} ctxj="{\"model_name\":\"$name\",\"mix\":\"$mix\"}"
      # A run that fails (a step past its deadline on the loaded machine, say) is reported and
      # skipped: the other rows of the run still count.
      if r=$("$bin/stack_bench" --stack "$stack" --plan "$plan" --model "$model" --prompt "$p" --gen "$g" $eos_flag); then
        tag "$r" "$ctxj" >> "$out"
      else echo "note: stack run $name $mix $plan failed" >&2; fi
      case $plan in gpu-only | npu-only | layer)
        if r=$("$bin/stack_bench" --in-process --plan "$plan" --model "$model" --max-ctx 512 --prompt "$p" --gen "$g" $eos_flag); then
          tag "$r" "$ctxj" >> "$out"
        else echo "note: in-process run $name $mix $plan failed" >&2; fi ;;
      esac
      tail -n 1 "$out" >&2
    done
    "$bin/duet" stack down --stack "$stack" >/dev/null 2>&1 || echo "note: stack $stack ($plan) was already down" >&2
  done
  trap - EXIT
  if [ -z "${SKIP_LLAMACPP:-}" ]; then
    for mix in $mixes; do
      local p=${mix%/*} g=${mix#*/}
      tag "$(node bench/llamacpp/llamacpp_bench.mjs "$model" "$p" "$g" "$threads" 512)" \
        "{\"model_name\":\"$name\",\"mix\":\"$mix\",\"plan\":\"llama.cpp\"}" >> "$out"
      tail -n 1 "$out" >&2
    done
  fi
}

models=${MODELS:-"tiny 1b"}  # which models to run (APPEND=1 keeps earlier results)
[[ " $models " == *" tiny "* ]] && bench_model tiny-fortune "$tiny_model" "$mixes_tiny" "$plans"
[[ " $models " == *" 1b "* ]] && bench_model llama3.2-1b-q4_0 "$model_1b" "$mixes_1b" "$plans_1b"
# The tables are regenerated; the file's hand-written sections (readings of earlier runs) stay.
python3 bench/stack/summarize.py "$out" bench/stack/RESULTS.md > bench/stack/RESULTS.md.new
mv bench/stack/RESULTS.md.new bench/stack/RESULTS.md
cat bench/stack/RESULTS.md
