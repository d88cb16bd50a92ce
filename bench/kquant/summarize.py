#!/usr/bin/env python3
"""bench/kquant/results.jsonl -> one table row per type, round and prompt: duet / llama.cpp tok/s,
and decode as a share of the run's bandwidth limit (read GB/s / weight bytes per token), where the
run measured it (read_bandwidth_bench lines). With PAIRS > 1 (side_by_side.sh) a row's tok/s are
the medians of its pairs and its ratio the median of the pairs' ratios, with their range."""
import json
import statistics
import sys

path = sys.argv[1] if len(sys.argv) > 1 else "bench/kquant/results.jsonl"
rows = [json.loads(line) for line in open(path)]
by, limit = {}, {}
for r in rows:
    key = (r["type"], r.get("vocab", "small"), r["round"])
    if r["engine"] == "bandwidth":  # per round, and (since PAIRS) per prompt and pair too
        b = r["result"]
        at = key + ((r["prompt"], r["pair"]) if "pair" in r else ())
        limit[at] = b["read_gbps"] * 1e9 / b["weight_bytes_per_token"]
        continue
    pairs = by.setdefault(key + (r["prompt"],), {})
    pairs.setdefault(r.get("pair", 1), {})[r["engine"]] = r["result"]


def cell(pairs, field):
    both = [p for p in pairs if "duet" in p and "llama.cpp" in p]
    a = statistics.median(p["duet"][field] for p in both)
    b = statistics.median(p["llama.cpp"][field] for p in both)
    ratios = sorted(p["duet"][field] / p["llama.cpp"][field] for p in both)
    spread = f" ({ratios[0]:.2f}-{ratios[-1]:.2f})" if len(ratios) > 1 else ""
    return f"{a:.1f} / {b:.1f} = **{statistics.median(ratios):.2f}x**{spread}", a, b


print("| type | vocab | round | prompt | pairs | prefill tok/s duet / llama.cpp | decode tok/s duet / "
      "llama.cpp | decode share of the bandwidth limit duet / llama.cpp | load |")
print("|---|---|---|---|---|---|---|---|---|")
for (t, vocab, rnd, p), by_pair in sorted(by.items()):
    pairs = [v for _, v in sorted(by_pair.items()) if "duet" in v and "llama.cpp" in v]
    if not pairs:
        continue
    prefill, _, _ = cell(pairs, "prefill_tok_s")
    decode, d, l = cell(pairs, "decode_tok_s")
    # Each pair against its own probe where it has one, else the round's.
    lims = [limit.get((t, vocab, rnd, p, k), limit.get((t, vocab, rnd))) for k in sorted(by_pair)
            if "duet" in by_pair[k] and "llama.cpp" in by_pair[k]]
    if all(lims):
        sd = statistics.median(v["duet"]["decode_tok_s"] / x for v, x in zip(pairs, lims))
        sl = statistics.median(v["llama.cpp"]["decode_tok_s"] / x for v, x in zip(pairs, lims))
        share = f"{sd:.0%} / {sl:.0%} of {statistics.median(lims):.1f} tok/s"
    else:
        share = "not measured"
    loads = sorted(float(r["loadavg"]) for r in rows if r["engine"] == "duet" and r["type"] == t
                   and r.get("vocab", "small") == vocab and r["round"] == rnd and r["prompt"] == p)
    load = f"{loads[0]:.2f}" + (f"-{loads[-1]:.2f}" if loads[-1] != loads[0] else "")
    print(f"| {t} | {vocab} | {rnd} | {p} | {len(pairs)} | {prefill} | {decode} | {share} | {load} |")
