#!/usr/bin/env bash
# On the `run` tool's GPU machine from the repo root: two gpu_svc binaries side by side in one run
# (VARIANTS, packed beside each other by bench/gpu/prepare_device.sh with BINS="duet
# duet-supervisor frontend gpu_svc npu_svc http_svc solver_svc stack_bench <the others>"), each
# serving every model under every plan through a whole stack, rounds alternating them. Per run one
# warm-up request, then one of PROMPT tokens and GEN decode tokens (stack_bench's JSON line, with
# the binary, model and round added) into $OUT/ab.jsonl.
# env: VARIANTS ("gpu_svc_old gpu_svc"), PLANS ("gpu-only tensor"), ROUNDS (2), PROMPT (64), GEN (32),
#      MODELS ("fortune=tests/data/tiny-fortune/fortune-q8_0.gguf 1b=mkmodel:llama3.2-1b:q4_0").
set -uo pipefail
source bench/gpu/device_env.sh || exit 2
bin=$dev/bin
export DUET_SOC_DIR=$root/deploy/soc
cp "$bin/gpu_svc" "$bin/gpu_svc.packed"
status=0
for entry in ${MODELS:-fortune=tests/data/tiny-fortune/fortune-q8_0.gguf 1b=mkmodel:llama3.2-1b:q4_0}; do
  name=${entry%%=*}
  model=$(device_model "$entry") || { status=1; continue; }
  for round in $(seq "${ROUNDS:-2}"); do
    for which in ${VARIANTS:-gpu_svc_old gpu_svc}; do
      src=$bin/$which
      [ "$which" = gpu_svc ] && src=$bin/gpu_svc.packed
      cp "$src" "$bin/gpu_svc"
      for plan in ${PLANS:-gpu-only tensor}; do
        stack=ab$name
        "$bin/duet" stack up --stack "$stack" --model "$model" --plan "$plan" --timeout 300 \
          >/dev/null || { echo "stack up failed: $which $name $plan"; status=1; continue; }
        "$bin/stack_bench" --stack "$stack" --plan "$plan" --model "$model" --prompt "${PROMPT:-64}" \
          --gen 4 --prompt-salt 1 --ignore-eos >/dev/null 2>&1
        "$bin/stack_bench" --stack "$stack" --plan "$plan" --model "$model" --prompt "${PROMPT:-64}" \
          --gen "${GEN:-32}" --prompt-salt 2 --ignore-eos | tail -n 1 |
          python3 -c "import json,sys; j=json.loads(sys.stdin.read()); j.update(binary='$which', name='$name', round=$round); print(json.dumps(j))" \
            >>"$out/ab.jsonl" || status=1
        "$bin/duet" stack down --stack "$stack" >/dev/null
      done
    done
  done
done
cp "$bin/gpu_svc.packed" "$bin/gpu_svc"
python3 - "$out/ab.jsonl" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    j = json.loads(line)
    print(f"{j['name']:8} {j['plan']:9} {j['binary']:14} round {j['round']}: "
          f"TPOT {j['tpot_ms']:7.2f} ms  TTFT {j['ttft_ms']:7.2f} ms")
EOF
exit $status
