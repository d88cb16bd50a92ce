#!/usr/bin/env python3
"""A small vocab-only GGUF that differs from a byte-level BPE one in its pre-tokenizer.

Keeps the 256 byte-level characters, the first --merges merges (and the tokens they name and
make) and every control/user-defined token of IN, renumbered in their old order, with
tokenizer.ggml.pre set to --pre. llama.cpp then tokenises the corpus with that pre-tokenizer's
regexes: test data for duet's gpt-2 / default / starcoder pre-tokenizers, which no shipped vocab
here uses. Same arguments => byte-identical output.

usage: pre_variant.py IN.gguf OUT.gguf --pre NAME [--merges N]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_to_gguf_vocab import (CONTROL, USER_DEFINED, T_ARRAY, T_STRING, T_UINT32,  # noqa: E402
                              GgufWriter, read_gguf_kv)


def byte_chars():
    """GPT-2's bytes_to_unicode characters, as UTF-8 strings."""
    printable = [b for b in range(256) if 0x21 <= b <= 0x7e or 0xa1 <= b <= 0xac or b >= 0xae]
    out, n = [], 0
    for b in range(256):
        if b in printable:
            out.append(chr(b))
        else:
            out.append(chr(256 + n))
            n += 1
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--pre", required=True)
    ap.add_argument("--merges", type=int, default=4000)
    args = ap.parse_args()

    kv = read_gguf_kv(args.src)
    get = {k: v for k, _, v, _ in kv}
    tokens = get["tokenizer.ggml.tokens"]
    types = get["tokenizer.ggml.token_type"]
    id_of = {t: i for i, t in enumerate(tokens)}
    keep = {id_of[c] for c in byte_chars() if c in id_of}
    keep |= {i for i, t in enumerate(types) if t in (CONTROL, USER_DEFINED)}
    merges = []
    for m in get["tokenizer.ggml.merges"][:args.merges]:
        a, b = m.split(" ", 1)
        if a in id_of and b in id_of and a + b in id_of:
            keep |= {id_of[a], id_of[b], id_of[a + b]}
            merges.append(m)
    old_ids = sorted(keep)
    new_id = {old: new for new, old in enumerate(old_ids)}

    w = GgufWriter()
    w.add("general.architecture", T_STRING, get.get("general.architecture", "llama"))
    w.add("general.name", T_STRING, f"{os.path.basename(args.src)} pre={args.pre}")
    for key, vtype, value, elem in kv:
        if not key.startswith("tokenizer."):
            continue
        if key == "tokenizer.ggml.pre":
            value = args.pre
        elif key == "tokenizer.ggml.tokens":
            value = [tokens[i] for i in old_ids]
        elif key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
            value = [value[i] for i in old_ids]
        elif key == "tokenizer.ggml.merges":
            value = merges
        elif key.endswith("_token_id"):
            if value not in new_id:
                continue
            value = new_id[value]
            vtype = T_UINT32
        if vtype == T_STRING:
            value = value.encode("utf-8", "surrogateescape")
        elif vtype == T_ARRAY and elem == T_STRING:
            value = [v.encode("utf-8", "surrogateescape") for v in value]
        w.add(key, vtype, value, elem)
    with open(args.out, "wb") as f:
        f.write(w.to_bytes())
    print(f"{args.out}: {len(old_ids)} tokens, {len(merges)} merges, pre={args.pre}")


if __name__ == "__main__":
    main()
