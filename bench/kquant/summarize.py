#!/usr/bin/env python3
"""bench/kquant/results.jsonl -> one table row per type and prompt: duet / llama.cpp tok/s."""
import json
import sys

path = sys.argv[1] if len(sys.argv) > 1 else "bench/kquant/results.jsonl"
rows = [json.loads(line) for line in open(path)]
by = {}
for r in rows:
    by.setdefault((r["type"], r["round"], r["prompt"]), {})[r["engine"]] = r
print("| type | round | prompt | prefill tok/s duet / llama.cpp | decode tok/s duet / llama.cpp | load |")
print("|---|---|---|---|---|---|")
for (t, rnd, p), v in sorted(by.items()):
    if "duet" not in v or "llama.cpp" not in v:
        continue
    d, l = v["duet"]["result"], v["llama.cpp"]["result"]
    cell = lambda a, b: f"{a:.1f} / {b:.1f} = **{a / b:.2f}x**"
    print(f"| {t} | {rnd} | {p} | {cell(d['prefill_tok_s'], l['prefill_tok_s'])} | "
          f"{cell(d['decode_tok_s'], l['decode_tok_s'])} | {v['duet']['loadavg']} |")
