"""Per decode step of a `duet trace` (services/frontend/frontend_trace.cpp), averaged over the
request's one-token steps: gpu_svc's step time, how many ops ran a kernel of their own (a span;
the ops a fused launch also did have none), their device time, and the gaps between them (the
step's time that no op span covers: launch waits, host work). One JSON line on stdout.

    python3 bench/kquant/fuse_trace.py TRACE.json
"""
import json
import sys


def main(path):
    events = json.load(open(path))
    events = events["traceEvents"] if isinstance(events, dict) else events
    tids = {e["args"]["name"]: (e["pid"], e.get("tid")) for e in events
            if e.get("ph") == "M" and e.get("name") == "thread_name"}
    gpu, front = tids["gpu_svc"], tids["frontend"]
    lane = lambda e, t: (e.get("pid"), e.get("tid")) == t and e.get("ph") == "X"
    decode = {e["args"]["step"] for e in events
              if lane(e, front) and e.get("cat") == "step" and e["args"].get("tokens") == 1}
    steps = {e["args"]["step"]: e for e in events
             if lane(e, gpu) and e.get("cat") == "step" and e["args"]["step"] in decode}
    ops = {}
    for e in events:
        if lane(e, gpu) and e.get("cat") == "op" and e["args"]["step"] in steps:
            ops.setdefault(e["args"]["step"], []).append(e)
    rows = []
    for number, step in steps.items():
        spans = sorted((e for e in ops.get(number, []) if e["dur"] > 0), key=lambda e: e["ts"])
        covered, end = 0.0, step["ts"]
        for e in spans:  # the union of the op spans
            start, stop = max(e["ts"], end), e["ts"] + e["dur"]
            if stop > start:
                covered += stop - start
                end = stop
        rows.append((step["dur"], len(spans), sum(e["dur"] for e in spans), step["dur"] - covered))
    n = len(rows)
    mean = lambda i: round(sum(r[i] for r in rows) / n, 1) if n else None
    print(json.dumps({"decode_steps": n, "step_us": mean(0), "ops_with_a_kernel": mean(1),
                      "op_us": mean(2), "gaps_us": mean(3)}))


if __name__ == "__main__":
    main(sys.argv[1])
