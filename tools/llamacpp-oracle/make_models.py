#!/usr/bin/env python3
"""llama.cpp's answers on small random-weight models written by duet's mkmodel, one per
architecture x matrix type, each with a real vocabulary (tests/data/vocab/):

  tests/data/llamacpp/models.json       every model's mkmodel arguments, sha256 and size, and the
                                        fixed id sequence fed to it
  tests/data/llamacpp/logits-<name>.json   teacher-forced logits (oracle.mjs logits)
  tests/data/llamacpp/greedy-<name>.json   greedy continuations, F16 files (oracle.mjs greedy)

K-quant files (issue 19): `duet quantize` of an F16 source into q4_k_m, q5_k_m and q6_k, with
llama.cpp's teacher-forced logits (logits-<name>.json, no greedy):
  llama256-<type>   mkmodel tiny-llama3-256 F16 with Llama 3's vocab: every matrix row is a whole
                    number of 256-weight super-blocks, so no fallback type appears
  fortune-<type>    tiny-fortune's trained F16 file (tests/data/tiny-fortune/fortune-f16.gguf):
                    its ffn_down rows (704) fall back to Q5_0/Q5_1/Q8_0 as llama.cpp's do
Their models.json entries carry `source` ({"mkmodel_args", "file"} or {"path"}) and
`quantize_args` instead of `mkmodel_args`.

gemma (issue 24): mkmodel tiny-gemma (Gemma 2B's head_dim 256 and single KV head on two small
layers) with tests/data/vocab/spm-gemma.gguf, tiny-fortune's 2048-piece SentencePiece vocabulary
with Gemma's chat template: a real Gemma vocabulary (256000 pieces) is not in the repository;
the architecture's math (GeGLU, sqrt(n_embd) embedding scale, tied output, NEOX rope, head_dim
256) is what the answers check.

The model files are NOT committed: CI regenerates them with the same mkmodel / quantize
arguments (byte-identical) and checks the sha256. usage, from the repository root after
`(cd tools/llamacpp-oracle && npm install)` and building `duet`:
  python3 tools/llamacpp-oracle/make_models.py build/bin/duet /tmp/oracle-models \
      [--only-kquant | --only-arch ARCH]
(--only-kquant: keep models.json's other entries and their answers, redo the K-quant ones;
 --only-arch ARCH: the same for one architecture's mkmodel entries, e.g. gemma)
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
         ("internlm2", "tiny-internlm2", "tests/data/vocab/spm-internlm2.gguf"),
         ("gemma", "tiny-gemma", "tests/data/vocab/spm-gemma.gguf")]
TYPES = ["f16", "q8_0", "q4_0"]
# std 0.08 (not mkmodel's default 0.02): logits large enough (top-1 margins ~0.1-1) that rope
# pairing, llama3's rope_freqs and qwen2's biases move them far beyond llama.cpp's noise
STD = "0.08"
TEXT = "The quick brown fox jumps over the lazy dog; 12345 foxes. 你好"
N_IDS = 320        # teacher-forced length: RoPE (and llama3's rope_freqs) at large positions
N_POSITIONS = 16   # the last N_POSITIONS positions' logits are written
N_GREEDY = 16
KQUANT_TYPES = ["q4_k_m", "q5_k_m", "q6_k"]
N_KQUANT_POSITIONS = 64  # the last 64 of llama256's N_IDS positions; fortune: all of its ids
FORTUNE_F16 = "tests/data/tiny-fortune/fortune-f16.gguf"


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


def fortune_ids():
    """tiny-fortune's first teacher-forced sequence ("Once upon a time" + greedy 48)."""
    path = os.path.join(ROOT, "tests", "data", "tiny-fortune", "teacher-forced", "f16.json")
    with open(path) as f:
        return json.load(f)["sequences"][0]["ids"]


def kquant_models(duet, tmp):
    models = []
    llama_vocab = "tests/data/vocab/llama3.gguf"
    src_args = ["--shape", "tiny-llama3-256", "--arch", "llama", "--vocab", llama_vocab,
                "--type", "f16", "--std", STD]
    src_file = "llama256-f16.gguf"
    subprocess.run([duet, "mkmodel", *src_args, "--out", os.path.join(tmp, src_file)], check=True,
                   cwd=ROOT, stdout=subprocess.DEVNULL)
    sources = [("llama256", "llama", llama_vocab, {"mkmodel_args": src_args, "file": src_file},
                os.path.join(tmp, src_file), fixed_ids(llama_vocab, tmp), N_KQUANT_POSITIONS),
               ("fortune", "llama", FORTUNE_F16, {"path": FORTUNE_F16},
                os.path.join(ROOT, FORTUNE_F16), fortune_ids(), None)]
    for stem, arch, vocab, source, src_path, ids, keep in sources:
        for typ in KQUANT_TYPES:
            name = f"{stem}-{typ}"
            qargs = ["--type", typ]
            path = os.path.join(tmp, name + ".gguf")
            subprocess.run([duet, "quantize", src_path, path, *qargs], check=True, cwd=ROOT,
                           stdout=subprocess.DEVNULL)
            made = ("duet mkmodel " + " ".join(src_args) + f" --out {src_file} && "
                    if "mkmodel_args" in source else "")
            src_name = source.get("file", source.get("path"))
            models.append({"name": name, "arch": arch, "type": typ, "vocab": vocab,
                           "source": source, "quantize_args": qargs, "file": name + ".gguf",
                           "command": made + f"duet quantize {src_name} {name}.gguf " +
                                      " ".join(qargs),
                           "sha256": sha256(path), "size": os.path.getsize(path), "ids": ids})
            extra = ["--keep-last", str(keep)] if keep else []
            node("logits", "--model", path, "--ids", ",".join(map(str, ids)), *extra,
                 "--out", os.path.join(DATA, f"logits-{name}.json"))
    return models


def arch_models(duet, tmp, arch, shape, vocab):
    """One architecture's mkmodel files x TYPES, with llama.cpp's answers on them."""
    models = []
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
    return models


def main():
    only_kquant = "--only-kquant" in sys.argv
    only_arch = None
    argv = [a for a in sys.argv if a != "--only-kquant"]
    if "--only-arch" in argv:
        i = argv.index("--only-arch")
        only_arch = argv[i + 1]
        del argv[i:i + 2]
    duet, tmp = os.path.abspath(argv[1]), os.path.abspath(argv[2])
    os.makedirs(tmp, exist_ok=True)
    if only_kquant or only_arch:
        with open(os.path.join(DATA, "models.json")) as f:
            old = json.load(f)["models"]
    if only_kquant:
        kept = [m for m in old if "quantize_args" not in m]
        write_models(kept + kquant_models(duet, tmp))
        return
    if only_arch:
        (entry,) = [a for a in ARCHS if a[0] == only_arch]
        new = arch_models(duet, tmp, *entry)
        # models.json keeps ARCHS' order, then the K-quant entries
        order = [a[0] for a in ARCHS]
        mk = [m for m in old if "quantize_args" not in m and m["arch"] != only_arch] + new
        mk.sort(key=lambda m: order.index(m["arch"]))
        write_models(mk + [m for m in old if "quantize_args" in m])
        return
    models = []
    for arch, shape, vocab in ARCHS:
        models += arch_models(duet, tmp, arch, shape, vocab)
    write_models(models + kquant_models(duet, tmp))


def write_models(models):
    doc = {"about": "small random-weight models from `duet mkmodel` (run from the repository "
                    "root; --out any path), K-quant files from `duet quantize` of an F16 source, "
                    "and the ids llama.cpp was fed; made by tools/llamacpp-oracle/make_models.py. "
                    "The files are not committed: regenerate them with the same arguments "
                    "(byte-identical).",
           "text": TEXT, "models": models}
    with open(os.path.join(DATA, "models.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
