#!/usr/bin/env bash
# Stack overhead with repeats: ROUNDS alternations of the same generation through a running stack
# and with all roles in one process (stack_bench), so that the machine's load (2 shared cores)
# hits both modes alike; prints every run as JSON, then the medians, their ratio and the
# frontend's per-step phase profile (ProgramEngine status "phase_ms": where a step's wall time
# goes beside the device's own time).
# usage: bench/stack/overhead.sh [PLAN] [MODEL] [PROMPT] [GEN] [ROUNDS]
# env: DUET_BIN_DIR (default build-bench/bin). Appends to bench/stack/overhead.jsonl.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${DUET_BIN_DIR:-build-bench/bin}
plan=${1:-gpu-only}
model=${2:-tests/data/tiny-fortune/fortune-q8_0.gguf}
prompt=${3:-54}
gen=${4:-64}
rounds=${5:-5}
out=bench/stack/overhead.jsonl
stack="ovh$$"
export DUET_MAX_CTX=512
trap '"$bin/duet" stack down --stack "$stack" >/dev/null 2>&1 || true' EXIT
"$bin/duet" stack up --stack "$stack" --model "$model" --plan "$plan" --timeout 60 >/dev/null
"$bin/stack_bench" --stack "$stack" --plan "$plan" --model "$model" --prompt 64 --gen 2 >/dev/null
before=$("$bin/duet" status --stack "$stack" --json)
load0=$(cut -d' ' -f1-3 /proc/loadavg)
runs=()
for ((i = 0; i < rounds; ++i)); do
  runs+=("$("$bin/stack_bench" --stack "$stack" --plan "$plan" --model "$model" --prompt "$prompt" --gen "$gen" --ignore-eos)")
  runs+=("$("$bin/stack_bench" --in-process --plan "$plan" --model "$model" --max-ctx 512 --prompt "$prompt" --gen "$gen" --ignore-eos)")
done
after=$("$bin/duet" status --stack "$stack" --json)
load1=$(cut -d' ' -f1-3 /proc/loadavg)
printf '%s\n' "${runs[@]}" | python3 -c '
import json, statistics, sys
before, after, load0, load1, model = sys.argv[1:6]
runs = [json.loads(l) for l in sys.stdin if l.strip()]
def med(mode, key):
    return statistics.median(r[key] for r in runs if r["mode"] == mode)
e0, e1 = json.loads(before)["frontend"]["engine"], json.loads(after)["frontend"]["engine"]
steps = e1["steps"] - e0["steps"]
phases = {k: round((e1["phase_ms"][k] - e0["phase_ms"][k]) * 1000 / max(steps, 1), 1)
          for k in e1["phase_ms"]}
s = {"plan": runs[0]["plan"], "model": model, "rounds": len(runs) // 2,
     "prompt_tokens": runs[0]["prompt_tokens"], "generated_tokens": runs[0]["generated_tokens"],
     "stack_decode_tok_s": med("stack", "decode_tok_s"),
     "in_process_decode_tok_s": med("in-process", "decode_tok_s"),
     "stack_prefill_tok_s": med("stack", "prefill_tok_s"),
     "in_process_prefill_tok_s": med("in-process", "prefill_tok_s"),
     "stack_step_phase_us": phases, "stack_steps": steps,
     "loadavg_start": load0, "loadavg_end": load1}
s["decode_ratio"] = s["stack_decode_tok_s"] / s["in_process_decode_tok_s"]
s["prefill_ratio"] = s["stack_prefill_tok_s"] / s["in_process_prefill_tok_s"]
for r in runs: print(json.dumps(r))
print(json.dumps(s))
' "$before" "$after" "$load0" "$load1" "$model" | tee -a "$out"
