#!/usr/bin/env python3
"""Turns bench/stack/results.jsonl (from run.sh) into the markdown tables of RESULTS.md."""
import json
import sys
from collections import defaultdict


def f(x, nd=1):
    return "-" if not x else f"{x:.{nd}f}"


def table(title, columns):
    """A section's heading and its table's header: column names, then the rule."""
    return [f"## {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    by = defaultdict(dict)  # (model, mix, plan) -> mode -> row
    for r in rows:
        by[(r["model_name"], r["mix"], r["plan"])][r["mode"]] = r
    out = ["# bench/stack: measured stack benchmarks (issue 7)", "",
           "Produced by `bench/stack/run.sh` (driver) with `stack_bench` (one generation through a",
           "running stack or with all roles in one process) and `bench/llamacpp/llamacpp_bench.mjs`",
           "(node-llama-cpp's prebuilt llama.cpp CPU build), all side by side in one run on the",
           "2-core machine, often shared with other engineers' builds (the load of each run is in its Reading section): absolute numbers",
           "are noisy; compare rows of one run only. Prompts are synthetic ids (BOS + cycling ids),",
           "greedy decode of exactly the mix's tokens (ignore_eos; `STOP_AT_EOS=1` stops at EOS: see the",
           "`generated` column). Table 4 mixes (54/374, 296/340,",
           "1787/5) are scaled down: tiny-fortune 54/32, 296/32, 448/4 (context 512); llama3.2-1b Q4_0",
           "(mkmodel, DUET_MAX_CTX=512) 54/8, 296/8. Decode tok/s = 1000/TPOT; prefill tok/s =",
           "prompt/TTFT. Modelled = the services' sd8gen3 timing models (0 for `reference`).", ""]
    out += table("Per plan (full stack; measured here, modelled on sd8gen3)",
                 ["model", "prompt/gen", "plan", "prefill tok/s", "decode tok/s", "generated",
                  "modelled prefill tok/s", "modelled decode tok/s"])
    for (m, mix, plan), modes in by.items():
        s = modes.get("stack")
        if s:
            out.append(f"| {m} | {mix} | {plan} | {f(s['prefill_tok_s'])} | {f(s['decode_tok_s'])} | "
                       f"{s['generated_tokens']} | {f(s['modeled_prefill_tok_s'])} | "
                       f"{f(s['modeled_decode_tok_s'])} |")
    out += [""] + table("Stack overhead (full stack / all roles in one process, same run)",
                        ["model", "prompt/gen", "plan", "stack decode", "in-process decode",
                         "decode ratio", "stack prefill", "in-process prefill", "prefill ratio"])
    for (m, mix, plan), modes in by.items():
        s, i = modes.get("stack"), modes.get("in-process")
        if s and i:
            dr = s["decode_tok_s"] / i["decode_tok_s"] if i["decode_tok_s"] else 0
            pr = s["prefill_tok_s"] / i["prefill_tok_s"] if i["prefill_tok_s"] else 0
            out.append(f"| {m} | {mix} | {plan} | {f(s['decode_tok_s'])} | {f(i['decode_tok_s'])} | "
                       f"{f(dr, 2)}x | {f(s['prefill_tok_s'])} | {f(i['prefill_tok_s'])} | {f(pr, 2)}x |")
    out += [""] + table("duet (best measured plan) / llama.cpp (node-llama-cpp CPU build), same GGUF",
                        ["model", "prompt/gen", "duet prefill (plan)", "llama.cpp prefill", "ratio",
                         "duet decode (plan)", "llama.cpp decode", "ratio"])
    for (m, mix, plan), modes in by.items():
        if plan != "llama.cpp":
            continue
        l = modes["llama.cpp"]
        stacks = [(p, md["stack"]) for (m2, mix2, p), md in by.items()
                  if m2 == m and mix2 == mix and "stack" in md]
        if not stacks:
            continue
        bp = max(stacks, key=lambda t: t[1]["prefill_tok_s"])
        bd = max(stacks, key=lambda t: t[1]["decode_tok_s"])
        pr = bp[1]["prefill_tok_s"] / l["prefill_tok_s"] if l["prefill_tok_s"] else 0
        dr = bd[1]["decode_tok_s"] / l["decode_tok_s"] if l["decode_tok_s"] else 0
        out.append(f"| {m} | {mix} | {f(bp[1]['prefill_tok_s'])} ({bp[0]}) | {f(l['prefill_tok_s'])} | "
                   f"{f(pr, 2)}x | {f(bd[1]['decode_tok_s'])} ({bd[0]}) | {f(l['decode_tok_s'])} | "
                   f"{f(dr, 2)}x |")
    return out


def kept_sections(path):
    """The hand-written sections of an earlier RESULTS.md (every "## " section whose heading is
    not one of the tables above), so that a new run does not erase the readings kept there."""
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return []
    generated = ("## Per plan", "## Stack overhead (full stack", "## duet (best measured plan)")
    kept, keep = [], False
    for line in lines:
        if line.startswith("## "):
            keep = not line.startswith(generated)
        if keep:
            kept.append(line)
    return kept


if __name__ == "__main__":
    # usage: summarize.py [results.jsonl] [earlier RESULTS.md whose other sections are kept]
    out = main(sys.argv[1] if len(sys.argv) > 1 else "bench/stack/results.jsonl")
    kept = kept_sections(sys.argv[2]) if len(sys.argv) > 2 else []
    print("\n".join(out + ([""] + kept if kept else [])))
