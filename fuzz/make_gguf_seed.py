#!/usr/bin/env python3
"""Writes a tiny but complete Llama GGUF (v3) as a fuzz seed: dim 32, 1 layer, vocab 8.
Kept tiny so libFuzzer mutates the header and metadata, not megabytes of weights."""
import struct, sys

def s(x): b = x.encode(); return struct.pack('<Q', len(b)) + b
def kv(key, typ, payload): return s(key) + struct.pack('<I', typ) + payload
U32, F32, STR, ARR = 4, 6, 8, 9
def u32(k, v): return kv(k, U32, struct.pack('<I', v))
def f32(k, v): return kv(k, F32, struct.pack('<f', v))
def st(k, v): return kv(k, STR, s(v))
def arr(k, t, items, pack): return kv(k, ARR, struct.pack('<IQ', t, len(items)) + b''.join(pack(i) for i in items))

D, FF, V, H, HKV = 32, 64, 8, 2, 1
pieces = ['<unk>', '<s>', '</s>', '\n', '\u2581a', 'b', '\u2581ab', '<0x41>']
meta = [
    st('general.architecture', 'llama'), u32('general.alignment', 32),
    u32('llama.context_length', 64), u32('llama.embedding_length', D), u32('llama.block_count', 1),
    u32('llama.feed_forward_length', FF), u32('llama.attention.head_count', H),
    u32('llama.attention.head_count_kv', HKV), f32('llama.rope.freq_base', 10000.0),
    f32('llama.attention.layer_norm_rms_epsilon', 1e-5),
    st('tokenizer.ggml.model', 'llama'),
    arr('tokenizer.ggml.tokens', STR, pieces, s),
    arr('tokenizer.ggml.scores', F32, [0.0, 0.0, 0.0, 0.0, -1.0, -2.0, -0.5, 0.0], lambda x: struct.pack('<f', x)),
    arr('tokenizer.ggml.token_type', 5, [2, 3, 3, 4, 1, 1, 1, 6], lambda x: struct.pack('<i', x)),
    u32('tokenizer.ggml.bos_token_id', 1), u32('tokenizer.ggml.eos_token_id', 2),
]
def q4_0(rows, cols):  # d = 0.01, nibbles 8 (zero) except a ramp
    out = b''
    for r in range(rows):
        for _ in range(cols // 32):
            out += struct.pack('<e', 0.01) + bytes(((i + r) % 16) | (((i * 3 + r) % 16) << 4) for i in range(16))
    return out
def f32v(n): return struct.pack('<%df' % n, *([1.0] * n))
kvd = D // H * HKV
tensors = [
    ('token_embd.weight', 2, [D, V], q4_0(V, D)), ('output_norm.weight', 0, [D], f32v(D)),
    ('output.weight', 2, [D, V], q4_0(V, D)),
    ('blk.0.attn_norm.weight', 0, [D], f32v(D)), ('blk.0.ffn_norm.weight', 0, [D], f32v(D)),
    ('blk.0.attn_q.weight', 2, [D, D], q4_0(D, D)), ('blk.0.attn_k.weight', 2, [D, kvd], q4_0(kvd, D)),
    ('blk.0.attn_v.weight', 2, [D, kvd], q4_0(kvd, D)), ('blk.0.attn_output.weight', 2, [D, D], q4_0(D, D)),
    ('blk.0.ffn_gate.weight', 2, [D, FF], q4_0(FF, D)), ('blk.0.ffn_up.weight', 2, [D, FF], q4_0(FF, D)),
    ('blk.0.ffn_down.weight', 2, [FF, D], q4_0(D, FF)),
]
head = b'GGUF' + struct.pack('<IQQ', 3, len(tensors), len(meta)) + b''.join(meta)
off, infos, datas = 0, b'', b''
for name, typ, dims, data in tensors:
    infos += s(name) + struct.pack('<I', len(dims)) + b''.join(struct.pack('<Q', d) for d in dims)
    infos += struct.pack('<IQ', typ, off)
    pad = (-len(data)) % 32
    datas += data + b'\0' * pad
    off += len(data) + pad
body = head + infos
body += b'\0' * ((-len(body)) % 32)
open(sys.argv[1], 'wb').write(body + datas)
