#!/usr/bin/env bash
# Load sweep of agent_bench --mode stack (issue 9): for each compress factor and seed, one
# agent_bench run = an FCFS stack run then an Agent stack run of the same trace, so runs go FCFS,
# Agent, FCFS, Agent ... and machine drift hits both sides alike. Each run holds
# /work/helpers/bench.lock (one bench at a time on the shared machine) and is released between
# runs. One JSON object per line (the run's --compress/--seed/--rider-slack and agent_bench's
# output) is appended to OUT; summarize with bench/agent/summarize_sweep.py OUT.
#
#   bench/agent/sweep.sh OUT "10 20 30 45 60" "1 2 3" [rider-slack|default] [build dir] \
#       [carry on|off|default] [preempt on|off|default]
# AGENT_BENCH_EXTRA: more agent_bench options for every run (e.g. "--overlap all
# --proactive-plan npu-only"); DUET_PLAN: the stacks' plan (both sides); DUET_GPU_NARROW: gpu_svc's
# narrow queue (both sides; recorded as gpu_narrow); SWEEP_REQUESTS: the
# trace's length (default 40; longer traces vary less from run to run). All are recorded per run
# ("extra", "plan", "requests") and summarize_sweep.py groups by them.
set -euo pipefail
out=${1:?usage: sweep.sh OUT "COMPRESS..." "SEEDS..." [rider-slack|default] [build dir]}
compresses=${2:?compress factors}
seeds=${3:?seeds}
slack=${4:-default}
build=${5:-build-agent}
carry=${6:-default}
preempt=${7:-default}
lock=${AGENT_BENCH_LOCK:-/work/helpers/bench.lock}
bench="$build/bin/agent_bench"
[[ -x $bench ]] || { echo "sweep.sh: no $bench (build agent_bench first)" >&2; exit 2; }
slack_arg=()
[[ $slack == default ]] || slack_arg=(--rider-slack "$slack")
[[ $carry == default ]] || slack_arg+=(--carry "$carry")
[[ $preempt == default ]] || slack_arg+=(--preempt "$preempt")
extra=${AGENT_BENCH_EXTRA:-}
requests=${SWEEP_REQUESTS:-40}
read -r -a extra_args <<< "$extra"
slack_arg+=("${extra_args[@]}")
for c in $compresses; do
  for s in $seeds; do
    started=$(date -u +%H:%M:%S)
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    if ! json=$(flock "$lock" "$bench" --mode stack --requests "$requests" --compress "$c" --seed "$s" \
                  --duet "$build/bin/duet" "${slack_arg[@]}" 2>/tmp/sweep_err.$$); then
      echo "sweep.sh: compress $c seed $s failed: $(tail -3 /tmp/sweep_err.$$)" >&2
      rm -f /tmp/sweep_err.$$
      continue
    fi
    rm -f /tmp/sweep_err.$$
    python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d["run"]={"compress":float(sys.argv[2]),"seed":int(sys.argv[3]),"rider_slack":sys.argv[4],"carry":sys.argv[7],"preempt":sys.argv[8],"started_utc":sys.argv[5],"load_before":sys.argv[6],"load_after":open("/proc/loadavg").read().split()[:3],"extra":sys.argv[9],"plan":sys.argv[10],"requests":int(sys.argv[11]),"gpu_narrow":sys.argv[12]}; print(json.dumps(d))' \
      "$json" "$c" "$s" "$slack" "$started" "$load" "$carry" "$preempt" "$extra" "${DUET_PLAN:-auto}" "$requests" "${DUET_GPU_NARROW:-auto}" >> "$out"
    echo "sweep.sh: compress $c seed $s slack $slack carry $carry preempt $preempt $extra plan ${DUET_PLAN:-auto} done ($started, load $load)" >&2
  done
done
