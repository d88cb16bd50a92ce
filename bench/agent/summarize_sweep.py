#!/usr/bin/env python3
"""Medians of a bench/agent/sweep.sh output (one JSON object per line), per (rider slack,
compress): FCFS and Agent reactive mean, floor, reduction, best possible reduction, proactive
throughput ratio, FCFS busy fraction (the fraction of the trace the FCFS stack was stepping),
offered tokens per second against what the stack served while busy, and the spread (min-max)
of each. Prints a markdown table; --runs also prints one row per run."""
import json
import statistics
import sys
from collections import defaultdict


def load(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            for line in f:
                line = line.strip()
                if line:
                    rows.append(json.loads(line))
    return rows


def metrics(d):
    s = d["stack"]
    f, a, c = s["fcfs"], s["agent"], s["compare"]
    return {
        "fcfs_mean": f["reactive_mean_ms"],
        "agent_mean": a["reactive_mean_ms"],
        "floor": c["reactive_isolated_mean_ms"],
        "reduction": c["reactive_mean_reduction_pct"],
        "best": c["best_possible_reduction_pct"],
        "pro_ratio": c["proactive_throughput_ratio"],
        "fcfs_busy": f.get("busy_fraction", 0.0),
        "agent_busy": a.get("busy_fraction", 0.0),
        "offered": s.get("offered", {}).get("all_tokens_per_s", 0.0),
        "offered_pro": s.get("offered", {}).get("proactive_tokens_per_s", 0.0),
        "fcfs_serves": f.get("busy_tokens_per_s", 0.0),
        "agent_serves": a.get("busy_tokens_per_s", 0.0),
        "fcfs_tps": f["proactive_tokens_per_s"],
        "agent_tps": a["proactive_tokens_per_s"],
        "shared": a["agent_status"].get("shared_tokens", 0),
        "refused": a["agent_status"].get("slack_refused", 0),
        "met": c["target_met"],
    }


def key_of(d):
    r = d["run"]
    key = r["rider_slack"]
    for knob in ("carry", "preempt"):
        if r.get(knob, "default") != "default":
            key += f" {knob} {r[knob]}"
    if r.get("extra"):
        key += " " + r["extra"]
    if r.get("plan", "auto") != "auto":
        key += f" plan {r['plan']}"
    if r.get("requests", 40) != 40:
        key += f" requests {r['requests']}"
    if r.get("gpu_narrow", "auto") != "auto":
        key += f" narrow {r['gpu_narrow']}"
    return (key, r["compress"])


def fmt(vals, digits=0):
    med = statistics.median(vals)
    if len(vals) == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} ({min(vals):.{digits}f}..{max(vals):.{digits}f})"


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    rows = load(args)
    groups = defaultdict(list)
    for d in rows:
        r = d["run"]
        groups[key_of(d)].append((r, metrics(d)))
    print("| slack | compress | runs | offered tok/s (pro) | FCFS busy | FCFS serves tok/s | "
          "FCFS mean | Agent mean | floor | reduction % | best possible % | pro ratio | "
          "shared tok | slack-refused | target met |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (slack, comp), runs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        m = [x[1] for x in runs]
        col = lambda k: [x[k] for x in m]
        print(f"| {slack} | {comp:g} | {len(m)} | {fmt(col('offered'))} ({fmt(col('offered_pro'))}) | "
              f"{fmt(col('fcfs_busy'), 2)} | {fmt(col('fcfs_serves'))} | {fmt(col('fcfs_mean'))} | "
              f"{fmt(col('agent_mean'))} | {fmt(col('floor'))} | {fmt(col('reduction'))} | "
              f"{fmt(col('best'))} | {fmt(col('pro_ratio'), 3)} | {fmt(col('shared'))} | "
              f"{fmt(col('refused'))} | {sum(1 for x in m if x['met'])}/{len(m)} |")
    if "--time" in sys.argv:
        # Where the Agent frontend's time went while proactive work waited (proactive_time.h),
        # medians in ms; FCFS's makespan to the last proactive Done beside it.
        keys = ["pending", "proactive_lane", "main_proactive", "main_shared", "main_reactive_only",
                "no_step", "gated_prefill", "decoders_held", "parked", "overlapped"]
        print()
        print("| config | compress | runs | FCFS last pro (s) | Agent last pro (s) | " +
              " | ".join(keys) + " |")
        print("|---|---|---|---|---|" + "---|" * len(keys))
        for (slack, comp), runs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            ds = [d for d in rows if key_of(d) == (slack, comp)]
            ts = [d["stack"]["agent"].get("proactive_time_ms") for d in ds]
            ts = [t for t in ts if t]
            if not ts:
                continue
            fl = [d["stack"]["fcfs"]["proactive_last_done_s"] for d in ds]
            al = [d["stack"]["agent"]["proactive_last_done_s"] for d in ds]
            print(f"| {slack} | {comp:g} | {len(ts)} | {fmt(fl, 2)} | {fmt(al, 2)} | " +
                  " | ".join(fmt([t.get(k, 0.0) for t in ts]) for k in keys) + " |")
    if "--runs" in sys.argv:
        print()
        print("| slack | compress | seed | start (UTC) | load | FCFS busy | FCFS mean | Agent mean | "
              "floor | reduction % | best % | pro ratio | FCFS / Agent pro tok/s | shared | refused |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for (slack, comp), runs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            for r, x in sorted(runs, key=lambda t: t[0]["seed"]):
                print(f"| {slack} | {comp:g} | {r['seed']} | {r['started_utc']} | {r['load_before']} | "
                      f"{x['fcfs_busy']:.2f} | {x['fcfs_mean']:.0f} | {x['agent_mean']:.0f} | "
                      f"{x['floor']:.0f} | {x['reduction']:.0f} | {x['best']:.0f} | "
                      f"{x['pro_ratio']:.3f} | {x['fcfs_tps']:.1f} / {x['agent_tps']:.1f} | "
                      f"{x['shared']} | {x['refused']} |")


if __name__ == "__main__":
    main()
