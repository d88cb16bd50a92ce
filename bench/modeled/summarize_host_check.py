#!/usr/bin/env python3
"""Tables of bench/modeled/run_host_check.sh's JSONL: modelled / measured step time per plan."""
import json
import statistics
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
fit = next(r for r in rows if r["kind"] == "fit")
print(f"fit: GPU {fit['gpu_points']} points, rms log {fit['gpu_rms_log']:.3f}, worst "
      f"{fit['gpu_worst_ratio']:.2f}x; NPU {fit['npu_points']} points, rms log "
      f"{fit['npu_rms_log']:.3f}, worst {fit['npu_worst_ratio']:.2f}x; contention "
      f"{fit['contention']:.2f}; handoff {fit['handoff_us']:.0f} us")
for r in rows:
    if r["kind"] == "plan":
        print(f"tensor plan, {r['phase']}: {r['strategies']}")
runs = [r for r in rows if r["kind"] == "run"]
loads = [r["load"] for r in runs]
print(f"\n{len(runs)} runs, load average {min(loads):.1f}-{max(loads):.1f}\n")
print("| plan | phase | measured ms (median, min-max) | modelled pipelined ms | ratio | "
      "modelled isolated ms | ratio | timeline on measured op times ms | ratio |")
print("|---|---|---|---|---|---|---|---|---|")
for plan in ("gpu-only", "npu-only", "auto"):
    for phase, key in (("prefill", "ttft_ms"), ("decode", "tpot_ms")):
        meas = [r[key] for r in runs if r["plan"] == plan]
        m = next(r for r in rows if r["kind"] == "model" and r["plan"] == plan and r["phase"] == phase)
        med = statistics.median(meas)
        pipe, iso = m["pipelined_us"] / 1e3, m["isolated_us"] / 1e3
        prof = m.get("profiled_us", 0) / 1e3
        name = "tensor (auto)" if plan == "auto" else plan
        print(f"| {name} | {phase} | {med:.2f} ({min(meas):.2f}-{max(meas):.2f}) | {pipe:.2f} | "
              f"{pipe / med:.2f} | {iso:.2f} | {iso / med:.2f} | {prof:.2f} | {prof / med:.2f} |")
# The same requests' steps as the frontend timed them (duet trace): the step alone, without the
# time between steps that TTFT/TPOT also hold.
steps = [r for r in rows if r["kind"] == "steps"]
if steps:
    print("\n| plan | phase | traced step ms (median, min-max) | modelled pipelined ms | ratio |")
    print("|---|---|---|---|---|")
    for plan in ("gpu-only", "npu-only", "auto"):
        for phase in ("prefill", "decode"):
            meas = [r[f"step_{phase}_ms"] for r in steps if r["plan"] == plan and r[f"step_{phase}_ms"] > 0]
            if not meas:
                continue
            m = next(r for r in rows if r["kind"] == "model" and r["plan"] == plan and r["phase"] == phase)
            med = statistics.median(meas)
            pipe = m["pipelined_us"] / 1e3
            name = "tensor (auto)" if plan == "auto" else plan
            print(f"| {name} | {phase} | {med:.2f} ({min(meas):.2f}-{max(meas):.2f}) | {pipe:.2f} | "
                  f"{pipe / med:.2f} |")
