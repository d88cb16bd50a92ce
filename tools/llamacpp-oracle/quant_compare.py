#!/usr/bin/env python3
"""llama.cpp's reference K quantisers (ggml's quantize_row_q{4,5,6}_K_ref, no importance matrix:
what llama-quantize runs without --imatrix) on fixed weight-like rows, for duet's quantisers to be
compared with (tests/core/model/test_quant_ggml.cpp):

  tests/data/llamacpp/quant-ggml.json  per type: RMSE of ggml's quantise -> dequantise, and the
                                       sha256 of each quantised row

The rows are generated here and in the test by the same integer recipe (make_rows), so no
weights are committed. ggml is called through ctypes on node-llama-cpp's bundled libggml-base.so
(the same build oracle.mjs runs). usage, after npm install here:
  python3 tools/llamacpp-oracle/quant_compare.py tests/data/llamacpp/quant-ggml.json
"""

import ctypes
import hashlib
import json
import math
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
LIB = os.path.join(HERE, "node_modules", "@node-llama-cpp", "linux-x64", "bins", "linux-x64",
                   "libggml-base.so")
ROWS, COLS = 64, 2048
TYPES = {"Q4_K": ("q4_K", 144), "Q5_K": ("q5_K", 176), "Q6_K": ("q6_K", 210)}
M64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def make_rows():
    """Row r, weight i: z = splitmix64(r * 2^32 + i); the sum of z's four 16-bit quarters
    (Irwin-Hall, mean 0) scaled to std 0.02, times 5 when z's top byte is below 6 (a 2% tail of
    outliers). Computed in float64 and rounded once to float32."""
    rows = []
    for r in range(ROWS):
        row = []
        for i in range(COLS):
            z = splitmix64((r << 32) + i)
            s = (z & 0xFFFF) + ((z >> 16) & 0xFFFF) + ((z >> 32) & 0xFFFF) + (z >> 48)
            v = (s - 2 * 65535) * (0.02 * math.sqrt(3) / 65536)
            if (z >> 56) < 6:
                v *= 5
            row.append(struct.unpack("f", struct.pack("f", v))[0])
        rows.append(row)
    return rows


def main():
    lib = ctypes.CDLL(LIB)
    rows = make_rows()
    out = {"about": "ggml's reference K quantisers (quantize_row_*_K_ref) on quant_compare.py's "
                    "rows; made by tools/llamacpp-oracle/quant_compare.py",
           "rows": ROWS, "cols": COLS, "types": {}}
    for name, (fn, block_bytes) in TYPES.items():
        quant = getattr(lib, f"quantize_row_{fn}_ref")
        dequant = getattr(lib, f"dequantize_row_{fn}")
        for f in (quant, dequant):
            f.restype = None
        row_bytes = COLS // 256 * block_bytes
        sse, hashes = 0.0, []
        for row in rows:
            src = (ctypes.c_float * COLS)(*row)
            q = (ctypes.c_uint8 * row_bytes)()
            back = (ctypes.c_float * COLS)()
            quant(src, q, ctypes.c_int64(COLS))
            dequant(q, back, ctypes.c_int64(COLS))
            sse += sum((float(a) - float(b)) ** 2 for a, b in zip(row, back))
            hashes.append(hashlib.sha256(bytes(q)).hexdigest())
        out["types"][name] = {"rmse": math.sqrt(sse / (ROWS * COLS)), "row_sha256": hashes}
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print({k: v["rmse"] for k, v in out["types"].items()})


if __name__ == "__main__":
    main()
