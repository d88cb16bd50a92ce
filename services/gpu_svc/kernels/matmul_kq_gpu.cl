// K-quant weights (Q4_K, Q5_K, Q6_K; layouts in matmul_kq_cpu.cl's header and core/quant.h) on
// any device in fp32 (issue 19): GPUs (the discrete path: the file's layout, dequantised in
// registers), CPU devices when the integer path is off, and embedding lookups. Same contract as
// matmul.cl: y[t][r] = W[r] . x[t] for r in [row_begin, row_end), t in [t_begin, t_end); with
// rows_from_table (Logits) token t writes y row tok[t].logits_row, or nothing for -1. Super-block
// bytes are only 2-byte aligned (144, 176, 210 B): loads are bytes or halves. OpenCL C 1.2.

#define KQ_BYTES_q4_k 144
#define KQ_BYTES_q5_k 176
#define KQ_BYTES_q6_k 210

// ggml's get_scale_min_k4: sub-block j's 6-bit scale and min from the 12 packed bytes at s.
// Without a branch on j (the GEMV's lanes take different sub-blocks: no divergence).
inline void kq_scale_min_k4(global const uchar* s, uint j, float* sc, float* m) {
  const uint i = j & 3u;
  const uint a = s[i], b = s[i + 4], c = s[i + 8];
  const uint high = j >> 2;
  *sc = (float)(high ? (c & 0xFu) | ((a >> 6) << 4) : a & 63u);
  *m = (float)(high ? (c >> 4) | ((b >> 6) << 4) : b & 63u);
}

// Sub-block j (32 weights: 16 in lo, 16 in hi) of the super-block at p, dequantised as ggml's
// dequantize_row_q*_K: d sc q - dmin m (Q4_K, Q5_K), d sc (q - 32) (Q6_K).
inline void load_sub_q4_k(global const uchar* p, uint j, float16* lo, float16* hi) {
  float sc, m;
  kq_scale_min_k4(p + 4, j, &sc, &m);
  const float a = vload_half(0, (global const half*)p) * sc;
  const float b = vload_half(1, (global const half*)p) * m;
  global const uchar* q = p + 16 + 32 * (j / 2);
  const uint s = 4 * (j & 1);
  *lo = convert_float16((convert_uint16(vload16(0, q)) >> s) & 15u) * a - b;
  *hi = convert_float16((convert_uint16(vload16(1, q)) >> s) & 15u) * a - b;
}
inline void load_sub_q5_k(global const uchar* p, uint j, float16* lo, float16* hi) {
  float sc, m;
  kq_scale_min_k4(p + 4, j, &sc, &m);
  const float a = vload_half(0, (global const half*)p) * sc;
  const float b = vload_half(1, (global const half*)p) * m;
  global const uchar* q = p + 48 + 32 * (j / 2);
  const uint s = 4 * (j & 1);
  const uint16 h0 = ((convert_uint16(vload16(0, p + 16)) >> j) & 1u) << 4;
  const uint16 h1 = ((convert_uint16(vload16(1, p + 16)) >> j) & 1u) << 4;
  *lo = convert_float16(((convert_uint16(vload16(0, q)) >> s) & 15u) | h0) * a - b;
  *hi = convert_float16(((convert_uint16(vload16(1, q)) >> s) & 15u) | h1) * a - b;
}
inline void load_sub_q6_k(global const uchar* p, uint c, float16* lo, float16* hi) {
  const uint h = c / 4, cc = c % 4;
  global const uchar* ql = p + 64 * h + 32 * (cc & 1);
  global const uchar* qh = p + 128 + 32 * h;
  global const char* sc = (global const char*)(p + 192 + 2 * c);
  const float d = vload_half(0, (global const half*)(p + 208));
  const uint s = 4 * (cc >> 1), t = 2 * cc;
  const uint16 q0 = ((convert_uint16(vload16(0, ql)) >> s) & 15u) |
                    (((convert_uint16(vload16(0, qh)) >> t) & 3u) << 4);
  const uint16 q1 = ((convert_uint16(vload16(1, ql)) >> s) & 15u) |
                    (((convert_uint16(vload16(1, qh)) >> t) & 3u) << 4);
  *lo = (convert_float16(q0) - 32.0f) * (d * (float)sc[0]);
  *hi = (convert_float16(q1) - 32.0f) * (d * (float)sc[1]);
}

// out[t] = table row tok[t].id, one 32-weight sub-block per work-item.
#define DEFINE_EMBED_KQ(NAME)                                                                      \
  kernel void embed_##NAME(global const uchar* w, ulong w_off, uint cols, ulong tok_off,          \
                           global uchar* arena, ulong out_off, uint out_stride, uint t_begin) {   \
    const uint b = get_global_id(0);                                                               \
    const uint t = t_begin + get_global_id(1);                                                     \
    global const int* tok = (global const int*)(arena + tok_off);                                  \
    const ulong row_bytes = (ulong)(cols / 256) * KQ_BYTES_##NAME;                                 \
    const int id = tok[4 * t + TOK_ID];                                                            \
    float16 lo, hi;                                                                                \
    load_sub_##NAME(w + w_off + (ulong)id * row_bytes + (ulong)(b / 8) * KQ_BYTES_##NAME, b % 8,  \
                    &lo, &hi);                                                                     \
    global float* out = (global float*)(arena + out_off) + (ulong)t * out_stride + b * QK;        \
    vstore16(lo, 0, out);                                                                          \
    vstore16(hi, 1, out);                                                                          \
  }
DEFINE_EMBED_KQ(q4_k)
DEFINE_EMBED_KQ(q5_k)
DEFINE_EMBED_KQ(q6_k)

// A work-item owns one weight row and 8 tokens (each dequantised sub-block reused 8 times): the
// prefill GEMM on GPUs, and every K-quant matmul on CPU devices without the integer path.
#define DEFINE_MATMUL_KQ_T8(NAME)                                                                  \
  kernel void matmul_t8_##NAME(global const uchar* w, ulong w_off, uint k, global uchar* arena,   \
                               ulong x_off, uint x_stride, ulong y_off, uint y_stride,             \
                               uint row_begin, uint row_end, uint t_begin, uint t_end,             \
                               ulong tok_off, int rows_from_table) {                               \
    const uint r = row_begin + get_global_id(0);                                                   \
    const uint t0 = t_begin + get_global_id(1) * 8;                                                \
    if (r >= row_end || t0 >= t_end) return;                                                       \
    const uint n_sub = k / QK;                                                                     \
    global const uchar* wr = w + w_off + (ulong)r * (k / 256) * KQ_BYTES_##NAME;                   \
    global const float* x = (global const float*)(arena + x_off);                                  \
    global const int* tok = (global const int*)(arena + tok_off);                                  \
    int out_row[8];                                                                                \
    float16 acc[8];                                                                                \
    for (uint i = 0; i < 8; ++i) {                                                                 \
      out_row[i] = (t0 + i < t_end) ? matmul_out_row(tok, rows_from_table, t0 + i) : -1;           \
      acc[i] = (float16)(0.0f);                                                                    \
    }                                                                                              \
    for (uint b = 0; b < n_sub; ++b) {                                                             \
      float16 lo, hi;                                                                              \
      load_sub_##NAME(wr + (ulong)(b / 8) * KQ_BYTES_##NAME, b % 8, &lo, &hi);                     \
      for (uint i = 0; i < 8; ++i) {                                                               \
        if (out_row[i] < 0) continue;                                                              \
        global const float* xb = x + (ulong)(t0 + i) * x_stride + b * QK;                          \
        acc[i] = mad(lo, vload16(0, xb), acc[i]);                                                  \
        acc[i] = mad(hi, vload16(1, xb), acc[i]);                                                  \
      }                                                                                            \
    }                                                                                              \
    global float* y = (global float*)(arena + y_off);                                              \
    for (uint i = 0; i < 8; ++i)                                                                   \
      if (out_row[i] >= 0) y[(ulong)out_row[i] * y_stride + r] = sum16(acc[i]);                    \
  }
DEFINE_MATMUL_KQ_T8(q4_k)
DEFINE_MATMUL_KQ_T8(q5_k)
DEFINE_MATMUL_KQ_T8(q6_k)

// ---- the GPU GEMV (decode): a work-group computes KQ_GEMV_ROWS rows of one token, 32
// work-items per row; per super-block each reads 8 of the row's weights (neighbouring
// work-items: neighbouring bytes, so a row's 32 read the super-block's quants whole), and the
// row's partial sums are reduced in local memory.
#define KQ_GEMV_ROWS 8

inline uint kq_u32(global const uchar* p) {  // 4 bytes at a 2-byte aligned address
  global const ushort* s = (global const ushort*)p;
  return (uint)s[0] | ((uint)s[1] << 16);
}
inline float4 kq_nibbles(uint q, uint shift) {
  q >>= shift;
  return (float4)((float)(q & 15u), (float)((q >> 8) & 15u), (float)((q >> 16) & 15u),
                  (float)((q >> 24) & 15u));
}
// Bit `bit` of each of qh's 4 bytes, times 16.
inline float4 kq_high_bit(uint qh, uint bit) {
  qh >>= bit;
  return (float4)((float)(qh & 1u), (float)((qh >> 8) & 1u), (float)((qh >> 16) & 1u),
                  (float)((qh >> 24) & 1u)) * 16.0f;
}
inline float kq_sum4(float4 v) {
  return (v.x + v.y) + (v.z + v.w);
}

// Q4_K/Q5_K: lane l takes quant bytes 4g..4g+3 (g = l % 8) of the pair p = l / 8 of sub-blocks
// (2p: low nibbles, 2p + 1: high), i.e. weights 64p + 4g.. and 64p + 32 + 4g.. of the super-block.
#define KQ_GEMV_LANE_SCALED(HIGH_BITS)                                                             \
  const uint p = lane / 8, g = lane % 8;                                                           \
  for (uint sb = 0; sb < n_super; ++sb) {                                                          \
    global const uchar* blk = wr + (ulong)sb * block_bytes;                                        \
    float sc0, m0, sc1, m1;                                                                        \
    kq_scale_min_k4(blk + 4, 2 * p, &sc0, &m0);                                                    \
    kq_scale_min_k4(blk + 4, 2 * p + 1, &sc1, &m1);                                                \
    const float d = vload_half(0, (global const half*)blk);                                        \
    const float dmin = vload_half(1, (global const half*)blk);                                     \
    const uint q = kq_u32(blk + qs_at + 32 * p + 4 * g);                                           \
    float4 f0 = kq_nibbles(q, 0), f1 = kq_nibbles(q, 4);                                           \
    if (HIGH_BITS) {                                                                               \
      const uint qh = kq_u32(blk + 16 + 4 * g);                                                    \
      f0 += kq_high_bit(qh, 2 * p);                                                                \
      f1 += kq_high_bit(qh, 2 * p + 1);                                                            \
    }                                                                                              \
    global const float* xs = x + sb * 256 + 64 * p + 4 * g;                                        \
    const float4 x0 = vload4(0, xs), x1 = vload4(0, xs + 32);                                      \
    acc += d * (sc0 * dot(f0, x0) + sc1 * dot(f1, x1)) - dmin * (m0 * kq_sum4(x0) + m1 * kq_sum4(x1)); \
  }
// Q6_K: lane l takes l2 = 2 (l % 16), l2 + 1 of half h = l / 16: weights l2.., 32 + l2..,
// 64 + l2.., 96 + l2.. of the half (ql[l2], ql[32 + l2], qh[l2]; ggml's dequantize_row_q6_K).
#define KQ_GEMV_LANE_Q6                                                                            \
  const uint h = lane / 16, l2 = 2 * (lane % 16);                                                  \
  for (uint sb = 0; sb < n_super; ++sb) {                                                          \
    global const uchar* blk = wr + (ulong)sb * block_bytes;                                        \
    global const uchar* ql = blk + 64 * h + l2;                                                    \
    const uint a = *(global const ushort*)ql, b = *(global const ushort*)(ql + 32);                \
    const uint qh = *(global const ushort*)(blk + 128 + 32 * h + l2);                              \
    global const char* sc = (global const char*)(blk + 192 + 8 * h + l2 / 16);                     \
    const float d = vload_half(0, (global const half*)(blk + 208));                                \
    global const float* xs = x + sb * 256 + 128 * h + l2;                                          \
    float part = 0.0f;                                                                             \
    for (uint e = 0; e < 2; ++e) {                                                                 \
      const uint la = (a >> (8 * e)) & 0xFFu, lb = (b >> (8 * e)) & 0xFFu;                        \
      const uint hb = (qh >> (8 * e)) & 0xFFu;                                                     \
      part += sc[0] * (float)((int)((la & 15u) | ((hb & 3u) << 4)) - 32) * xs[e];                  \
      part += sc[2] * (float)((int)((lb & 15u) | (((hb >> 2) & 3u) << 4)) - 32) * xs[32 + e];      \
      part += sc[4] * (float)((int)((la >> 4) | (((hb >> 4) & 3u) << 4)) - 32) * xs[64 + e];       \
      part += sc[6] * (float)((int)((lb >> 4) | (((hb >> 6) & 3u) << 4)) - 32) * xs[96 + e];       \
    }                                                                                              \
    acc = mad(d, part, acc);                                                                       \
  }

// KQ_GEMV_BEGIN, a lane body, KQ_GEMV_END is work-group `grp`'s part, for the kernel's own group
// (DEFINE_GEMV_KQ) or one of a sibling segment's (matmul_siblings_gpu.cl): the same code, so the
// same bits. BLOCK_BYTES and QS_AT (the quants' offset in a super-block) may be expressions; the
// lane body accumulates a lane's part of row r into acc (between, not an argument: expanded, it
// holds commas). It reads w, w_off, k, arena, x_off, x_stride, y_off, y_stride, row_begin,
// row_end, t_begin, tok_off and rows_from_table by name.
#define KQ_GEMV_LOCALS local float partial[32 * KQ_GEMV_ROWS];
#define KQ_GEMV_BEGIN(BLOCK_BYTES, QS_AT)                                               \
  const uint lid = get_local_id(0);                                                                \
  const uint lane = lid % 32;                                                                      \
  const uint r = row_begin + grp * KQ_GEMV_ROWS + lid / 32;                                        \
  GEMV_GROUP_TOKEN                                                                                 \
  const uint n_super = k / 256;                                                                    \
  const ulong block_bytes = BLOCK_BYTES;                                                           \
  const uint qs_at = QS_AT;                                                                        \
  float acc = 0.0f;                                                                                \
  if (r < row_end) {                                                                               \
    global const uchar* wr = w + w_off + (ulong)r * n_super * block_bytes;                         \
    global const float* x = (global const float*)(arena + x_off) + (ulong)t * x_stride;
#define KQ_GEMV_END                                                                                \
  }                                                                                                \
  GEMV_LANES_SUM_STORE(acc, 32)
#define DEFINE_GEMV_KQ(NAME, LANE_BODY, QS_AT)                                                     \
  kernel __attribute__((reqd_work_group_size(32 * KQ_GEMV_ROWS, 1, 1))) void gemv_kq_##NAME(      \
      global const uchar* w, ulong w_off, uint k, global uchar* arena, ulong x_off, uint x_stride, \
      ulong y_off, uint y_stride, uint row_begin, uint row_end, uint t_begin, uint t_end,          \
      ulong tok_off, int rows_from_table) {                                                        \
    KQ_GEMV_LOCALS                                                                                 \
    const uint grp = get_group_id(0);                                                              \
    KQ_GEMV_BEGIN(KQ_BYTES_##NAME, QS_AT)                                                          \
    LANE_BODY                                                                                      \
    KQ_GEMV_END                                                                                    \
  }
DEFINE_GEMV_KQ(q4_k, KQ_GEMV_LANE_SCALED(0), 16)
DEFINE_GEMV_KQ(q5_k, KQ_GEMV_LANE_SCALED(1), 48)
DEFINE_GEMV_KQ(q6_k, KQ_GEMV_LANE_Q6, 0)
