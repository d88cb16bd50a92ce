// Q4_1, Q5_0 and Q5_1 weights (issue 19: the K-quant mixes fall back to them for rows that are
// not whole super-blocks) in fp32 on every device: blocks of 32 dequantised in registers, read
// by matmul.cl's, matmul_gpu.cl's and elementwise.cl's generic kernels (embedding, the GPU GEMV
// and GEMM, the CPU devices' GEMV and GEMM; the integer path is Q4_0/Q8_0/K only). ggml's blocks
// (core/quant.h), only 2-byte aligned:
//   Q4_1 20 B: fp16 d, m; qs[16]           weight j = d q_j + m, q_j = nibble (low: j < 16)
//   Q5_0 22 B: fp16 d; qh[4]; qs[16]       q_j = nibble | bit j of qh << 4; weight d (q_j - 16)
//   Q5_1 24 B: fp16 d, m; qh[4]; qs[16]    weight d q_j + m
#define BLOCK_BYTES_q4_1 20
#define BLOCK_BYTES_q5_0 22
#define BLOCK_BYTES_q5_1 24

inline uint qx_u32(global const uchar* p) {  // 4 bytes at a 2-byte aligned address
  global const ushort* s = (global const ushort*)p;
  return (uint)s[0] | ((uint)s[1] << 16);
}
// The fifth bits of weights 0..15 (lo) and 16..31 (hi), times 16.
inline void qx_high_bits(uint qh, uint16* lo, uint16* hi) {
  const uint16 bit = (uint16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  *lo = (((uint16)(qh) >> bit) & 1u) << 4;
  *hi = (((uint16)(qh) >> (bit + 16u)) & 1u) << 4;
}

inline void load_block_q4_1(global const uchar* p, float16* lo, float16* hi) {
  const float d = vload_half(0, (global const half*)p), m = vload_half(1, (global const half*)p);
  const uint16 q = convert_uint16(vload16(0, p + 4));
  *lo = convert_float16(q & 15u) * d + m;
  *hi = convert_float16(q >> 4) * d + m;
}
inline void load_block_q5_0(global const uchar* p, float16* lo, float16* hi) {
  const float d = vload_half(0, (global const half*)p);
  uint16 h0, h1;
  qx_high_bits(qx_u32(p + 2), &h0, &h1);
  const uint16 q = convert_uint16(vload16(0, p + 6));
  *lo = (convert_float16((q & 15u) | h0) - 16.0f) * d;
  *hi = (convert_float16((q >> 4) | h1) - 16.0f) * d;
}
inline void load_block_q5_1(global const uchar* p, float16* lo, float16* hi) {
  const float d = vload_half(0, (global const half*)p), m = vload_half(1, (global const half*)p);
  uint16 h0, h1;
  qx_high_bits(qx_u32(p + 4), &h0, &h1);
  const uint16 q = convert_uint16(vload16(0, p + 8));
  *lo = convert_float16((q & 15u) | h0) * d + m;
  *hi = convert_float16((q >> 4) | h1) * d + m;
}
#define cpu_block_q4_1 load_block_q4_1
#define cpu_block_q5_0 load_block_q5_0
#define cpu_block_q5_1 load_block_q5_1
#define load_block_at_q4_1(wr, b, lo, hi) load_block_q4_1(BLOCK_AT(q4_1, wr, b), lo, hi)
#define load_block_at_q5_0(wr, b, lo, hi) load_block_q5_0(BLOCK_AT(q5_0, wr, b), lo, hi)
#define load_block_at_q5_1(wr, b, lo, hi) load_block_q5_1(BLOCK_AT(q5_1, wr, b), lo, hi)
#define cpu_block_at_q4_1 load_block_at_q4_1
#define cpu_block_at_q5_0 load_block_at_q5_0
#define cpu_block_at_q5_1 load_block_at_q5_1

#define DEFINE_QX_KERNELS(NAME)        \
  DEFINE_EMBED(NAME)                   \
  DEFINE_MATMUL_TILED(NAME, 8)         \
  DEFINE_GEMV_COOP(NAME)               \
  DEFINE_MATMUL_GEMV_INVARIANT(NAME)   \
  DEFINE_MATMUL_CPU_GEMM(NAME)
DEFINE_QX_KERNELS(q4_1)
DEFINE_QX_KERNELS(q5_0)
DEFINE_QX_KERNELS(q5_1)
