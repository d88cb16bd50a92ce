#!/usr/bin/env python3
"""bench/kquant/results.jsonl -> one table row per type and prompt: duet / llama.cpp tok/s, and
decode as a share of the run's bandwidth limit (read GB/s / weight bytes per token), where the
run measured it (read_bandwidth_bench lines)."""
import json
import sys

path = sys.argv[1] if len(sys.argv) > 1 else "bench/kquant/results.jsonl"
rows = [json.loads(line) for line in open(path)]
by, limit = {}, {}
for r in rows:
    key = (r["type"], r.get("vocab", "small"), r["round"])
    if r["engine"] == "bandwidth":
        b = r["result"]
        limit[key] = b["read_gbps"] * 1e9 / b["weight_bytes_per_token"]
        continue
    by.setdefault(key + (r["prompt"],), {})[r["engine"]] = r
print("| type | vocab | round | prompt | prefill tok/s duet / llama.cpp | decode tok/s duet / llama.cpp "
      "| decode share of the bandwidth limit duet / llama.cpp | load |")
print("|---|---|---|---|---|---|---|---|")
for (t, vocab, rnd, p), v in sorted(by.items()):
    if "duet" not in v or "llama.cpp" not in v:
        continue
    d, l = v["duet"]["result"], v["llama.cpp"]["result"]
    cell = lambda a, b: f"{a:.1f} / {b:.1f} = **{a / b:.2f}x**"
    lim = limit.get((t, vocab, rnd))
    share = (f"{d['decode_tok_s'] / lim:.0%} / {l['decode_tok_s'] / lim:.0%} of {lim:.1f} tok/s"
             if lim else "not measured")
    print(f"| {t} | {vocab} | {rnd} | {p} | {cell(d['prefill_tok_s'], l['prefill_tok_s'])} | "
          f"{cell(d['decode_tok_s'], l['decode_tok_s'])} | {share} | {v['duet']['loadavg']} |")
