// E0M4 weights (Transformer-Lite's FP4; the layout is documented in core/quant_e0m4.h): a group
// of 128 weights is 68 bytes, fp16 d and m then four 16-byte sub-blocks of 32 codes in Q4_0's
// nibble order; weight = d * w1 + m, where w1 is the code as the top 4 fraction bits of a float
// with 2.0's sign and exponent.
//
// Dequantisation in registers is the paper's two bitwise operations, a shift and an OR, and a
// reinterpretation: no int -> float conversion. The kernels form w1 as an fp32 (exponent bits
// 0x40000000, the code at fraction bits 22..19) rather than an fp16 (0x4000, bits 9..6): the
// same value 2 + code / 8, without needing cl_khr_fp16 for half arithmetic (NVIDIA's OpenCL has
// none) or a half -> float conversion before the fp32 FMAs with the fp32 activations. d * w1 is
// exact in fp32, so the result has core's bits (dequantize_row_e0m4) with or without fusion.
//
// The generic kernels (matmul.cl, matmul_gpu.cl, elementwise.cl) walk a row 32 weights at a
// time; BLOCK_BYTES_e0m4 is the bytes per 32 weights for their row sizes (k / 32 * 17 =
// k / 128 * 68: k is a multiple of 128 for E0M4 matrices), and load_block_at_e0m4 finds the
// sub-block behind its group's header.
#define BLOCK_BYTES_e0m4 17
#define E0M4_GROUP_BYTES 68
#define E0M4_EXP_BITS 0x40000000u
#define E0M4_CODE_SHIFT 19

inline void load_block_at_e0m4(global const uchar* wr, uint b, float16* lo, float16* hi) {
  global const uchar* g = wr + (ulong)(b >> 2) * E0M4_GROUP_BYTES;
  const float d = vload_half(0, (global const half*)g), m = vload_half(1, (global const half*)g);
  const uint16 q = convert_uint16(vload16(0, g + 4 + (b & 3u) * 16u));
  *lo = fma(as_float16(E0M4_EXP_BITS | (q & 15u) << E0M4_CODE_SHIFT), (float16)(d), (float16)(m));
  *hi = fma(as_float16(E0M4_EXP_BITS | (q >> 4) << E0M4_CODE_SHIFT), (float16)(d), (float16)(m));
}
#define cpu_block_at_e0m4 load_block_at_e0m4

DEFINE_QX_KERNELS(e0m4)
