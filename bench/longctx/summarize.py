#!/usr/bin/env python3
"""bench/longctx/results.jsonl -> the markdown table of RESULTS.md: medians over rounds per
(metric, size, engine), duet / llama.cpp ratios. usage: summarize.py [FILE] [--commit HASH]"""
import json
import statistics
import sys


def main():
    args = sys.argv[1:]
    commit = None
    if "--commit" in args:
        i = args.index("--commit")
        commit = args[i + 1]
        del args[i : i + 2]
    path = args[0] if args else "bench/longctx/results.jsonl"
    rows = [json.loads(line) for line in open(path) if line.strip()]
    if commit:
        rows = [r for r in rows if r.get("commit") == commit]
    by = {}
    for r in rows:
        by.setdefault((r["metric"], r["size"], r["engine"]), []).append(r)

    def med(metric, size, engine, field):
        vals = [r["result"].get(field, 0) for r in by.get((metric, size, engine), [])]
        vals = [v for v in vals if v]
        return (statistics.median(vals), len(vals)) if vals else (None, 0)

    def ratio(a, b):
        return f"**{a / b:.2f}x**" if a and b else "-"

    print("| measure | duet | llama.cpp | duet / llama.cpp | rounds |")
    print("|---|---|---|---|---|")
    sizes = lambda m: sorted({k[1] for k in by if k[0] == m})
    for size in sizes("decode"):
        d, n = med("decode", size, "duet", "decode_tok_s")
        l, _ = med("decode", size, "llama.cpp", "decode_tok_s")
        fmt = lambda v: f"{v:.1f}" if v else "-"
        print(f"| decode tok/s at context {size} | {fmt(d)} | {fmt(l)} | {ratio(d, l)} | {n} |")
    for size in sizes("prefill"):
        d, n = med("prefill", size, "duet", "prefill_tok_s")
        l, _ = med("prefill", size, "llama.cpp", "prefill_tok_s")
        fmt = lambda v: f"{v:.1f}" if v else "-"
        print(f"| prefill tok/s, {size}-token prompt | {fmt(d)} | {fmt(l)} | {ratio(d, l)} | {n} |")
    gib = lambda v: f"{v / 2**30:.2f} GiB" if v else "-"
    for size in sizes("memory"):
        d, n = med("memory", size, "duet", "pss_bytes")
        l, _ = med("memory", size, "llama.cpp", "pss_bytes")
        # memory: lower is better, so the ratio is llama.cpp / duet as for speeds
        print(f"| memory (PSS) at context {size} | {gib(d)} | {gib(l)} | {ratio(l, d)} (llama.cpp / duet) | {n} |")
        shm, _ = med("memory", size, "duet", "shm_touched_bytes")
        rss, _ = med("memory", size, "duet", "rss_bytes")
        lrss, _ = med("memory", size, "llama.cpp", "rss_bytes")
        print(f"| (RSS summed / shm allocated) at {size} | {gib(rss)} / {gib(shm)} | {gib(lrss)} | | |")


if __name__ == "__main__":
    main()
