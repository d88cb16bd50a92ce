#!/usr/bin/env python3
"""Tables for bench/solver/run_measured.sh: the measured plans (strategy per op and why) and, per
model and prompt length, prefill and decode tokens/s of the solver's plan (auto) against gpu-only
and npu-only, medians over the interleaved rounds of one run."""
import json
import statistics
import sys
from collections import defaultdict


def main(path):
    plans, runs, errors, statuses = [], defaultdict(list), [], []
    for line in open(path):
        line = line.strip()
        if not line:
            continue
        d = json.loads(line)
        if d.get("kind") == "plan":
            plans.append(d)
        elif d.get("kind") == "run":
            runs[(d["model_name"], d["prompt_tokens"], d["plan"])].append(d)
        elif d.get("kind") == "error":
            errors.append(d)
        elif d.get("kind") == "status":
            statuses.append(d)

    print("## Measured plans (duet plan --timing measured --json)\n")
    print("| model | phase, tokens | op | strategy | ratio | chosen us | why |")
    print("|---|---|---|---|---|---|---|")
    for p in plans:
        for r in p["rows"]:
            print(f"| {p['model_name']} | {p['phase']} {p['n_tokens']} | {r['weight']} | "
                  f"{r['strategy']} | {r['ratio']} | {r['chosen_us']:.0f} | {r['why']} |")
    print()
    print("| model | phase, tokens | plan total us | best single device | its total us | profile "
          "(contention) |")
    print("|---|---|---|---|---|---|")
    for p in plans:
        b = p.get("best_single_device", {})
        prof = p.get("profile", {})
        print(f"| {p['model_name']} | {p['phase']} {p['n_tokens']} | {p['total_us']:.0f} | "
              f"{b.get('name', '-')} | {b.get('total_us', 0):.0f} | {prof.get('entries', 0)} ops, "
              f"{prof.get('profiling_s', 0):.1f} s ({prof.get('contention', 0):.2f}) |")

    print("\n## End to end through the stack (medians over rounds; tokens/s)\n")
    print("| model | prompt | auto prefill | gpu-only | npu-only | auto / best single | "
          "auto decode | gpu-only | npu-only | auto / best single | rounds |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    keys = sorted({(m, p) for (m, p, _) in runs})
    for m, p in keys:
        med = {}
        for plan in ("auto", "gpu-only", "npu-only"):
            rs = runs.get((m, p, plan), [])
            med[plan] = (statistics.median([r["prefill_tok_s"] for r in rs]) if rs else 0,
                         statistics.median([r["decode_tok_s"] for r in rs]) if rs else 0, len(rs))
        best_pf = max(med["gpu-only"][0], med["npu-only"][0])
        best_dc = max(med["gpu-only"][1], med["npu-only"][1])
        print(f"| {m} | {p} | {med['auto'][0]:.1f} | {med['gpu-only'][0]:.1f} | "
              f"{med['npu-only'][0]:.1f} | {med['auto'][0] / best_pf if best_pf else 0:.2f}x | "
              f"{med['auto'][1]:.1f} | {med['gpu-only'][1]:.1f} | {med['npu-only'][1]:.1f} | "
              f"{med['auto'][1] / best_dc if best_dc else 0:.2f}x | {med['auto'][2]} |")

    if statuses:
        print("\n## The auto stacks' plan sources (frontend status)\n")
        for st in statuses:
            print(f"- {st['model_name']}: solver_fallback={st.get('solver_fallback')}, "
                  f"plan_sources={json.dumps(st.get('plan_sources'))}")
    if errors:
        print("\n## Failed runs\n")
        for e in errors:
            print(f"- {e['model_name']} {e['plan']} prompt {e['prompt']} round {e['round']}: "
                  f"{e['error'][:200]}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/solver/measured.jsonl")

