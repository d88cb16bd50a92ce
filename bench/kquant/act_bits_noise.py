#!/usr/bin/env python3
"""What 8-bit activations cost in accuracy on a K-quant file: the stack's gpu-only plan at a given
DUET_GPU_INT8_ACT_BITS against the stack's reference plan (the exact forward pass of the same
dequantised weights), teacher-forced on tiny-fortune's held-out ids (4 windows of 256).

usage: bench/kquant/act_bits_noise.py MODEL.gguf BITS   (BITS: 8 or 16; run from the repo root,
       after `duet quantize ../shared/reference/tiny-fortune/fortune-f16.gguf MODEL --type q4_k_m`)
prints: mean and max KL(exact || duet), the largest centred logit difference, and top-1 flips
where the exact margin exceeds 0.05.
"""
import array
import json
import math
import os
import subprocess
import sys

model, bits = sys.argv[1], sys.argv[2]
root = os.path.dirname(os.path.abspath(__file__)) + "/../.."
ids = json.load(open(root + "/../shared/reference/tiny-fortune/heldout-ids.json"))["ids"]
windows = [ids[i * 256:(i + 1) * 256] for i in range(4)]
duet = root + "/build/bin/duet"
stack = "actbits%d" % os.getpid()
env = dict(os.environ, DUET_GPU_INT8_ACT_BITS=bits)
subprocess.run([duet, "stack", "up", "--stack", stack, "--model", model, "--plan", "gpu-only",
                "--no-warmup", "--timeout", "300"], env=env, check=True, capture_output=True)
kls, diffs, flips, clear = [], [], 0, 0
try:
    for w in windows:
        rows = {}
        for plan in ("reference", "gpu-only"):
            out = "/tmp/%s-%s.f32" % (stack, plan)
            subprocess.run([duet, "eval", "--stack", stack, "--plan", plan, "--ids",
                            " ".join(map(str, w)), "--logits-out", out], check=True,
                           capture_output=True)
            a = array.array("f")
            a.frombytes(open(out, "rb").read())
            os.remove(out)
            v = len(a) // len(w)
            rows[plan] = [a[i * v:(i + 1) * v] for i in range(len(w))]
        for e, d in zip(rows["reference"], rows["gpu-only"]):
            me, md = max(e), max(d)
            le = me + math.log(sum(math.exp(x - me) for x in e))
            ld = md + math.log(sum(math.exp(x - md) for x in d))
            kls.append(sum(math.exp(x - le) * ((x - le) - (y - ld)) for x, y in zip(e, d)))
            ce, cd = sum(e) / len(e), sum(d) / len(d)
            diffs.append(max(abs((x - ce) - (y - cd)) for x, y in zip(e, d)))
            top2 = sorted(e)[-2:]
            if top2[1] - top2[0] > 0.05:
                clear += 1
                flips += e.index(me) != d.index(md)
finally:
    subprocess.run([duet, "stack", "down", "--stack", stack], capture_output=True)
print("%s, %s-bit activations: mean KL(exact || duet) %.3g (max %.3g), max |centred logit diff| "
      "%.3f, top-1 flips %d of %d clear positions, %d positions"
      % (os.path.basename(model), bits, sum(kls) / len(kls), max(kls), max(diffs), flips, clear,
         len(kls)))
