#!/usr/bin/env bash
# Measured mode on this machine (issue 6): is the solver's plan ever slower, end to end, than the
# best single-device plan? Per model (tiny-fortune, and a llama3.2-1b-shaped Q4_0 from mkmodel):
#   1. three stacks up at once: --plan auto --timing measured (its frontend asks solver_svc for
#      measured plans), --plan gpu-only and --plan npu-only (a stack generates with its own plan);
#   2. `duet plan --timing measured` profiles the stack's gpu_svc and npu_svc (the profile lands in
#      the cache solver_svc reads) and prints the plan per frontend bucket (decode 1, prefill 16, 64
#      and 256: the token buckets the frontend steps in) as JSON: strategy per op and why;
#   3. rounds of prefill (several prompt lengths) + decode through the real stack, the plans
#      interleaved within each round (auto, gpu-only, npu-only), so load drifts hit all alike.
# Writes bench/solver/measured.jsonl; bench/solver/summarize_measured.py makes the tables.
# env: DUET_BIN_DIR (default build-solver/bin), MODELS ("tiny 1b"), ROUNDS (3), PROMPTS_TINY,
#      PROMPTS_1B (prompt lengths), GEN_TINY / GEN_1B (decode tokens), PROFILE_LENGTHS.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${DUET_BIN_DIR:-build-solver/bin}
out=bench/solver/measured.jsonl
rounds=${ROUNDS:-3}
prompts_tiny=${PROMPTS_TINY:-"16 64 200"}
prompts_1b=${PROMPTS_1B:-"16 64 130"}
gen_tiny=${GEN_TINY:-24}
gen_1b=${GEN_1B:-6}
# The frontend asks for plans per token bucket (1, 16, 64, 256): profile those lengths.
profile_lengths=${PROFILE_LENGTHS:-"1,16,32,64,128,256"}
model_1b=build-solver/models/llama3.2-1b-q4_0.gguf
export DUET_MAX_CTX=512
cache=$(mktemp -d /tmp/duet-solver-bench-XXXXXX)
export DUET_CACHE_DIR=$cache  # a fresh profile and plan cache, shared with the stack's solver_svc
mkdir -p "$(dirname "$model_1b")"
[ -f "$model_1b" ] || "$bin/duet" mkmodel --shape llama3.2-1b --type q4_0 --ctx 512 --out "$model_1b"
: > "$out"

tag() { python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d.update(json.loads(sys.argv[2])); print(json.dumps(d))' "$1" "$2"; }

bench_model() {  # name path prompts gen
  local name=$1 model=$2 prompts=$3 gen=$4 base="sb$$-${1//./_}"
  # One stack per plan (a stack generates with its own plan only), all up at once; the idle ones
  # only answer heartbeats.
  declare -A stack=([auto]="$base-auto" [gpu-only]="$base-gpu" [npu-only]="$base-npu")
  trap 'for s in '"${stack[*]}"'; do "'"$bin"'/duet" stack down --stack "$s" >/dev/null 2>&1 || true; done; rm -rf "'"$cache"'"' EXIT
  for plan in auto gpu-only npu-only; do
    "$bin/duet" stack up --stack "${stack[$plan]}" --model "$model" --plan "$plan" --timing measured \
      --timeout 120 >/dev/null
  done
  local t0=$SECONDS
  for pt in decode/1 prefill/16 prefill/64 prefill/256; do
    local phase=${pt%/*} n=${pt#*/}
    local plan_json
    plan_json=$("$bin/duet" plan --model "$model" --timing measured --stack "${stack[auto]}" \
      --profile-lengths "$profile_lengths" --phase "$phase" --tokens "$n" --json)
    tag "$(python3 -c 'import json,sys; p=json.loads(sys.argv[1]); p=p[0] if isinstance(p,list) else p; print(json.dumps(p))' "$plan_json")" \
      "{\"kind\":\"plan\",\"model_name\":\"$name\"}" >> "$out"
  done
  echo "$name: profiled and planned in $((SECONDS - t0)) s" >&2
  # Warm-up: each engine is built (programs registered, NPU graphs compiled) on first use; auto's
  # asks solver_svc, which answers from the measured profile now in the cache.
  for plan in auto gpu-only npu-only; do
    "$bin/stack_bench" --stack "${stack[$plan]}" --plan "$plan" --model "$model" --prompt 64 --gen 2 >/dev/null
    "$bin/stack_bench" --stack "${stack[$plan]}" --plan "$plan" --model "$model" --prompt 8 --gen 2 >/dev/null
  done
  for round in $(seq "$rounds"); do
    for p in $prompts; do
      for plan in auto gpu-only npu-only; do
        local result
        # A run that fails (e.g. a device reply past its deadline on the loaded machine) is
        # recorded as an error, not dropped silently, and the next run goes on.
        if result=$("$bin/stack_bench" --stack "${stack[$plan]}" --plan "$plan" --model "$model" \
          --prompt "$p" --gen "$gen" 2>"$cache/err"); then
          tag "$result" "{\"kind\":\"run\",\"model_name\":\"$name\",\"plan\":\"$plan\",\"round\":$round}" >> "$out"
        else
          python3 -c 'import json,sys; print(json.dumps({"kind":"error","model_name":sys.argv[1],"plan":sys.argv[2],"round":int(sys.argv[3]),"prompt":int(sys.argv[4]),"error":open(sys.argv[5]).read().strip()}))' \
            "$name" "$plan" "$round" "$p" "$cache/err" >> "$out"
        fi
        tail -n 1 "$out" >&2
      done
    done
  done
  # What the auto stack's frontend says about its plans (plan_sources: solver_svc (measured)).
  "$bin/duet" status --stack "${stack[auto]}" --json > "$cache/status.json" 2>/dev/null || true
  tag "$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); e=s.get("frontend",{}).get("engine",{}); print(json.dumps({"plan_sources": e.get("plan_sources"), "solver_fallback": e.get("solver_fallback")}))' "$cache/status.json" 2>/dev/null || echo '{}')" \
    "{\"kind\":\"status\",\"model_name\":\"$name\"}" >> "$out"
  for s in "${stack[@]}"; do
    "$bin/duet" stack down --stack "$s" >/dev/null 2>&1 || echo "note: stack $s was already down" >&2
  done
  trap - EXIT
}

models=${MODELS:-"tiny 1b"}
[[ " $models " == *" tiny "* ]] && bench_model tiny-fortune models/fortune-q8_0.gguf "$prompts_tiny" "$gen_tiny"
[[ " $models " == *" 1b "* ]] && bench_model llama3.2-1b-q4_0 "$model_1b" "$prompts_1b" "$gen_1b"
rm -rf "$cache"
python3 bench/solver/summarize_measured.py "$out"
