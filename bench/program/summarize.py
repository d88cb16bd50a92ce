#!/usr/bin/env python3
"""RESULTS.md's table from bench/program/results.jsonl (bench/program/run.sh): per model and
plan, per-bucket programs (before) against symbolic ones (after), and whether the generated ids
are equal."""
import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
by = {(r["model"], r["plan"], r["mode"]): r for r in rows}
print("| model | plan | programs | register calls | build + register ms | arena MB "
      "| PoCL binaries compiled | NPU graphs | decode ms/token | ids equal |")
print("|---|---|---|---|---|---|---|---|---|---|")
for (model, plan, mode), r in by.items():
    if mode != "per-bucket":
        continue
    s = by.get((model, plan, "symbolic"))
    if not s:
        continue

    def pair(key, fmt="{}"):
        return f"{fmt.format(r[key])} -> {fmt.format(s[key])}"

    kc = (f"{r.get('pocl_binaries_compiled', '-')} -> {s.get('pocl_binaries_compiled', '-')}")
    ms = f"{r['build_ms'] + r['register_ms']:.0f} -> {s['build_ms'] + s['register_ms']:.0f}"
    # Before: the named-slot layout per-bucket programs had (arena_bytes_named_slots).
    mb = f"{r['arena_bytes_named_slots'] / 1e6:.2f} -> {s['arena_bytes'] / 1e6:.2f}"
    print(f"| {model} | {plan} | {pair('programs')} | {pair('register_calls')} | {ms} | {mb} "
          f"| {kc} | {pair('npu_graphs')} | {pair('decode_ms_per_token', '{:.2f}')} "
          f"| {'yes' if r['ids'] == s['ids'] else 'NO'} |")
