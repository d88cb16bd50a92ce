#!/usr/bin/env bash
# Stack overhead of two builds side by side (e.g. before/after a change of the step hand-off):
# one stack per build, both up at once, and per round one generation through stack A, one
# through stack B and one with all roles in one process (build B's stack_bench), so that the
# machine's load (2 shared cores) hits all three alike. Prints every run as JSON, then per build
# the median decode/prefill tok/s, the ratio to the in-process median and the frontend's
# per-step phase profile (status "phase_ms" divided by steps, as overhead.sh).
# usage: bench/stack/ab_overhead.sh BIN_A BIN_B [PLAN] [MODEL] [PROMPT] [GEN] [ROUNDS]
# Appends the summary to bench/stack/overhead.jsonl.
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ $# -ge 2 ]] || { echo "usage: $0 BIN_A BIN_B [PLAN] [MODEL] [PROMPT] [GEN] [ROUNDS]" >&2; exit 2; }
bin_a=$1
bin_b=$2
plan=${3:-gpu-only}
model=${4:-tests/data/tiny-fortune/fortune-q8_0.gguf}
prompt=${5:-54}
gen=${6:-32}
rounds=${7:-15}
for b in "$bin_a" "$bin_b"; do
  for exe in duet stack_bench; do
    [[ -x "$b/$exe" ]] || { echo "$0: $b/$exe is missing" >&2; exit 2; }
  done
done
out=bench/stack/overhead.jsonl
stack_a="aba$$"
stack_b="abb$$"
export DUET_MAX_CTX=512
trap '"$bin_a/duet" stack down --stack "$stack_a" >/dev/null 2>&1 || true
      "$bin_b/duet" stack down --stack "$stack_b" >/dev/null 2>&1 || true' EXIT
"$bin_a/duet" stack up --stack "$stack_a" --model "$model" --plan "$plan" --timeout 60 >/dev/null
"$bin_b/duet" stack up --stack "$stack_b" --model "$model" --plan "$plan" --timeout 60 >/dev/null
"$bin_a/stack_bench" --stack "$stack_a" --plan "$plan" --model "$model" --prompt 64 --gen 2 >/dev/null
"$bin_b/stack_bench" --stack "$stack_b" --plan "$plan" --model "$model" --prompt 64 --gen 2 >/dev/null
before_a=$("$bin_a/duet" status --stack "$stack_a" --json)
before_b=$("$bin_b/duet" status --stack "$stack_b" --json)
load0=$(cut -d' ' -f1-3 /proc/loadavg)
runs=()
for ((i = 0; i < rounds; ++i)); do
  # The order rotates so that no build always runs right after the in-process run.
  for k in 0 1 2; do
    case $(((i + k) % 3)) in
      0) r=$("$bin_a/stack_bench" --stack "$stack_a" --plan "$plan" --model "$model" --prompt "$prompt" --gen "$gen" --ignore-eos)
         runs+=("${r%\}}, \"build\": \"A\"}") ;;
      1) r=$("$bin_b/stack_bench" --stack "$stack_b" --plan "$plan" --model "$model" --prompt "$prompt" --gen "$gen" --ignore-eos)
         runs+=("${r%\}}, \"build\": \"B\"}") ;;
      2) r=$("$bin_b/stack_bench" --in-process --plan "$plan" --model "$model" --max-ctx 512 --prompt "$prompt" --gen "$gen" --ignore-eos)
         runs+=("${r%\}}, \"build\": \"B\"}") ;;
    esac
  done
done
after_a=$("$bin_a/duet" status --stack "$stack_a" --json)
after_b=$("$bin_b/duet" status --stack "$stack_b" --json)
load1=$(cut -d' ' -f1-3 /proc/loadavg)
printf '%s\n' "${runs[@]}" | python3 -c '
import json, statistics, sys
a0, a1, b0, b1, load0, load1, model, bin_a, bin_b = sys.argv[1:10]
runs = [json.loads(l) for l in sys.stdin if l.strip()]
def med(mode, build, key):
    return statistics.median(r[key] for r in runs if r["mode"] == mode and r["build"] == build)
def phases(s0, s1):
    e0, e1 = json.loads(s0)["frontend"]["engine"], json.loads(s1)["frontend"]["engine"]
    steps = e1["steps"] - e0["steps"]
    return {k: round((e1["phase_ms"][k] - e0["phase_ms"][k]) * 1000 / max(steps, 1), 1)
            for k in e1["phase_ms"]}, steps
inproc_dec = med("in-process", "B", "decode_tok_s")
inproc_pre = med("in-process", "B", "prefill_tok_s")
s = {"ab": True, "plan": runs[0]["plan"], "model": model, "rounds": len(runs) // 3,
     "prompt_tokens": runs[0]["prompt_tokens"], "generated_tokens": runs[0]["generated_tokens"],
     "in_process_decode_tok_s": inproc_dec, "in_process_prefill_tok_s": inproc_pre,
     "loadavg_start": load0, "loadavg_end": load1}
for build, b, (x0, x1) in (("A", bin_a, (a0, a1)), ("B", bin_b, (b0, b1))):
    ph, steps = phases(x0, x1)
    s[build] = {"bin": b, "stack_decode_tok_s": med("stack", build, "decode_tok_s"),
                "stack_prefill_tok_s": med("stack", build, "prefill_tok_s"),
                "stack_step_phase_us": ph, "stack_steps": steps}
    s[build]["decode_ratio"] = s[build]["stack_decode_tok_s"] / inproc_dec
    s[build]["prefill_ratio"] = s[build]["stack_prefill_tok_s"] / inproc_pre
for r in runs: print(json.dumps(r))
print(json.dumps(s))
' "$before_a" "$after_a" "$before_b" "$after_b" "$load0" "$load1" "$model" "$bin_a" "$bin_b" | tee -a "$out"
