#!/usr/bin/env python3
"""Tables of bench/modeled/run_host_check.sh's JSONL: modelled / measured per plan and phase.

Measured: the stack's TTFT (prefill) and TPOT (decode), median over the rounds (min-max), and the
same requests' steps as the frontend timed them (`duet trace`: prefill step; decode steps' mean,
as TPOT is a mean). Modelled: the step on this host's fitted profile (core/planner/timeline.h)
plus the frontend's time per step (around the devices' spans, and between two steps), both
measured in the traces; against the traced step the time between steps is left out. Host stalls:
what the host's other tenants took from the same request's steps (host_stalls.py).
"""
import json
import statistics
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
fit = next(r for r in rows if r["kind"] == "fit")
print(f"fit: GPU {fit['gpu_points']} points, rms log {fit['gpu_rms_log']:.3f}, worst "
      f"{fit['gpu_worst_ratio']:.2f}x; NPU {fit['npu_points']} points, rms log "
      f"{fit['npu_rms_log']:.3f}, worst {fit['npu_worst_ratio']:.2f}x; GPU non-matmul kernels "
      f"{fit.get('gpu_other_points', 0)} step points, rms log {fit.get('gpu_other_rms_log', 0):.3f}, "
      f"worst {fit.get('gpu_other_worst_ratio', 1):.2f}x")
print(f"per step: frontend around the devices {fit['handoff_us']:.0f} us, between steps "
      f"{fit.get('between_steps_us', 0):.0f} us; hand-off per flag wait "
      f"{fit.get('fast_sync_us', 0):.0f} us; gap per op: GPU {fit.get('gpu_op_gap_us', 0):.1f} us "
      f"+ {fit.get('gpu_op_gap_us_per_token', 0):.3f} us a token, NPU "
      f"{fit.get('npu_op_gap_us', 0):.1f} us + {fit.get('npu_op_gap_us_per_token', 0):.3f} us a "
      f"token; frontend around the devices by kind of step: "
      + ", ".join(f"{k} {v:.0f} us" for k, v in sorted(fit.get("frontend_us", {}).items())))
for r in rows:
    if r["kind"] == "plan":
        print(f"tensor plan, {r['phase']}: {r['strategies']}")
runs = [r for r in rows if r["kind"] == "run"]
steps = [r for r in rows if r["kind"] == "steps"]
loads = [r["load"] for r in runs]
print(f"\n{len(runs)} runs, load average {min(loads):.1f}-{max(loads):.1f}")
pre = sorted({(r.get("prefill_tokens"), r.get("prefill_context")) for r in steps})
print(f"traced prefill steps (tokens, context): {pre}\n")
stalls = [r for r in rows if r["kind"] == "stalls"]
print("| plan | phase | measured ms (median, min-max) | traced step ms | modelled ms | "
      "ratio to measured | ratio to traced step | host stalls ms (median) | "
      "ratio to measured less stalls | timeline on the step-measured op times ms |")
print("|---|---|---|---|---|---|---|---|---|---|")
for plan in [p for p in ("gpu-only", "npu-only", "auto", "tensor", "layer")
             if any(r["kind"] == "model" and r["plan"] == p for r in rows)]:
    for phase, key in (("prefill", "ttft_ms"), ("decode", "tpot_ms")):
        meas = [r[key] for r in runs if r["plan"] == plan]
        m = next(r for r in rows if r["kind"] == "model" and r["plan"] == plan and r["phase"] == phase)
        med = statistics.median(meas)
        traced = [r[f"step_{phase}_ms"] for r in steps if r["plan"] == plan and r[f"step_{phase}_ms"] > 0]
        tmed = statistics.median(traced) if traced else 0
        pipe = m["pipelined_us"] / 1e3
        step_only = pipe - m.get("between_steps_us", 0) / 1e3
        prof = m.get("profiled_us", 0) / 1e3
        # Per round: measured less that request's stalls (host_stalls.py), then the median.
        stall_of = {r["round"]: r[f"{phase}_stall_ms"] for r in stalls if r["plan"] == plan}
        less = [r[key] - stall_of.get(r["round"], 0) for r in runs if r["plan"] == plan]
        smed = statistics.median(stall_of.values()) if stall_of else 0
        lmed = statistics.median(less)
        name = {"auto": "auto (this host's plan)", "tensor": "tensor (the SoC's plan)"}.get(plan, plan)
        print(f"| {name} | {phase} | {med:.2f} ({min(meas):.2f}-{max(meas):.2f}) | {tmed:.2f} | "
              f"{pipe:.2f} | {pipe / med:.2f} | {step_only / tmed if tmed else 0:.2f} | "
              f"{smed:.2f} | {pipe / lmed:.2f} | {prof:.2f} |")
