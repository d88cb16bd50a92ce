#!/usr/bin/env bash
# Issue 23 item 4: the timeline model checked on this machine. Per plan (gpu-only, npu-only =
# duet's layer-level plan, the solver's tensor plan from measured timing), the modelled step time
# on a SoC profile fitted to this machine beside the step time measured through the real stack:
#   1. three stacks up (one per plan; a stack generates with its own plan only);
#   2. `duet plan --timing measured` gives the auto stack's tensor plans (prefill, decode);
#   3. rounds of stack_bench per plan (prompt of PROMPT tokens = one prefill step, then GEN
#      one-token decode steps; plus a SHORT-token prompt on gpu-only and npu-only), the plans
#      interleaved within each round; after each gpu-only / npu-only request `duet trace --last`
#      keeps its steps with every op's measured time;
#   4. `duet profile --from-trace` fits this machine's SoC profile (results/host-<model>.toml) to
#      the ops' times inside those real steps (core/planner/trace_profile.h), not to ops timed one
#      request at a time (which cost 4.6-5x more here: bench/modeled/RESULTS.md);
#      with the steps' own costs: each device's idle time between ops, the GPU's non-matmul
#      kernels, the hand-off per flag wait; host_stalls.py says what the host's other tenants
#      took from each request's steps;
#   5. host_check model: the same steps on host.toml's timeline (pipelined and isolated), plus
#      the frontend's time per step (around the devices' spans, and from one step's end to the
#      next one's start), as measured in the traces;
# then prints modelled / measured per plan. Writes bench/modeled/results/host_check-<model>.jsonl,
# host-<model>.toml and the profile it was fitted to (host_measured_profile-<model>.json).
# Plans: auto, gpu-only, npu-only, tensor (the SoC's plan executed here), layer.
# env: DUET_BIN_DIR (build/bin), MODEL (tiny-fortune Q8_0), ROUNDS (3), PROMPT (64), SHORT (16),
#      GEN (9), FAST_SYNC_US (0: the cross-device hand-off measured in the traced steps),
#      REPS (9: the plan's per-op profile), STACK_PREFIX (hc<pid>), KEEP_TRACES (a folder to keep
#      the `duet trace` files in; default: removed with the rest), SHARED_CORES (`duet profile
#      --shared-cores`: unset = the fit's 1, the two device processes on the same cores; 0 on a
#      machine whose gpu_svc drives a discrete GPU).
set -euo pipefail
# Per-op device times in the traces (gpu.op_timing: auto leaves them off on discrete GPUs).
export DUET_GPU_OP_TIMING=${DUET_GPU_OP_TIMING:-on}
cd "$(dirname "$0")/../.."
bin=${DUET_BIN_DIR:-build/bin}
model=${MODEL:-tests/data/tiny-fortune/fortune-q8_0.gguf}
rounds=${ROUNDS:-3}
prompt=${PROMPT:-64}
gen=${GEN:-9}
short=${SHORT:-16}
fast_sync=${FAST_SYNC_US:-0}  # 0: the hand-off the traces measured
reps=${REPS:-9}  # repetitions per profiled op (the profiler keeps the median)
name=$(basename "$model" .gguf)
out=bench/modeled/results/host_check-$name.jsonl
soc_out=bench/modeled/results/host-$name.toml
export DUET_MAX_CTX=512
# Every request repeats the same synthetic prompt: with prefix sharing on, its KV pages would be
# reused and the "prefill 64" step would compute only the last page's tokens (issue 23: the
# 2026-11-27 14:10 run's prefill steps were 16 tokens at context 48).
export DUET_KV_PREFIX=off
cache=$(mktemp -d /tmp/duet-hostcheck-XXXXXX)
# Fresh profiles and plans, but the compiled OpenCL kernels of the usual cache (keyed by the
# program's hash): a cold PoCL compile takes minutes per stack here.
cp "${DUET_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/duet}"/opencl-*.bin "$cache"/ 2>/dev/null || true
export DUET_CACHE_DIR=$cache
base=${STACK_PREFIX:-hc$$}  # stack ids: $base-auto, -gpu, -npu
# auto runs this host's measured plan (all GPU here); tensor executes the solver's plan for the
# modelled SoC (matmuls split between gpu_svc and npu_svc) and layer duet's layer-level plan: the
# two that make the devices work at once and hand off inside a step.
plans=(auto gpu-only npu-only tensor layer)
declare -A stack=([auto]="$base-auto" [gpu-only]="$base-gpu" [npu-only]="$base-npu"
  [tensor]="$base-tensor" [layer]="$base-layer")
cleanup() {
  for s in "${stack[@]}"; do "$bin/duet" stack down --stack "$s" >/dev/null 2>&1 || true; done
  if [ -n "${KEEP_TRACES:-}" ]; then mkdir -p "$KEEP_TRACES" && cp "$cache"/trace-*.json "$KEEP_TRACES"/ 2>/dev/null || true; fi
  rm -rf "$cache"
}
trap cleanup EXIT
: > "$out"
tag() { python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d.update(json.loads(sys.argv[2])); print(json.dumps(d))' "$1" "$2"; }

for plan in "${plans[@]}"; do
  timing=measured
  [ "$plan" = tensor ] && timing=modeled  # the SoC's plan, executed here
  "$bin/duet" stack up --stack "${stack[$plan]}" --model "$model" --plan "$plan" --timing "$timing" \
    --timeout 600 >/dev/null  # a fresh cache: gpu_svc compiles its kernels first
done
t0=$SECONDS
"$bin/duet" plan --model "$model" --timing measured --stack "${stack[auto]}" \
  --profile-lengths 1,16,64 --reps "$reps" --phase prefill --tokens "$prompt" --json > "$cache/plan-prefill.json"
"$bin/duet" plan --model "$model" --timing measured --stack "${stack[auto]}" \
  --profile-lengths 1,16,64 --reps "$reps" --phase decode --tokens 1 --json > "$cache/plan-decode.json"
for ph in prefill decode; do
  if [ "$ph" = prefill ]; then n=$prompt; else n=1; fi
  "$bin/duet" plan --model "$model" --timing modeled --phase "$ph" --tokens "$n" --json \
    > "$cache/plan-tensor-$ph.json"
done
echo "profiled and planned in $((SECONDS - t0)) s" >&2
cp "$cache/plan-prefill.json" "bench/modeled/results/host_plan_prefill-$name.json"
cp "$cache/plan-decode.json" "bench/modeled/results/host_plan_decode-$name.json"
for ph in prefill decode; do
  tag "$(python3 -c 'import json,sys; p=json.load(open(sys.argv[1])); p=p[0] if isinstance(p,list) else p; print(json.dumps({"strategies": {k: v["strategy"] for k, v in p["matmul"].items()}}))' "$cache/plan-$ph.json")" \
    "{\"kind\":\"plan\",\"phase\":\"$ph\"}" >> "$out"
done

# Warm-up: each engine builds its programs (and NPU graphs) on first use.
for plan in "${plans[@]}"; do
  "$bin/stack_bench" --stack "${stack[$plan]}" --plan "$plan" --model "$model" --prompt "$prompt" \
    --gen 2 --ignore-eos >/dev/null
done
traces=()
for round in $(seq "$rounds"); do
  for plan in "${plans[@]}"; do
    r=$("$bin/stack_bench" --stack "${stack[$plan]}" --plan "$plan" --model "$model" \
      --prompt "$prompt" --gen "$gen" --ignore-eos)
    tag "$r" "{\"kind\":\"run\",\"plan\":\"$plan\",\"round\":$round,\"load\":$(cut -d' ' -f1 /proc/loadavg)}" >> "$out"
    tail -n 1 "$out" >&2
    "$bin/duet" trace --stack "${stack[$plan]}" --last --out "$cache/trace-$plan-$round.json" >/dev/null
    # The same request's steps as the frontend timed them (no time between steps).
    tag "$(python3 -c 'import json,statistics,sys
ev=[e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph")=="X" and e.get("pid")==1 and e.get("tid")==1 and e.get("cat")=="step"]
pre=[e["args"] for e in ev if e["args"]["tokens"]>1]; dec=[e["args"]["measured_us"] for e in ev if e["args"]["tokens"]==1]
p=max(pre, key=lambda a: a["measured_us"]) if pre else {}
print(json.dumps({"step_prefill_ms": p.get("measured_us", 0)/1e3, "prefill_tokens": p.get("tokens", 0), "prefill_context": p.get("context", 0),
                  "step_decode_ms": statistics.mean(dec)/1e3 if dec else 0}))' "$cache/trace-$plan-$round.json")" \
      "{\"kind\":\"steps\",\"plan\":\"$plan\",\"round\":$round}" >> "$out"
    case "$plan" in auto | tensor | layer) continue ;; esac  # the fit takes unsplit plans' ops
    traces+=("$cache/trace-$plan-$round.json")
    "$bin/stack_bench" --stack "${stack[$plan]}" --plan "$plan" --model "$model" \
      --prompt "$short" --gen 2 --ignore-eos >/dev/null
    "$bin/duet" trace --stack "${stack[$plan]}" --last --out "$cache/trace-$plan-$round-short.json" >/dev/null
    traces+=("$cache/trace-$plan-$round-short.json")
  done
done

# What the host's other tenants took from each request's steps (spans far past their kind's
# median: a preempted kernel, a late wake-up), to say how much of a miss is the shared host's.
python3 bench/modeled/host_stalls.py "$cache"/trace-*.json >> "$out"

# This machine's SoC profile, fitted to the ops' times inside the steps just run.
profile="bench/modeled/results/host_measured_profile-$name.json"
"$bin/duet" profile --from-trace "$(IFS=,; echo "${traces[*]}")" --model "$model" \
  --profile-out "$profile" --out "$soc_out" --fast-sync-us "$fast_sync" \
  --report-json "$cache/fit.json" ${SHARED_CORES:+--shared-cores "$SHARED_CORES"} >&2
fit=$(cat "$cache/fit.json")
tag "$fit" '{"kind":"fit"}' >> "$out"
handoff=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["handoff_us"])' "$fit")
between=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["between_steps_us"])' "$fit")

# The same steps, modelled on this machine's profile: prefill of PROMPT tokens from an empty
# cache, decode at the middle of the generated context.
ctx=$((prompt + gen / 2))
for plan in "${plans[@]}"; do
  for ph in prefill decode; do
    if [ "$ph" = prefill ]; then n=$prompt; c=0; else n=1; c=$ctx; fi
    case "$plan" in
      auto) sel=(--plan-json "$cache/plan-$ph.json") ;;
      tensor) sel=(--plan-json "$cache/plan-tensor-$ph.json") ;;
      *) sel=(--plan "$plan") ;;
    esac
    m=$("$bin/host_check" model --soc "$soc_out" --model "$model" "${sel[@]}" --tokens "$n" \
      --context "$c" --max-tokens 64 --max-ctx 512 --step-overhead-us "$handoff" \
      --between-steps-us "$between" --frontend-json "$cache/fit.json" \
      --profile "bench/modeled/results/host_measured_profile-$name.json")
    tag "$m" "{\"kind\":\"model\",\"plan\":\"$plan\",\"phase\":\"$ph\"}" >> "$out"
  done
done
python3 bench/modeled/summarize_host_check.py "$out"
