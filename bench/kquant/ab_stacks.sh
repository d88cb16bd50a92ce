#!/bin/bash
# Two gpu_svc builds A/B on one host whose read rate moves within minutes: both stacks up at once,
# requests alternating arm by arm (same minute), decode tok/s at contexts 64 and 512 (32 tokens).
# ARMS="old:DIR new:build/bin" (DIR: hard-linked copies of an older build/bin; the supervisor finds
# its services beside its own binary), N rounds, M model.
#   ARMS="old:/tmp/oldbin new:build/bin" N=8 bash bench/kquant/ab_stacks.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
# Both stacks go down however the script ends.
trap 'for arm in $ARMS; do "${arm#*:}/duet" stack down --stack ab2${arm%%:*} >/dev/null 2>&1; done' EXIT
M=${M:-build-bench/models/llama3.2-1b-q4_k_m-llama3.gguf}
for arm in $ARMS; do name=${arm%%:*}; bin=${arm#*:}
  $bin/duet stack up --stack ab2$name --model $M --plan gpu-only --timeout 300 >/dev/null 2>&1 || echo "up failed $name"
  for w in 54 296 512; do $bin/stack_bench --stack ab2$name --plan gpu-only --model $M --prompt $w --gen 4 --prompt-salt 1 --ignore-eos >/dev/null 2>&1; done
done
for i in $(seq ${N:-4}); do
  line="$i"
  for p in 64 512; do
    for arm in $ARMS; do name=${arm%%:*}; bin=${arm#*:}
      r=$($bin/stack_bench --stack ab2$name --plan gpu-only --model $M --prompt $p --prompt-salt $((p+7+100*i)) --gen 32 --ignore-eos 2>/dev/null | tail -1 | python3 -c "import json,sys; r=json.load(sys.stdin); print('%.1f'%r['decode_tok_s'])")
      line="$line $name/$p=$r"
    done
  done
  echo "$line"
done
