// ---- CPU devices (PoCL, x86): K-quant weights (Q4_K, Q5_K, Q6_K) x quantised activations,
// integer dots (issue 19). The scheme of matmul_int8.cl, whose helpers and quantised input
// (quantize_q8_act, zp_shift 0: MMI_SUMS* hold minus the plain quant sums) these kernels use.
//
// ggml's super-blocks of 256 weights (core/quant.h, ggml-common.h) per row:
//   Q4_K 144 B: fp16 d, dmin; scales[12] (8 six-bit scales sc_j and mins m_j, packed as
//        get_scale_min_k4); qs[128]: sub-block j (32 weights) is the low (j even) or high (j odd)
//        nibbles of qs[32 (j / 2) .. + 32]; weight = d sc_j q - dmin m_j, q in 0..15.
//   Q5_K 176 B: as Q4_K with qh[32] before qs: bit j of qh[l] is bit 4 of sub-block j's q_l.
//   Q6_K 210 B: ql[128], qh[64], int8 scales[16] (one per 16 weights), fp16 d; 32-weight chunk
//        c = 4h + cc (half h of 128) is ql[64h + 32 (cc & 1) ..]'s low (cc < 2) or high nibbles
//        with bits 2cc..2cc+1 of qh[32h ..] above them; weight = d sc_s (q - 32), q in 0..63.
// An activation block of 32 values is a weight sub-block (Q6_K: two scales of 16), so each
// sub-block's dot is an exact int32 (unsigned quants x signed activations, vpdpbusd), and the
// floats combine per sub-block in ONE order, emulated bit for bit by the tests:
//   Q4_K/Q5_K: acc = fma((float)I_j, (d sc_j) dx, acc); acc = fma((float)-S_j, (dmin m_j) dx, acc)
//   Q6_K:      per 16-value half e: acc = fma((float)(I_e - 32 S_e), (d sc_s) dx, acc)
// (I: the int dot, S: the activation quants' sum, dx: the activation block's scale; d sc_j and
// dmin m_j are exact in float). So a token's output does not depend on the launch (batch
// invariance), and VNNI and portable kernels give the same bits.
//
// A work-item owns 16 rows (one per lane, MMI_ROW_OF_LANE order) and MMI_T tokens, as
// matmul_int8.cl's kernels. Each piece of the 16 rows' super-blocks it needs is a set of lane
// vectors (lane = row, dword v of each row's bytes): in the file's layout ("_file") transposed
// from the rows (16-byte pieces, mmi_transpose); in the tiled copy ("_tiled", tiled_weights.h:
// the super-blocks' bytes transposed dword by dword at load) read as they are.
#if defined(__x86_64__) && defined(__clang__)

#define BLOCK_BYTES_q4_k 144
#define BLOCK_BYTES_q5_k 176
#define BLOCK_BYTES_q6_k 210
#define TILED_BYTES_q4_k 2304  // 64 * ceil(bytes / 4): tiled_block_bytes()
#define TILED_BYTES_q5_k 2816
#define TILED_BYTES_q6_k 3392

// The 16 rows' 16 bytes at byte `at` of their super-block (row j at w + j * row_bytes), as 4 lane
// vectors (dword g of each row's 16 bytes).
__attribute__((always_inline)) inline void kq_rows16(global const uchar* w, ulong row_bytes,
                                                     uint n_rows, uint at, int16* t) {
  int4 r[16];
#pragma unroll
  for (uint j = 0; j < 16; ++j) r[j] = as_int4(vload16(0, MMI_ROW(w, j, n_rows, row_bytes) + at));
  mmi_transpose(r, t);
}
// The lane vectors of bytes [at, at + 16) (at a multiple of 4) of the 16 rows' super-block: w is
// row 0's super-block (file layout) or the group's tiled super-block (tiled).
__attribute__((always_inline)) inline void kq_v4(global const uchar* w, ulong row_bytes,
                                                 uint n_rows, uint at, int tiled, int16* t) {
  if (tiled) {
#pragma unroll
    for (uint g = 0; g < 4; ++g) t[g] = vload16(at / 4 + g, (global const int*)w);
  } else {
    kq_rows16(w, row_bytes, n_rows, at, t);
  }
}
// 32 bytes from `at`: 8 lane vectors.
__attribute__((always_inline)) inline void kq_v8(global const uchar* w, ulong row_bytes,
                                                 uint n_rows, uint at, int tiled, int16* t) {
  kq_v4(w, row_bytes, n_rows, at, tiled, t);
  kq_v4(w, row_bytes, n_rows, at + 16, tiled, t + 4);
}
// The 16 rows' int16 at byte `at` (even), sign-extended, lane order.
__attribute__((always_inline)) inline int16 kq_s16(global const uchar* w, ulong row_bytes,
                                                   uint n_rows, uint at, int tiled) {
  if (tiled) return (vload16(at / 4, (global const int*)w) << (16 - 8 * (at % 4))) >> 16;
  int16 h;
#pragma unroll
  for (uint L = 0; L < 16; ++L)
    h[L] = *(global const short*)(MMI_ROW(w, MMI_ROW_OF_LANE(L), n_rows, row_bytes) + at);
  return h;
}

// Q4_K/Q5_K: sub-block j's scale d sc_j and min dmin m_j, per lane, from the 16-byte header
// (d | dmin << 16, then scales[0..3], [4..7], [8..11]) as lane vectors h[4].
__attribute__((always_inline)) inline void kq_scale_min(const int16* h, uint j, float16* ws,
                                                        float16* wm) {
  int16 sc, m;
  if (j < 4) {
    sc = (h[1] >> (8 * j)) & 63;
    m = (h[2] >> (8 * j)) & 63;
  } else {
    const uint s = 8 * (j - 4);
    sc = ((h[3] >> s) & 0xF) | (((h[1] >> (s + 6)) & 3) << 4);
    m = ((h[3] >> (s + 4)) & 0xF) | (((h[2] >> (s + 6)) & 3) << 4);
  }
  *ws = mmi_fp16_to_float((h[0] << 16) >> 16) * convert_float16(sc);
  *wm = mmi_fp16_to_float(h[0] >> 16) * convert_float16(m);
}
// Sub-block quants of the 16 rows as unsigned-byte lane vectors u[g] (weights 4g..4g+3), from
// lane vectors loaded once and shared: Q4_K's sub-blocks 2p and 2p+1 are the low and high nibbles
// of the same 32 bytes t (Q5_K: with bit j of the 32 qh bytes hb, loaded once per super-block).
#define KQ_QS_AT_q4_k 16
#define KQ_QS_AT_q5_k 48
#define KQ_SUPER_LOAD_q4_k(N_ROWS, TILED)
#define KQ_SUPER_LOAD_q5_k(N_ROWS, TILED) \
  int16 hb[8];                             \
  kq_v8(wb, row_bytes, N_ROWS, 16, TILED, hb);
#define KQ_QUANTS_q4_k(j) \
  _Pragma("unroll") for (uint g = 0; g < 8; ++g) u[g] = (t[g] >> (4 * ((j) & 1))) & 0x0F0F0F0F;
#define KQ_QUANTS_q5_k(j)                                               \
  _Pragma("unroll") for (uint g = 0; g < 8; ++g) u[g] =                 \
      ((t[g] >> (4 * ((j) & 1))) & 0x0F0F0F0F) | (((hb[g] >> (j)) & 0x01010101) << 4);

// The int dots are matmul_int8.cl's MMI_DOTS, token i's activation scale its MMI_TOK_DX. Minus the
// activation block's quant sum (zp_shift 0), and of its first 16:
#define KQ_NEG_SUM(MMI_T, i, BITS) MMI_TOK_INT(MMI_T, i, BITS == 16 ? MMI_SUMS1 : MMI_SUMS0)
#define KQ_NEG_HALF(MMI_T, i) MMI_TOK_INT(MMI_T, i, MMI_HALF_SUMS)

// One-token items unroll a super-block's loops, so the scale picks and shifts are constants: a
// llama3.2-1b Q4_K_M decode token's GEMVs 18.1-18.8 ms against 20.8-21.1 rolled (decode_gemv,
// 2026-12-07, Zen 5; the Q4_K ones alone 11.2-11.5 against 12.8-13.1). 8-token items keep them
// rolled (unrolled, a token's 8-token GEMMs measured 42.5 against 39.8 ms: no faster).
#define KQ_UNROLL_T1 _Pragma("unroll")
#define KQ_UNROLL_T8
#define KQ_UNROLL_T16
// Q4_K/Q5_K: the 8 sub-blocks of super-block sb, the quant bytes of each pair loaded once.
#define KQ_SUPER_SCALED(NAME, MMI_T, ISA, BITS, N_ROWS, TILED)                                    \
  {                                                                                                \
    int16 h[4];                                                                                    \
    kq_v4(wb, row_bytes, N_ROWS, 0, TILED, h);                                                     \
    KQ_SUPER_LOAD_##NAME(N_ROWS, TILED)                                                            \
    KQ_UNROLL_T##MMI_T for (uint p = 0; p < 4; ++p) {                                              \
      int16 t[8];                                                                                  \
      kq_v8(wb, row_bytes, N_ROWS, KQ_QS_AT_##NAME + 32 * p, TILED, t);                            \
      _Pragma("unroll") for (uint odd = 0; odd < 2; ++odd) {                                       \
        const uint j = 2 * p + odd;                                                                \
        float16 ws, wm;                                                                            \
        kq_scale_min(h, j, &ws, &wm);                                                              \
        int16 u[8];                                                                                \
        KQ_QUANTS_##NAME(j)                                                                        \
        global const uchar* group = groups + (ulong)(sb * 8 + j) * MMI_GROUP_BYTES;                \
        MMI_DOTS(MMI_T, ISA, BITS, 0, 8, 0)                                                        \
        _Pragma("unroll") for (uint i = 0; i < MMI_T; ++i) {                                       \
          const float dx = MMI_TOK_DX(MMI_T, i);                                                   \
          acc[i] = fma(convert_float16(MMI_INT(i, BITS)), ws * dx, acc[i]);                        \
          acc[i] = fma((float16)((float)KQ_NEG_SUM(MMI_T, i, BITS)), wm * dx, acc[i]);             \
        }                                                                                          \
      }                                                                                            \
    }                                                                                              \
  }
#define KQ_SUPER_q4_k(MMI_T, ISA, BITS, N_ROWS, TILED) \
  KQ_SUPER_SCALED(q4_k, MMI_T, ISA, BITS, N_ROWS, TILED)
#define KQ_SUPER_q5_k(MMI_T, ISA, BITS, N_ROWS, TILED) \
  KQ_SUPER_SCALED(q5_k, MMI_T, ISA, BITS, N_ROWS, TILED)
// Q6_K: the 8 chunks of super-block sb, each two halves of 16 with their own scale; the zero
// point 32 as -32 times the half's activation quant sum, the dot's starting value. d and the 16
// scales are read once per super-block; the four chunks of a 128-weight half share its 32 qh
// bytes and two 32-byte ql runs (low nibbles: chunks 0, 1; high: 2, 3), each loaded once.
#define KQ_SUPER_q6_k(MMI_T, ISA, BITS, N_ROWS, TILED)                                            \
  {                                                                                                \
    const float16 d6 = mmi_fp16_to_float(kq_s16(wb, row_bytes, N_ROWS, 208, TILED));               \
    int16 sc[4];                                                                                   \
    kq_v4(wb, row_bytes, N_ROWS, 192, TILED, sc);                                                  \
    KQ_UNROLL_T##MMI_T for (uint h6 = 0; h6 < 2; ++h6) {                                      \
      int16 lo0[8], lo1[8], hb[8];                                                                 \
      kq_v8(wb, row_bytes, N_ROWS, 64 * h6, TILED, lo0);                                         \
      kq_v8(wb, row_bytes, N_ROWS, 64 * h6 + 32, TILED, lo1);                                    \
      kq_v8(wb, row_bytes, N_ROWS, 128 + 32 * h6, TILED, hb);                                    \
      _Pragma("unroll") for (uint cc = 0; cc < 4; ++cc) {                                          \
        const uint c = 4 * h6 + cc;                                                              \
        const int16 sw = sc[c / 2] >> (16 * (c % 2));                                              \
        const float16 s0 = d6 * convert_float16((sw << 24) >> 24);                                 \
        const float16 s1 = d6 * convert_float16((sw << 16) >> 24);                                 \
        int16 u[8];                                                                                \
        _Pragma("unroll") for (uint g = 0; g < 8; ++g) u[g] =                                      \
            (((cc & 1 ? lo1[g] : lo0[g]) >> (4 * (cc >> 1))) & 0x0F0F0F0F) |                       \
            (((hb[g] >> (2 * cc)) & 0x03030303) << 4);                                             \
        global const uchar* group = groups + (ulong)(sb * 8 + c) * MMI_GROUP_BYTES;                \
        {                                                                                          \
          MMI_DOTS(MMI_T, ISA, BITS, 0, 4, KQ_NEG_HALF(MMI_T, i) << 5)                             \
          _Pragma("unroll") for (uint i = 0; i < MMI_T; ++i) acc[i] =                              \
              fma(convert_float16(MMI_INT(i, BITS)), s0 * MMI_TOK_DX(MMI_T, i), acc[i]);           \
        }                                                                                          \
        {                                                                                          \
          MMI_DOTS(MMI_T, ISA, BITS, 4, 8,                                                         \
                   (KQ_NEG_SUM(MMI_T, i, BITS) - KQ_NEG_HALF(MMI_T, i)) << 5)                      \
          _Pragma("unroll") for (uint i = 0; i < MMI_T; ++i) acc[i] =                              \
              fma(convert_float16(MMI_INT(i, BITS)), s1 * MMI_TOK_DX(MMI_T, i), acc[i]);           \
        }                                                                                          \
      }                                                                                            \
    }                                                                                              \
  }

// The file layout's item: 16 rows from row_begin + 16 item_rows (N_ROWS of them valid in the
// last), prefetching the next item's rows (one contiguous range) a few lines per super-block.
#define KQ_LOOP_file(NAME, MMI_T, ISA, BITS, N_ROWS)                                               \
  for (uint sb = 0; sb < n_super; ++sb) {                                                          \
    mmi_prefetch_lines(next_base + (ulong)sb * lines_per_super * 64, lines_per_super);             \
    global const uchar* wb = w_item + (ulong)sb * BLOCK_BYTES_##NAME;                              \
    KQ_SUPER_##NAME(MMI_T, ISA, BITS, N_ROWS, 0)                                                   \
  }
#define KQ_ITEM_file(NAME, MMI_T, ISA, BITS)                                                       \
  const uint r0 = row_begin + item_rows * 16;                                                      \
  MMI_ITEM_START(NAME, MMI_T, ISA)                                                                 \
  const uint n_super = k / 256;                                                                    \
  const ulong row_bytes = (ulong)n_super * BLOCK_BYTES_##NAME;                                     \
  global const uchar* w_item = w + w_off + (ulong)r0 * row_bytes;                                  \
  const uint next_rows = r0 + 16 < row_end ? min(16u, row_end - r0 - 16) : 0;                      \
  global const uchar* next_base = w_item + 16 * row_bytes;                                         \
  const uint next_lines = (uint)((next_rows * row_bytes + 63) / 64);                               \
  const uint lines_per_super = (next_lines + n_super - 1) / n_super;                               \
  if (r0 + 16 <= row_end) {                                                                        \
    KQ_LOOP_file(NAME, MMI_T, ISA, BITS, 16u)                                                      \
  } else {                                                                                         \
    KQ_LOOP_file(NAME, MMI_T, ISA, BITS, row_end - r0)                                             \
  }
// The tiled layout's item: its 16-row groups from the one holding row_begin (w: the whole
// tensor's copy, w_off 0). A tensor's copy is one ascending stream, and every K type prefetches
// the super-block 4 ahead of the one it reads into L2 (prefetcht2, one per line; past an item's
// end that is the next item's start, past the tensor's end nothing: prefetches never fault).
// Q6_K reads d and the scales at its super-block's end first, then jumps back, so the hardware
// prefetcher loses its stream: 2.5x the CPU time without (bench/kquant/RESULTS.md, 2026-11-26;
// t0 and nta ahead, or the next group: no better than none; the same prefetches unrolled: 1.8x).
// Q4_K and Q5_K read front to back and were left to the hardware prefetcher until 2026-11-28:
// on a host whose two cores read ~30 GB/s it keeps their 16-row streams short of that (a
// llama3.2-1b Q4_K_M decode token's GEMVs, decode_gemv: 33.5-39.2 ms, median 36.2, without;
// 27.9-30.4 with, one outlier 40.9; Q5_K's 39-47 against 30-39; 8 or 16 ahead no better).
#define KQ_PREFETCH(NAME, wb) MMI_PREFETCH_L2((wb) + 4 * TILED_BYTES_##NAME, TILED_BYTES_##NAME)
#define KQ_ITEM_tiled(NAME, MMI_T, ISA, BITS)                                                      \
  const uint r0 = (row_begin & ~15u) + item_rows * 16;                                             \
  MMI_ITEM_START(NAME, MMI_T, ISA)                                                                 \
  const uint n_super = k / 256;                                                                    \
  const ulong row_bytes = 0;                                                                       \
  global const uchar* w_item = w + (ulong)(r0 / 16) * n_super * TILED_BYTES_##NAME;                \
  for (uint sb = 0; sb < n_super; ++sb) {                                                          \
    global const uchar* wb = w_item + (ulong)sb * TILED_BYTES_##NAME;                              \
    KQ_PREFETCH(NAME, wb)                                                                          \
    KQ_SUPER_##NAME(MMI_T, ISA, BITS, 16u, 1)                                                      \
  }

// The kernels: matmul_int8.cl's DEFINE_MATMUL_INT8 over the KQ_ITEM bodies above.
DEFINE_MATMUL_INT8_ALL(KQ_ITEM, q4_k, 1, file)
DEFINE_MATMUL_INT8_ALL(KQ_ITEM, q4_k, 8, file)  // half a tile
DEFINE_MATMUL_INT8_ALL(KQ_ITEM, q5_k, 1, file)
DEFINE_MATMUL_INT8_ALL(KQ_ITEM, q5_k, 8, file)
DEFINE_MATMUL_INT8_ALL(KQ_ITEM, q6_k, 1, file)
DEFINE_MATMUL_INT8_ALL(KQ_ITEM, q6_k, 8, file)
DEFINE_MATMUL_INT8_ALL(KQ_ITEM, q4_k, 1, tiled)
DEFINE_MATMUL_INT8_ALL(KQ_ITEM, q4_k, 8, tiled)
DEFINE_MATMUL_INT8_ALL(KQ_ITEM, q5_k, 1, tiled)
DEFINE_MATMUL_INT8_ALL(KQ_ITEM, q5_k, 8, tiled)
DEFINE_MATMUL_INT8_ALL(KQ_ITEM, q6_k, 1, tiled)
DEFINE_MATMUL_INT8_ALL(KQ_ITEM, q6_k, 8, tiled)
DEFINE_MATMUL_INT8_AMX(KQ_ITEM, q4_k, file)
DEFINE_MATMUL_INT8_AMX(KQ_ITEM, q5_k, file)
DEFINE_MATMUL_INT8_AMX(KQ_ITEM, q6_k, file)
DEFINE_MATMUL_INT8_AMX(KQ_ITEM, q4_k, tiled)
DEFINE_MATMUL_INT8_AMX(KQ_ITEM, q5_k, tiled)
DEFINE_MATMUL_INT8_AMX(KQ_ITEM, q6_k, tiled)

#endif  // __x86_64__ && __clang__
