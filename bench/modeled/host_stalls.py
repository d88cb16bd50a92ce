#!/usr/bin/env python3
"""What the host's other tenants took from traced steps (bench/modeled/run_host_check.sh).

On a shared host a step also loses time the stack's own costs do not explain: a kernel whose
worker thread was preempted, a frontend that woke late on the done flags. Such a span is far
longer than the same span's median over the run. Per trace (one request), this prints a JSON row
with the prefill step's and the decode steps' mean "stall": the sum over op spans and the
frontend's time around the devices of max(0, span - 3 x the median of its kind), where a kind is
(lane, op name without its layer, plan, the step's tokens). Flag waits are not counted (in a
two-device step they hold the other device's work), so npu-only's stall is a lower bound.
usage: host_stalls.py TRACE.json... (file names trace-<plan>-<round>.json)
"""
import collections
import json
import os
import re
import statistics
import sys

FACTOR = 3.0


def steps_of(path):
    ev = json.load(open(path))["traceEvents"]
    steps = {}
    for e in ev:
        if e.get("ph") != "X" or e.get("pid") != 1:
            continue
        a = e["args"]
        s = steps.setdefault(a.get("step"), {"ops": [], "dev": 0.0})
        if e["cat"] == "step" and e["tid"] == 1:
            s["fe"], s["tokens"], s["plan"] = e["dur"], a["tokens"], a.get("plan", "")
        elif e["cat"] == "step":
            s["dev"] = max(s["dev"], e["dur"])
        elif e["cat"] == "op":
            s["ops"].append((e["tid"], re.sub(r" L\d+$", "", e["name"]), e["dur"]))
    return [s for s in steps.values() if "fe" in s]


def main(paths):
    traces = {p: steps_of(p) for p in paths}
    kinds = collections.defaultdict(list)
    for steps in traces.values():
        for s in steps:
            for tid, name, dur in s["ops"]:
                kinds[(tid, name, s["plan"], s["tokens"])].append(dur)
            kinds[("frontend", s["plan"], s["tokens"])].append(s["fe"] - s["dev"])
    med = {k: statistics.median(v) for k, v in kinds.items()}
    for path, steps in traces.items():
        m = re.match(r"trace-(.+)-(\d+)\.json$", os.path.basename(path))
        if not m:
            continue
        out = {"kind": "stalls", "plan": m.group(1), "round": int(m.group(2))}
        per_phase = collections.defaultdict(list)
        for s in steps:
            phase = "prefill" if s["tokens"] > 1 else "decode"
            n = s["tokens"]
            stall = sum(max(0.0, d - FACTOR * med[(t, op, s["plan"], n)]) for t, op, d in s["ops"])
            around = s["fe"] - s["dev"]
            stall += max(0.0, around - FACTOR * med[("frontend", s["plan"], n)])
            per_phase[phase].append(stall)
        out["prefill_stall_ms"] = max(per_phase["prefill"], default=0) / 1e3
        out["decode_stall_ms"] = statistics.mean(per_phase["decode"]) / 1e3 if per_phase["decode"] else 0
        print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
