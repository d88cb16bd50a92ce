#!/usr/bin/env python3
"""llama.cpp's answers on small random-weight models written by duet's mkmodel, one per
architecture x matrix type, each with a real vocabulary (tests/data/vocab/):

  tests/data/llamacpp/models.json       every model's mkmodel arguments, sha256 and size, and the
                                        fixed id sequence fed to it
  tests/data/llamacpp/logits-<name>.json   teacher-forced logits (oracle.mjs logits)
  tests/data/llamacpp/greedy-<name>.json   greedy continuations, F16 files (oracle.mjs greedy)

The model files are NOT committed: CI regenerates them with the same mkmodel arguments
(byte-identical) and checks the sha256. usage, from the repository root after
`(cd tools/llamacpp-oracle && npm ci)` and building `duet`:
  python3 tools/llamacpp-oracle/make_models.py build/bin/duet /tmp/oracle-models
"""

import hashlib
import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ORACLE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(ROOT, "tests", "data", "llamacpp")

# arch, mkmodel shape, vocab file (repository-relative)
ARCHS = [("llama", "tiny-llama3", "tests/data/vocab/llama3.gguf"),
         ("qwen2", "tiny-qwen2", "tests/data/vocab/qwen2.gguf"),
         ("internlm2", "tiny-internlm2", "tests/data/vocab/spm-internlm2.gguf")]
TYPES = ["f16", "q8_0", "q4_0"]
# std 0.08 (not mkmodel's default 0.02): logits large enough (top-1 margins ~0.1-1) that rope
# pairing, llama3's rope_freqs and qwen2's biases move them far beyond llama.cpp's noise
STD = "0.08"
TEXT = "The quick brown fox jumps over the lazy dog; 12345 foxes. 你好"
N_IDS = 320        # teacher-forced length: RoPE (and llama3's rope_freqs) at large positions
N_POSITIONS = 16   # the last N_POSITIONS positions' logits are written
N_GREEDY = 16


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def node(*args):
    subprocess.run(["node", "oracle.mjs", *args], check=True, cwd=ORACLE)


def fixed_ids(vocab, tmp):
    """BOS (where the vocab adds it) + llama.cpp's tokens of TEXT repeated, N_IDS ids."""
    corpus = os.path.join(tmp, "one.json")
    with open(corpus, "w") as f:
        json.dump({"strings": [{"text": TEXT}]}, f)
    out = os.path.join(tmp, "one-out.json")
    node("tokenize", "--model", os.path.join(ROOT, vocab), "--corpus", corpus, "--out", out)
    with open(out) as f:
        r = json.load(f)
    text_ids = r["strings"][0]["plain"]
    ids = [r["bos"]] if r["add_bos"] else []
    while len(ids) < N_IDS:
        ids += text_ids
    return ids[:N_IDS]


def main():
    duet, tmp = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    os.makedirs(tmp, exist_ok=True)
    models = []
    for arch, shape, vocab in ARCHS:
        ids = fixed_ids(vocab, tmp)
        for typ in TYPES:
            name = f"{arch}-{typ}"
            args = ["--shape", shape, "--arch", arch, "--vocab", vocab, "--type", typ,
                    "--std", STD]
            path = os.path.join(tmp, name + ".gguf")
            subprocess.run([duet, "mkmodel", *args, "--out", path], check=True, cwd=ROOT,
                           stdout=subprocess.DEVNULL)
            models.append({"name": name, "arch": arch, "type": typ, "vocab": vocab,
                           "mkmodel_args": args, "file": name + ".gguf",
                           "command": "duet mkmodel " + " ".join(args) + f" --out {name}.gguf",
                           "sha256": sha256(path), "size": os.path.getsize(path), "ids": ids})
            node("logits", "--model", path, "--ids", ",".join(map(str, ids)),
                 "--keep-last", str(N_POSITIONS), "--out", os.path.join(DATA, f"logits-{name}.json"))
            if typ == "f16":
                node("greedy", "--model", path, "--prompt-ids", ",".join(map(str, ids[:N_POSITIONS])),
                     "--n", str(N_GREEDY), "--out", os.path.join(DATA, f"greedy-{name}.json"))
    doc = {"about": "small random-weight models from `duet mkmodel` (run from the repository "
                    "root; --out any path) and the ids llama.cpp was fed; made by "
                    "tools/llamacpp-oracle/make_models.py. The files are not committed: "
                    "regenerate them with the same arguments (byte-identical).",
           "text": TEXT, "models": models}
    with open(os.path.join(DATA, "models.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
