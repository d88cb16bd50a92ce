#!/usr/bin/env bash
# gpu_svc's narrow queue (services/gpu_svc/queue_picker.h) against its all-cores queue, through
# the stack: DUET_GPU_NARROW=off (all cores), on (every step of <= 16 tokens on PoCL's
# single-threaded driver) and auto (the default: measured per shape), in turn ROUNDS times.
# For each, N concurrent `duet generate` clients make N-token decode steps; one JSON line per
# (round, mode, model, prompt, clients) with the median TPOT and the tokens (equal across modes).
# Run it with nothing else on the machine (the clients must run at once, so no bench lock).
# env: DUET_BIN_DIR (default build/bin), ROUNDS (2), CLIENTS ("1 2 4 8 16"), GEN (150: the long prompt, 313 tokens, plus 150 fits the tiny model's 512),
#      MODELS (default models/fortune-q8_0.gguf; a llama3.2-1b Q4_0 is made with mkmodel when
#      MODELS includes "1b"), PLAN (gpu-only)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${DUET_BIN_DIR:-build/bin}
long=$(python3 -c "print(' '.join(['Once upon a time there was a fool and his money.'] * 24))")
for round in $(seq "${ROUNDS:-2}"); do
  for model in ${MODELS:-models/fortune-q8_0.gguf}; do
    gen=${GEN:-150}
    if [ "$model" = 1b ]; then
      model=build-bench/models/llama3.2-1b-q4_0-ctx2048.gguf gen=40
      [ -f "$model" ] || "$bin/duet" mkmodel --shape llama3.2-1b --type q4_0 --ctx 2048 --out "$model" >&2
      export DUET_MAX_CTX=2048
    fi
    for mode in off on auto; do
      stack="narrow-$$-$mode"
      DUET_GPU_NARROW=$mode DUET_PLAN=${PLAN:-gpu-only} "$bin/duet" stack up --stack "$stack" \
        --model "$model" --timeout 120 >/dev/null
      # A warm-up: PoCL compiles each driver's kernel variants on first use (once per machine).
      "$bin/duet" generate --stack "$stack" --max-tokens 16 --ignore-eos "A fool" >/dev/null 2>&1
      for prompt in short long; do
        text="A fool"
        [ "$prompt" = short ] || text=$long
        for n in ${CLIENTS:-1 2 4 8 16}; do
          dir=$(mktemp -d)
          for i in $(seq "$n"); do
            "$bin/duet" generate --stack "$stack" --max-tokens "$gen" --ignore-eos --json \
              "$text" >"$dir/$i.json" 2>/dev/null &
          done
          wait
          python3 - "$dir" "$round" "$mode" "$model" "$prompt" "$n" <<'EOF'
import json, os, statistics, sys
d, rnd, mode, model, prompt, n = sys.argv[1:]
runs = [json.load(open(os.path.join(d, f))) for f in sorted(os.listdir(d))]
print(json.dumps({"round": int(rnd), "mode": mode, "model": os.path.basename(model),
                  "prompt": prompt, "prompt_tokens": runs[0]["stats"]["prompt_tokens"],
                  "clients": int(n), "loadavg": open("/proc/loadavg").read().split()[0],
                  "tpot_ms_median": statistics.median(r["stats"]["tpot_ms"] for r in runs),
                  "ids_first": runs[0]["ids"][:16]}))
EOF
          rm -rf "$dir"
        done
      done
      "$bin/duet" stack down --stack "$stack" >/dev/null
    done
  done
done
