#!/usr/bin/env python3
"""llama.cpp's C API (the libllama that node-llama-cpp ships) through ctypes, for the two things
node-llama-cpp's JavaScript API cannot reach:

- `tokenize-bytes`: llama_tokenize on raw bytes (JavaScript strings cannot carry invalid UTF-8;
  N-API would turn it into U+FFFD before llama.cpp saw it), with add_special and parse_special.
- `chat-template`: llama_chat_apply_template, llama.cpp's own (non-Jinja) template code, which
  recognises a template by its text and formats the messages (node-llama-cpp does not export it).

Reads one JSON request on stdin, writes one JSON reply on stdout:
  {"op": "tokenize-bytes", "model": F, "items": [HEX, ...]}
      -> {"items": [{"plain": [...], "special": [...], "plain_add_special": [...]}, ...]}
  {"op": "load", "model": F} -> {"loaded": bool, "log": [llama.cpp's log lines]} (or
      {"error": "llama.cpp terminates: ..."} when loading kills the process)
  {"op": "chat-template", "template": JINJA, "messages": [{"role", "content"}], "add_ass": true}
      -> {"text": FORMATTED} (or {"error": ...} when llama.cpp does not recognise the template)

The struct layout of llama_model_params is that of the llama.cpp sources node-llama-cpp bundles
(node_modules/node-llama-cpp/llama/gitRelease.bundle, include/llama.h); oracle.mjs passes the
library directory in LLAMA_LIB_DIR.
"""

import ctypes
import json
import os
import sys


class ModelParams(ctypes.Structure):
    _fields_ = [
        ("devices", ctypes.c_void_p),
        ("tensor_buft_overrides", ctypes.c_void_p),
        ("n_gpu_layers", ctypes.c_int32),
        ("split_mode", ctypes.c_int32),
        ("load_mode", ctypes.c_int32),
        ("lazy_mode", ctypes.c_int32),
        ("main_gpu", ctypes.c_int32),
        ("tensor_split", ctypes.c_void_p),
        ("progress_callback", ctypes.c_void_p),
        ("progress_callback_user_data", ctypes.c_void_p),
        ("kv_overrides", ctypes.c_void_p),
        ("vocab_only", ctypes.c_bool),
        ("check_tensors", ctypes.c_bool),
        ("use_extra_bufts", ctypes.c_bool),
        ("no_host", ctypes.c_bool),
        ("no_alloc", ctypes.c_bool),
        ("load_mtp", ctypes.c_bool),
    ]


class ChatMessage(ctypes.Structure):
    _fields_ = [("role", ctypes.c_char_p), ("content", ctypes.c_char_p)]


LOG_CB = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


def load_lib():
    d = os.environ["LLAMA_LIB_DIR"]
    for dep in ("libggml-base.so", "libggml.v0.5.0.so"):
        ctypes.CDLL(os.path.join(d, dep), mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(os.path.join(d, "libllama.v0.5.0.so"), mode=ctypes.RTLD_GLOBAL)
    lib.llama_model_default_params.restype = ModelParams
    lib.llama_model_load_from_file.restype = ctypes.c_void_p
    lib.llama_model_load_from_file.argtypes = [ctypes.c_char_p, ModelParams]
    lib.llama_model_get_vocab.restype = ctypes.c_void_p
    lib.llama_model_get_vocab.argtypes = [ctypes.c_void_p]
    lib.llama_model_free.argtypes = [ctypes.c_void_p]
    lib.llama_tokenize.restype = ctypes.c_int32
    lib.llama_tokenize.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32,
                                   ctypes.POINTER(ctypes.c_int32), ctypes.c_int32, ctypes.c_bool,
                                   ctypes.c_bool]
    lib.llama_chat_apply_template.restype = ctypes.c_int32
    lib.llama_chat_apply_template.argtypes = [ctypes.c_char_p, ctypes.POINTER(ChatMessage),
                                              ctypes.c_size_t, ctypes.c_bool, ctypes.c_char_p,
                                              ctypes.c_int32]
    return lib


def quiet(lib):
    cb = LOG_CB(lambda level, text, user: None)
    lib.llama_log_set(cb, None)
    return cb  # kept alive by the caller


def tokenize(lib, vocab, data, add_special, parse_special):
    n_max = len(data) + 16
    buf = (ctypes.c_int32 * n_max)()
    n = lib.llama_tokenize(vocab, data, len(data), buf, n_max, add_special, parse_special)
    if n < 0:
        raise RuntimeError(f"llama_tokenize wants {-n} tokens, more than {n_max}")
    return list(buf[:n])


def tokenize_all(lib, vocab, data):
    return {"plain": tokenize(lib, vocab, data, False, False),
            "special": tokenize(lib, vocab, data, False, True),
            "plain_add_special": tokenize(lib, vocab, data, True, False)}


def isolated(fn):
    """fn() in a forked child: llama.cpp's BPE pre-tokenizer throws a C++ exception through the
    C API on some invalid UTF-8 (the process terminates); that outcome is recorded as
    {"error": the message llama.cpp printed} instead of losing the whole run."""
    r, w = os.pipe()
    er, ew = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.close(er)
        os.dup2(ew, 2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)  # ggml's abort handler prints a backtrace on stdout
        try:
            out = json.dumps(fn()).encode()
            os.write(w, out)
        finally:
            os._exit(0)
    os.close(w)
    os.close(ew)
    with os.fdopen(r, "rb") as f:
        out = f.read()
    with os.fdopen(er, "rb") as f:
        err = f.read().decode("utf-8", "replace")
    _, status = os.waitpid(pid, 0)
    if status == 0 and out:
        return json.loads(out)
    what = [line.split("what():", 1)[1].strip() for line in err.splitlines() if "what():" in line]
    return {"error": "llama.cpp terminates: " + (what[0] if what else f"status {status}")}


def op_tokenize_bytes(lib, req):
    params = lib.llama_model_default_params()
    params.vocab_only = True
    model = lib.llama_model_load_from_file(req["model"].encode(), params)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {req['model']}")
    vocab = lib.llama_model_get_vocab(model)
    items = [isolated(lambda: tokenize_all(lib, vocab, bytes.fromhex(hx))) for hx in req["items"]]
    lib.llama_model_free(model)
    return {"items": items}


def op_load(lib, req):
    """Whether llama_model_load_from_file loads the file (its own GGUF reader, gguf_init, then
    the model loader), with llama.cpp's log lines: why it refused, for a file it must refuse."""
    def load():
        lines = []
        cb = LOG_CB(lambda level, text, user: lines.append(text.decode("utf-8", "replace")))
        lib.llama_log_set(cb, None)
        # A full load needs a compute backend (the CPU one of the bundle's variants).
        lib.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
        lib.ggml_backend_load_all_from_path(os.environ["LLAMA_LIB_DIR"].encode())
        model = lib.llama_model_load_from_file(req["model"].encode(),
                                               lib.llama_model_default_params())
        if model:
            lib.llama_model_free(model)
        # File names without their directories: the record is the same on every machine.
        text = "".join(lines).replace(os.environ["LLAMA_LIB_DIR"] + "/", "")
        text = text.replace(os.path.dirname(os.path.abspath(req["model"])) + "/", "")
        # Which CPU variant of the backend loaded is the machine's, not the file's.
        log = [line.strip() for line in text.splitlines()
               if line.strip() and not line.startswith("load_backend:")]
        return {"loaded": bool(model), "log": log}
    return isolated(load)


def op_chat_template(lib, req):
    """The formatted text, and which of llama.cpp's built-in template names give the same text
    (llama.cpp does not say what it detected; equal output on these messages is what we can see)."""
    out = apply_template(lib, req["template"], req)
    if "error" in out:
        return out
    lib.llama_chat_builtin_templates.restype = ctypes.c_int32
    lib.llama_chat_builtin_templates.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t]
    n = lib.llama_chat_builtin_templates(None, 0)
    names = (ctypes.c_char_p * n)()
    lib.llama_chat_builtin_templates(names, n)
    out["same_as_builtin"] = sorted(
        name.decode() for name in names
        if apply_template(lib, name.decode(), req).get("text") == out["text"])
    return out


def apply_template(lib, template, req):
    msgs = req["messages"]
    keep = [(m["role"].encode(), m["content"].encode()) for m in msgs]
    arr = (ChatMessage * len(msgs))(*[ChatMessage(r, c) for r, c in keep])
    tmpl = template.encode()
    size = 4096 + 2 * sum(len(c) for _, c in keep)
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = lib.llama_chat_apply_template(tmpl, arr, len(msgs), bool(req.get("add_ass", True)),
                                          buf, size)
        if n < 0:
            return {"error": "llama_chat_apply_template does not recognise this template"}
        if n <= size:
            return {"text": buf.raw[:n].decode("utf-8")}
        size = n
    raise RuntimeError("llama_chat_apply_template kept growing")


def main():
    os.environ["GGML_NO_BACKTRACE"] = "1"
    req = json.load(sys.stdin)
    lib = load_lib()
    keep = quiet(lib)
    ops = {"tokenize-bytes": op_tokenize_bytes, "chat-template": op_chat_template, "load": op_load}
    json.dump(ops[req["op"]](lib, req), sys.stdout)
    del keep
    return 0


if __name__ == "__main__":
    sys.exit(main())
