#!/usr/bin/python3
"""The bench figures (issue 23 item 3), each drawn from JSON the benches already wrote.

    python3 bench/figures/figures.py [--out bench/figures]

Writes <name>.png and <name>.svg for:
  prefill_lengths   prefill tok/s against prompt length per plan: the paper's misaligned-length
                    figure on the modelled sd8gen3 (64..1024, 525 marked; bench/modeled), beside
                    the measured stack here (llama3.2-1b Q4_0, bench/stack/results.jsonl)
  decode_plans      decode tok/s per model and plan on the modelled sd8gen3 beside the paper's
                    bars, and measured here beside the stack's modelled numbers (bench/stack)
  layer_gantt       GPU/NPU Gantt of one tensor-plan layer: modelled llama3-8b prefill 256
                    (bench/modeled's trace) and a real request's layer from `duet trace`, measured
                    here beside its modelled SoC timeline (bench/figures/data/trace_tensor.json)
  agent_cdf         Agent.xpu reactive latency CDF against FCFS, measured through the stack
                    (bench/agent/results/2026-11-23-judged-40req.jsonl)
Plotting needs python3-matplotlib (bench/figures/make_figures.sh installs it); nothing at run
time does.
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAN_COLORS = {
    "tensor": "#1b7837",
    "gpu-only": "#2166ac",
    "npu-only": "#b2182b",
    "npu-pipe": "#ef8a62",
    "online-prepare": "#762a83",
    "layer": "#8c8c8c",
    "auto": "#1b7837",
}
plt.rcParams.update({"font.size": 8, "svg.fonttype": "none", "axes.spines.top": False,
                     "axes.spines.right": False})


def load_json(path):
    with open(os.path.join(ROOT, path)) as f:
        return json.load(f)


def load_jsonl(path):
    with open(os.path.join(ROOT, path)) as f:
        return [json.loads(line) for line in f if line.strip()]


def save(fig, out, name):
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(out, f"{name}.{ext}"), dpi=110, bbox_inches="tight")
    plt.close(fig)
    print(f"wrote {name}.png, {name}.svg")


def prefill_lengths(out):
    modeled = load_json("bench/modeled/results/modeled_sd8gen3.json")
    shape = next(s for s in modeled["shapes"] if s["shape"] == "llama3-8b")
    series = {}
    for r in shape["prefill"] + shape["misaligned_sweep"]:
        # npu-only in the misaligned sweep is the padding mode (one graph padded up).
        name = r["plan"]
        series.setdefault(name, {})[r["n_tokens"]] = r["tok_s"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9.5, 3.4), gridspec_kw={"width_ratios": [1.6, 1]})
    for name in ("tensor", "gpu-only", "layer", "npu-pipe", "online-prepare", "npu-only"):
        if name not in series:
            continue
        xs = sorted(series[name])
        label = "npu-only (padding)" if name == "npu-only" else name
        a.plot(xs, [series[name][x] for x in xs], marker="o", ms=3, lw=1.3,
               color=PLAN_COLORS[name], label=label)
    a.axvline(525, color="k", ls=":", lw=1)
    sp = shape["tensor_speedup_at_525"]
    paper = shape["paper_tensor_speedup_at_525"]
    a.text(0.02, 0.98,
           "at 525 tokens (dotted), tensor over\n" + "\n".join(
               f"  {k}: {sp[k]:.2f}x (paper {paper[k]:.2f}x)"
               for k in ("online-prepare", "npu-only", "npu-pipe")),
           transform=a.transAxes, va="top", fontsize=7,
           bbox={"facecolor": "white", "edgecolor": "#cccccc", "pad": 3})
    a.set_ylim(0, max(v for ser in series.values() for v in ser.values()) * 1.35)
    a.set_xscale("log", base=2)
    a.set_xticks([64, 128, 256, 525, 1024])
    a.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    a.set_xlabel("prompt length (tokens)")
    a.set_ylabel("prefill tok/s")
    a.set_title(f"modelled {modeled['soc']}: llama3-8b {modeled['weights']} (bench/modeled)")
    a.legend(fontsize=7, loc="lower right", ncol=2)

    rows = [r for r in load_jsonl("bench/stack/results.jsonl")
            if r.get("model_name") == "llama3.2-1b-q4_0" and r.get("mode") == "stack"]
    for plan in ("gpu-only", "tensor", "layer", "npu-only"):
        pts = sorted((r["prompt_tokens"], r["prefill_tok_s"], r["modeled_prefill_tok_s"])
                     for r in rows if r["plan"] == plan)
        if not pts:
            continue
        xs = [p[0] for p in pts]
        b.plot(xs, [p[1] for p in pts], marker="o", ms=3, color=PLAN_COLORS[plan],
               label=f"{plan} measured")
        b.plot(xs, [p[2] for p in pts], marker="x", ms=4, ls="--", lw=0.9,
               color=PLAN_COLORS[plan], alpha=0.7)
    b.plot([], [], "k--x", lw=0.9, label="dashed: the same runs, modelled on sd8gen3")
    b.set_yscale("log")
    b.set_xlabel("prompt length (tokens)")
    b.set_ylabel("prefill tok/s")
    b.set_title("measured here: llama3.2-1b Q4_0 through the stack")
    b.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    save(fig, out, "prefill_lengths")


def decode_plans(out):
    modeled = load_json("bench/modeled/results/modeled_sd8gen3.json")
    plans = ["gpu-only", "npu-only", "layer", "tensor"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9.5, 3.2), gridspec_kw={"width_ratios": [1.5, 1]})
    shapes = modeled["shapes"]
    width = 0.16
    for i, s in enumerate(shapes):
        tok = {r["plan"]: r["tok_s"] for r in s["decode"]}
        for j, p in enumerate(plans):
            a.bar(i + (j - 2) * width, tok.get(p, 0), width, color=PLAN_COLORS[p],
                  label=p if i == 0 else None)
        if s.get("paper_decode_tok_s"):
            a.bar(i + 2 * width, s["paper_decode_tok_s"], width, color="white",
                  edgecolor="k", hatch="///", label="paper (HeteroInfer)" if i == 0 else None)
            a.text(i + 2 * width, s["paper_decode_tok_s"], f"{s['paper_decode_tok_s']:.1f}",
                   ha="center", va="bottom", fontsize=6.5)
        a.text(i + width, tok.get("tensor", 0), f"{tok.get('tensor', 0):.1f}",
               ha="center", va="bottom", fontsize=6.5)
    a.set_xticks(range(len(shapes)))
    a.set_xticklabels([s["shape"] for s in shapes])
    a.set_ylabel("decode tok/s")
    a.set_title(f"modelled {modeled['soc']} (context {shapes[0]['decode_context']}) vs the paper")
    a.legend(fontsize=7)

    rows = [r for r in load_jsonl("bench/stack/results.jsonl") if r.get("mode") == "stack"]
    models = ["llama3.2-1b-q4_0", "tiny-fortune"]
    for i, m in enumerate(models):
        for j, p in enumerate(plans):
            sel = [r for r in rows if r["model_name"] == m and r["plan"] == p]
            if not sel:
                continue
            meas = sorted(r["decode_tok_s"] for r in sel)[len(sel) // 2]
            mod = sorted(r["modeled_decode_tok_s"] for r in sel)[len(sel) // 2]
            x = i + (j - 1.5) * 0.2
            b.bar(x, meas, 0.2, color=PLAN_COLORS[p], label=p if i == 0 else None)
            b.plot([x - 0.09, x + 0.09], [mod, mod], color="k", lw=1.5,
                   label="modelled sd8gen3 (same runs)" if i == 0 and j == 0 else None)
    b.set_yscale("log")
    b.set_xticks(range(len(models)))
    b.set_xticklabels(models)
    b.set_ylabel("decode tok/s (median of the mixes)")
    b.set_title("measured here through the stack (bench/stack)")
    b.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3, frameon=False)
    save(fig, out, "decode_plans")


def gantt_lane(ax, y, ops, color, t0, label_min_us):
    for name, start, end in ops:
        ax.barh(y, end - start, left=start - t0, height=0.6, color=color, edgecolor="white", lw=0.3)
        if end - start >= label_min_us:
            ax.text((start + end) / 2 - t0, y, name, ha="center", va="center", fontsize=5.5,
                    color="white", clip_on=True)


def layer_gantt(out):
    fig, (a, b, c) = plt.subplots(3, 1, figsize=(9.5, 4.8))
    # Modelled llama3-8b tensor prefill of 256 tokens, layer 1 (bench/modeled --trace).
    t = load_json("bench/modeled/results/llama3-8b_tensor_prefill256_trace.json")
    layer = 1
    lanes = {"gpu": [], "npu": []}
    for e in t["traceEvents"]:
        if e.get("ph") == "X" and e["args"].get("layer") == layer:
            lanes[e["tid"]].append((e["name"], e["ts"], e["ts"] + e["dur"]))
    t0 = min(s for ops in lanes.values() for _, s, _ in ops)
    span = max(e for ops in lanes.values() for _, _, e in ops) - t0
    gantt_lane(a, 1, lanes["gpu"], PLAN_COLORS["gpu-only"], t0, span / 25)
    gantt_lane(a, 0, lanes["npu"], PLAN_COLORS["npu-only"], t0, span / 25)
    a.set_yticks([0, 1])
    a.set_yticklabels(["NPU", "GPU"])
    a.set_title(f"modelled sd8gen3: llama3-8b tensor plan, prefill 256 tokens, layer {layer} "
                f"({span / 1000:.1f} ms; bench/modeled)")
    a.set_xlabel("us from the layer's first op")

    # A real request through the stack (`duet trace`): one layer of its prefill step, measured
    # here (gpu_svc, npu_svc lanes) and the same step's modelled SoC timeline.
    tr = load_json("bench/figures/data/trace_tensor.json")
    ev = [e for e in tr["traceEvents"] if e.get("ph") == "X"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in tr["traceEvents"]
               if e.get("ph") == "M" and e["name"] == "thread_name"}
    step = tr["otherData"].get("figure_step")
    meas = {"gpu_svc": [], "npu_svc": []}
    model = {"GPU (modelled)": [], "NPU (modelled)": []}
    for e in ev:
        if e["cat"] not in ("op", "flag_wait") or e["args"].get("step") != step:
            continue
        name = e["name"]
        lay = name.rsplit(" L", 1)
        if len(lay) != 2 or lay[1] != str(layer):
            if e["cat"] != "flag_wait":
                continue
        lane = threads[(e["pid"], e["tid"])]
        (meas if e["pid"] == 1 else model)[lane].append(
            (lay[0] if len(lay) == 2 else "wait", e["ts"], e["ts"] + e["dur"]))
    for ax, lanes_, title in ((b, meas, "measured here"), (c, model, "modelled on sd8gen3")):
        ops = [o for v in lanes_.values() for o in v if o[0] != "wait"]
        if not ops:
            continue
        t0 = min(s for _, s, _ in ops)
        t1 = max(e for _, _, e in ops)
        for y, (lane, color) in enumerate(
                zip(lanes_.keys(), (PLAN_COLORS["gpu-only"], PLAN_COLORS["npu-only"]))):
            vis = [o for o in lanes_[lane] if o[1] >= t0 and o[2] <= t1]
            gantt_lane(ax, 1 - y, [o for o in vis if o[0] != "wait"], color, t0, (t1 - t0) / 25)
            for _, s, e2 in (o for o in vis if o[0] == "wait"):
                ax.barh(1 - y, e2 - s, left=s - t0, height=0.25, color="#f4a582")
        ax.set_yticks([0, 1])
        ax.set_yticklabels(list(lanes_.keys())[::-1])
        ax.set_title(f"{title}: {tr['otherData']['executed_plan' if ax is b else 'modeled_plan']}, "
                     f"{tr['otherData'].get('figure_what', '')}, layer {layer} "
                     f"({(t1 - t0) / 1000:.2f} ms)", fontsize=7.5)
    c.set_xlabel("us from the layer's first op (orange: waiting on the other device's flags)")
    fig.tight_layout()
    save(fig, out, "layer_gantt")


def agent_cdf(out):
    rows = load_jsonl("bench/agent/results/2026-11-23-judged-40req.jsonl")
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 3.0), sharey=True)
    for ax, compress in zip(axes, (180.0, 240.0)):
        sel = [r for r in rows if r["run"]["compress"] == compress]
        for key, label, color in (("agent", "Agent.xpu", PLAN_COLORS["tensor"]),
                                  ("fcfs", "FCFS", PLAN_COLORS["npu-only"])):
            xs = sorted(x for r in sel for x in r["stack"][key]["reactive_latencies_ms"])
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            mean = sum(xs) / len(xs)
            ax.step(xs, ys, where="post", color=color, label=f"{label} (mean {mean:.0f} ms)")
        floor = sum(r["stack"]["compare"]["reactive_isolated_mean_ms"] for r in sel) / len(sel)
        ax.axvline(floor, color="k", ls=":", lw=1, label=f"alone on the idle stack ({floor:.0f} ms)")
        busy = sorted(r["stack"]["fcfs"]["busy_fraction"] for r in sel)[len(sel) // 2]
        ax.set_xscale("log")
        ax.set_xlabel("reactive request latency, arrival to last token (ms)")
        ax.set_title(f"trace minutes compressed {compress:.0f}x (FCFS busy {busy:.2f})",
                     fontsize=8)
        ax.legend(fontsize=7, loc="lower right")
    axes[0].set_ylabel("fraction of reactive requests")
    fig.suptitle(f"Agent.xpu vs FCFS, measured here through the stack: tiny-fortune, "
                 f"{len(sel)} seeds x 40 requests (3 reactive + 6 proactive a trace minute)",
                 fontsize=8.5)
    save(fig, out, "agent_cdf")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "figures"))
    args = ap.parse_args()
    for fn in (prefill_lengths, decode_plans, layer_gantt, agent_cdf):
        fn(args.out)


if __name__ == "__main__":
    main()
