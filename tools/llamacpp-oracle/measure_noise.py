#!/usr/bin/env python3
"""How far llama.cpp's logits are from the exact forward pass of the same file: the tolerance
that duet's comparisons against llama.cpp may use.

For each tiny-fortune variant (f16, q8_0, q4_0) and each teacher-forced sequence of
tests/data/tiny-fortune/teacher-forced/<variant>.json (a float64 forward pass over the file's
dequantised weights, checked against HF transformers to 1e-5), asks llama.cpp (oracle.mjs logits,
all 2048 logits) for the same ids, and reports:
  max_abs_diff  the largest |llama.cpp logit - exact logit| over every position and token
  max_abs_diff_centered  the same after subtracting each row's mean (a shift of every logit by
                one constant changes no probability)
  flips         positions where llama.cpp's top-1 differs from the exact top-1
  max_flip_margin  the largest exact top-1 margin (top1 - top2) among the flips: top-1 agrees
                wherever the margin exceeds it
  mean_kl, max_kl  KL(llama.cpp || exact) of the softmax distributions, nats, over positions
With --duet BIN, the same numbers for llama.cpp against duet's reference forward pass
(`duet eval`, fp32) on the same ids: the `vs_duet` entry of each variant.
usage: python3 measure_noise.py [--duet BIN] [OUT.json]   (after npm ci in tools/llamacpp-oracle)

K-quants (issue 19): python3 measure_noise.py --kquant --duet BIN [OUT.json]. There is no float64
reference for a K file, so each fortune-f16.gguf -> `duet quantize --type q4_k_m|q5_k_m|q6_k` file
is compared with llama.cpp on its own F32 expansion (`duet quantize K.gguf --type f32`: exactly
the same weights, which llama.cpp multiplies in F32 without quantising the activations, so the
difference is the K path's activation quantisation (Q8_K) plus F16-KV noise that both share):
the same statistics, per type, on the same six teacher-forced sequences, and `vs_duet` (duet's
reference forward on the K file against llama.cpp on it).
"""

import json
import math
import os
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FORTUNE = os.path.join(ROOT, "tests", "data", "tiny-fortune")
N_VOCAB = 2048


def exact_rows(variant):
    with open(os.path.join(FORTUNE, "teacher-forced", f"{variant}.json")) as f:
        meta = json.load(f)
    with open(os.path.join(FORTUNE, "teacher-forced", f"{variant}.logits.f32"), "rb") as f:
        raw = f.read()
    rows, off = [], 0
    for seq in meta["sequences"]:
        n = len(seq["ids"])
        flat = struct.unpack_from(f"<{n * N_VOCAB}f", raw, off * N_VOCAB * 4)
        rows.append([flat[i * N_VOCAB:(i + 1) * N_VOCAB] for i in range(n)])
        off += n
    return meta["sequences"], rows


def llamacpp_rows(model, ids):
    with tempfile.TemporaryDirectory() as tmp:
        ids_file, out = os.path.join(tmp, "ids.json"), os.path.join(tmp, "out.json")
        with open(ids_file, "w") as f:
            json.dump(ids, f)
        subprocess.run(["node", "oracle.mjs", "logits", "--model", model, "--ids-file", ids_file,
                        "--top", str(N_VOCAB), "--out", out], check=True,
                       cwd=os.path.dirname(os.path.abspath(__file__)))
        with open(out) as f:
            res = json.load(f)
    rows = []
    for p in res["positions"]:
        row = [0.0] * N_VOCAB
        for i, v in zip(p["top_ids"], p["top_logits"]):
            row[i] = v
        rows.append(row)
    return rows


def duet_rows(duet, model, ids):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "logits.f32")
        subprocess.run([duet, "eval", "--model", model, "--ids", " ".join(map(str, ids)),
                        "--logits-out", out], check=True, stdout=subprocess.DEVNULL)
        with open(out, "rb") as f:
            raw = f.read()
    flat = struct.unpack(f"<{len(raw) // 4}f", raw)
    return [flat[i * N_VOCAB:(i + 1) * N_VOCAB] for i in range(len(ids))]


def top2(row):
    a = max(range(len(row)), key=lambda i: row[i])
    b = max((row[i] for i in range(len(row)) if i != a))
    return a, row[a] - b


def kl(p_logits, q_logits):
    """KL(P || Q) of the softmax distributions of two logit rows, in nats"""
    mp, mq = max(p_logits), max(q_logits)
    lp = mp + math.log(sum(math.exp(x - mp) for x in p_logits))
    lq = mq + math.log(sum(math.exp(x - mq) for x in q_logits))
    return sum(math.exp(a - lp) * ((a - lp) - (b - lq)) for a, b in zip(p_logits, q_logits))


def compare(pairs):
    """pairs: (text, pos, reference row, llama.cpp row) -> the statistics of the docstring, and
    mean_kl: the mean over positions of KL(llama.cpp || reference)"""
    kls = [kl(lc, ex) for _, _, ex, lc in pairs]
    worst = worst_c = 0.0
    flips, max_flip_margin, positions = [], 0.0, 0
    min_margin = float("inf")
    for text, pos, ex, lc in pairs:
        positions += 1
        d = [a - b for a, b in zip(lc, ex)]
        mean = sum(d) / len(d)
        worst = max(worst, max(abs(x) for x in d))
        worst_c = max(worst_c, max(abs(x - mean) for x in d))
        ea, em = top2(ex)
        la, _ = top2(lc)
        min_margin = min(min_margin, em)
        if ea != la:
            flips.append({"text": text, "pos": pos, "exact_top1": ea, "llamacpp_top1": la,
                          "exact_margin": em})
            max_flip_margin = max(max_flip_margin, em)
    return {"positions": positions, "max_abs_diff": worst, "max_abs_diff_centered": worst_c,
            "flips": flips, "max_flip_margin": max_flip_margin, "min_exact_margin": min_margin,
            "mean_kl": sum(kls) / len(kls), "max_kl": max(kls)}


def measure(variant, duet):
    seqs, exact = exact_rows(variant)
    model = os.path.join(FORTUNE, f"fortune-{variant}.gguf")
    vs_exact, vs_duet = [], []
    for seq, ex_rows in zip(seqs, exact):
        lc_rows = llamacpp_rows(model, seq["ids"])
        du_rows = duet_rows(duet, model, seq["ids"]) if duet else []
        for pos, (ex, lc) in enumerate(zip(ex_rows, lc_rows)):
            vs_exact.append((seq["text"], pos, ex, lc))
            if duet:
                vs_duet.append((seq["text"], pos, du_rows[pos], lc))
    out = {"variant": variant, **compare(vs_exact)}
    if duet:
        out["vs_duet"] = compare(vs_duet)
    return out


def measure_kquant(typ, duet, tmp):
    seqs, _ = exact_rows("f16")
    kfile = os.path.join(tmp, f"fortune-{typ}.gguf")
    f32 = os.path.join(tmp, f"fortune-{typ}-f32.gguf")
    subprocess.run([duet, "quantize", os.path.join(FORTUNE, "fortune-f16.gguf"), kfile, "--type",
                    typ], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([duet, "quantize", kfile, f32, "--type", "f32"], check=True,
                   stdout=subprocess.DEVNULL)
    vs_exact, vs_duet = [], []
    for seq in seqs:
        ex_rows = llamacpp_rows(f32, seq["ids"])
        lc_rows = llamacpp_rows(kfile, seq["ids"])
        du_rows = duet_rows(duet, kfile, seq["ids"])
        for pos, (ex, lc) in enumerate(zip(ex_rows, lc_rows)):
            vs_exact.append((seq["text"], pos, ex, lc))
            vs_duet.append((seq["text"], pos, du_rows[pos], lc))
    scale = max(max(abs(x) for x in ex) for _, _, ex, _ in vs_exact)
    return {"variant": typ, "logit_scale": scale, **compare(vs_exact),
            "vs_duet": compare(vs_duet)}


def main_kquant(argv):
    duet = os.path.abspath(argv[argv.index("--duet") + 1])
    rest = [a for i, a in enumerate(argv) if a not in ("--kquant", "--duet") and
            (i == 0 or argv[i - 1] != "--duet")]
    with tempfile.TemporaryDirectory() as tmp:
        out = [measure_kquant(t, duet, tmp) for t in ("q4_k_m", "q5_k_m", "q6_k")]
    text = json.dumps({"about": "llama.cpp on duet-quantized K files of tiny-fortune vs llama.cpp "
                                "on their exact F32 expansions; made by measure_noise.py --kquant",
                       "results": out}, indent=1)
    if rest:
        with open(rest[0], "w") as f:
            f.write(text + "\n")
    print(text)


def main():
    argv = sys.argv[1:]
    if "--kquant" in argv:
        return main_kquant(argv)
    duet = None
    if argv[:1] == ["--duet"]:
        duet, argv = os.path.abspath(argv[1]), argv[2:]
    sys.argv = [sys.argv[0]] + argv
    out = [measure(v, duet) for v in ("f16", "q8_0", "q4_0")]
    text = json.dumps({"about": "llama.cpp (oracle.mjs logits) vs the exact float64 forward "
                                "pass of tiny-fortune; made by measure_noise.py",
                       "results": out}, indent=1)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
