// ---- CPU devices (PoCL, x86): Q4_0/Q8_0 weights x quantised activations, integer dots (issue 7).
//
// As llama.cpp: a matmul's input rows are first quantised per 32-value block (quantize_q8_act:
// a float scale, the quants as one or two 8-bit planes, their sums; llama.cpp's 8-bit Q8_0 or
// 16-bit quants, by the matmul's role: gpu_kernels.h), then every block dot product is an exact int32, formed 4
// products at a time (vpdpbusd: unsigned 8-bit x signed 8-bit; Q4_0 nibbles are 0..15 and Q8_0
// quants are shifted to 0..255 by XOR 0x80; the zero point times the block's quant sum,
// subtracted, makes the int exact for the signed weights; 16-bit quants are 256 * hi + lo, two
// dots). Blocks then combine in float in ONE order, the same in every kernel here:
//
//     acc = 0; for b in 0..n_blocks-1: acc = fma((float)I_b, d_w[b] * d_x[b], acc); y = acc
//
// so a token's output does not depend on how many tokens share the launch, which tile it sits
// in, or whether the GEMV or the GEMM computed it (batch invariance), and the VNNI kernels and
// the portable ones (an emulated vpdpbusd: exact ints too) give the same bits.
//
// Layout: a work-item owns 16 weight rows, one per SIMD lane, and MMI_T tokens (T = 1: the GEMV;
// larger: the GEMM, reusing each block's unpacked weights for T tokens). A block's quants of the
// 16 rows are transposed into registers (lane = row), and each 4 x-quants are broadcast to all
// lanes. Lane L holds row 4 * (L % 4) + L / 4 (the 4x4 transpose's order; self-inverse).
//
// Only for clang-compiled x86 targets (PoCL): the GPU path never builds these.
#if defined(__x86_64__) && defined(__clang__)

// A row of the quantised input, at q + token * q_row_bytes (GpuKernels::int8_row_bytes):
// plane 0 (k int8), plane 1 (k int8), n_blocks float scales d, n_blocks int32 sums of plane 0,
// n_blocks int32 sums of the block's quants (16 bits) or of plane 1 (8 bits: zeros). With
// bits = 8 (llama.cpp's Q8_0 activations) a block is q = round(x / d), d = amax / 127, in plane 0.
// With bits = 16, q = round(x / d) with d = amax / (127 * 256), split as q = 256 * q_hi + q_lo
// (q_hi in plane 0, q_lo in [-128, 127] in plane 1), so the same 8-bit dot instruction serves and
// the int dot is 256 * hi + lo.
kernel void quantize_q8_act(global const uchar* arena, ulong x_off, uint x_stride, uint k,
                            uint t_begin, uint t_end, global uchar* q, uint q_row_bytes,
                            uint bits, uint zp_shift) {
  const uint b = get_global_id(0), i = get_global_id(1);
  const uint n_blocks = k / QK;
  if (b >= n_blocks || t_begin + i >= t_end) return;
  global const float* x =
      (global const float*)(arena + x_off) + (ulong)(t_begin + i) * x_stride + b * QK;
  const float16 lo = vload16(0, x), hi = vload16(1, x);
  const float16 m16 = fmax(fabs(lo), fabs(hi));
  const float8 m8 = fmax(m16.lo, m16.hi);
  const float4 m4 = fmax(m8.lo, m8.hi);
  const float2 m2 = fmax(m4.lo, m4.hi);
  const float amax = fmax(m2.x, m2.y);
  const float d = amax / (bits == 16 ? 32512.0f : 127.0f);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  int16 q0lo = convert_int16_sat_rte(lo * id), q0hi = convert_int16_sat_rte(hi * id);
  int16 q1lo = (int16)(0), q1hi = (int16)(0);
  if (bits == 16) {  // |q| <= 32512: q_hi = floor((q + 128) / 256) is in [-127, 127]
    const int16 hlo = (q0lo + 128) >> 8, hhi = (q0hi + 128) >> 8;
    q1lo = q0lo - (hlo << 8);
    q1hi = q0hi - (hhi << 8);
    q0lo = hlo;
    q0hi = hhi;
  }
  global uchar* row = q + (ulong)i * q_row_bytes;
  vstore16(convert_char16(q0lo), 0, (global char*)(row + b * QK));
  vstore16(convert_char16(q0hi), 1, (global char*)(row + b * QK));
  vstore16(convert_char16(q1lo), 0, (global char*)(row + k + b * QK));
  vstore16(convert_char16(q1hi), 1, (global char*)(row + k + b * QK));
  ((global float*)(row + 2 * k))[b] = d;
  // Sums: plane 0's, and for 16 bits the whole quants' (256 * hi + lo: the matmul folds the
  // zero point's correction for both planes into plane 1's dot), stored as that correction:
  // -(sum << zp_shift), the weights' zero point being 1 << zp_shift (the dot's starting value).
  const int16 s0 = q0lo + q0hi, s1 = q1lo + q1hi + (s0 << 8) * (int)(bits == 16);
  const int8 t0 = s0.lo + s0.hi, t1 = s1.lo + s1.hi;
  const int4 u0 = t0.lo + t0.hi, u1 = t1.lo + t1.hi;
  ((global int*)(row + 2 * k + 4 * n_blocks))[b] = -((u0.x + u0.y + u0.z + u0.w) << zp_shift);
  ((global int*)(row + 2 * k + 8 * n_blocks))[b] = -((u1.x + u1.y + u1.z + u1.w) << zp_shift);
}

// vpdpbusd, emulated: per 32-bit lane, acc + the 4 products of u's unsigned bytes and s's signed
// bytes. Exact (no intermediate can overflow for quants), so equal to the instruction.
__attribute__((always_inline)) inline int16 dot4_portable(int16 acc, int16 u, int16 s) {
  acc += (u & 0xFF) * ((s << 24) >> 24);
  acc += ((u >> 8) & 0xFF) * ((s << 16) >> 24);
  acc += ((u >> 16) & 0xFF) * ((s << 8) >> 24);
  return acc + ((u >> 24) & 0xFF) * (s >> 24);
}
#define DOT4_portable(acc, u, s) dot4_portable((acc), (u), (s))
#define DOT4_vnni(acc, u, s) __builtin_ia32_vpdpbusd512((acc), (u), (s))
// PoCL wraps a kernel in a work-group function that carries only the device's features
// (skylake-avx512: no VNNI), so the VNNI code lives in a function of its own, not inlined.
#define MMI_TARGET_portable __attribute__((noinline))
#define MMI_TARGET_vnni __attribute__((noinline, target("avx512vnni")))

__attribute__((always_inline)) inline int16 mmi_cat4(int4 a, int4 b, int4 c, int4 d) {
  const int8 ab = __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7);
  const int8 cd = __builtin_shufflevector(c, d, 0, 1, 2, 3, 4, 5, 6, 7);
  return __builtin_shufflevector(ab, cd, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}
// 16 rows' 4 dwords (r[j]) -> w[g]: lane L = dword g of row 4 * (L % 4) + L / 4.
__attribute__((always_inline)) inline void mmi_transpose(const int4* r, int16* w) {
  const int16 z0 = mmi_cat4(r[0], r[1], r[2], r[3]), z1 = mmi_cat4(r[4], r[5], r[6], r[7]);
  const int16 z2 = mmi_cat4(r[8], r[9], r[10], r[11]), z3 = mmi_cat4(r[12], r[13], r[14], r[15]);
#define MMI_UNPACK_LO_DQ 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29
#define MMI_UNPACK_HI_DQ 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31
#define MMI_UNPACK_LO_QDQ 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29
#define MMI_UNPACK_HI_QDQ 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31
  const int16 t0 = __builtin_shufflevector(z0, z1, MMI_UNPACK_LO_DQ);
  const int16 t1 = __builtin_shufflevector(z0, z1, MMI_UNPACK_HI_DQ);
  const int16 t2 = __builtin_shufflevector(z2, z3, MMI_UNPACK_LO_DQ);
  const int16 t3 = __builtin_shufflevector(z2, z3, MMI_UNPACK_HI_DQ);
  w[0] = __builtin_shufflevector(t0, t2, MMI_UNPACK_LO_QDQ);
  w[1] = __builtin_shufflevector(t0, t2, MMI_UNPACK_HI_QDQ);
  w[2] = __builtin_shufflevector(t1, t3, MMI_UNPACK_LO_QDQ);
  w[3] = __builtin_shufflevector(t1, t3, MMI_UNPACK_HI_QDQ);
}
#define MMI_ROW_OF_LANE(L) (4 * ((L) % 4) + (L) / 4)

// A block's weights of the 16 rows as 8 unsigned-byte vectors u[g] (g = the 4-element group,
// matching x's dwords 0..7).
__attribute__((always_inline)) inline void mmi_block_q4_0(global const uchar* const* wp, ulong off,
                                                          int16* u) {
  int4 r[16];
#pragma unroll
  for (uint j = 0; j < 16; ++j) r[j] = as_int4(vload16(0, wp[j] + off + 2));
  int16 t[4];
  mmi_transpose(r, t);
#pragma unroll
  for (uint g = 0; g < 4; ++g) {  // qs byte m: element m (low nibble) and m + 16 (high)
    u[g] = t[g] & 0x0F0F0F0F;
    u[g + 4] = (t[g] >> 4) & 0x0F0F0F0F;
  }
}
__attribute__((always_inline)) inline void mmi_block_q8_0(global const uchar* const* wp, ulong off,
                                                          int16* u) {
  int4 r[16];
#pragma unroll
  for (uint part = 0; part < 2; ++part) {
#pragma unroll
    for (uint j = 0; j < 16; ++j) r[j] = as_int4(vload16(0, wp[j] + off + 2 + 16 * part));
    mmi_transpose(r, u + 4 * part);
  }
#pragma unroll
  for (uint g = 0; g < 8; ++g) u[g] ^= (int)0x80808080;  // w + 128: unsigned
}
// The 16 rows' fp16 scales of a block (lane order as the quants) as floats, exactly
// (cpu_scale_bits). 16 scalar loads: a dword gather measured slower (bench/gpu/RESULTS.md).
__attribute__((always_inline)) inline float16 mmi_scales(global const uchar* const* wp, ulong off) {
  int16 h;
#pragma unroll
  for (uint L = 0; L < 16; ++L) h[L] = *(global const short*)(wp[MMI_ROW_OF_LANE(L)] + off);
  return as_float16((h << 13) & (int)0x8FFFE000) * 0x1p112f;
}
// 16 rows read side by side are 16 streams, too many for the hardware prefetcher (a Logits
// GEMV from DRAM ran 3x slower than one row per work-item). The next work-item's 16 rows are one
// contiguous range: a few of its lines are prefetched per block of this one, in order (better
// than each row's line some blocks ahead, measured). Prefetches never fault.
__attribute__((always_inline)) inline void mmi_prefetch_lines(global const uchar* base,
                                                              uint first, uint count, uint end) {
  for (uint i = first; i < min(first + count, end); ++i)
    __asm__ volatile("prefetcht0 (%0)" : : "r"(base + (ulong)i * 64));
}

// y[t][r] for 16 rows x MMI_T tokens per work-item; the quantised input row of token t is
// q + (t - t_begin) * q_row_bytes. With rows_from_table, token t writes y row tok[t].logits_row
// (nothing for -1), as matmul.cl's kernels.
#define DEFINE_MATMUL_INT8(NAME, MMI_T, ISA, BITS)                                                 \
  MMI_TARGET_##ISA void matmul_i8_##NAME##_t##MMI_T##_##ISA##_a##BITS##_item(                      \
      global const uchar* w, ulong w_off, uint k, global uchar* arena, ulong y_off, uint y_stride, \
      uint row_begin, uint row_end, uint t_begin, uint t_end, ulong tok_off, int rows_from_table,  \
      global const uchar* q, uint q_row_bytes, uint item_rows, uint item_tokens) {                 \
    const uint r0 = row_begin + item_rows * 16;                                                    \
    const uint t0 = t_begin + item_tokens * MMI_T;                                                 \
    if (r0 >= row_end || t0 >= t_end) return;                                                      \
    global const int* tok = (global const int*)(arena + tok_off);                                  \
    int out_row[MMI_T];                                                                            \
    int any_row = 0;                                                                               \
    _Pragma("unroll") for (uint i = 0; i < MMI_T; ++i) {                                           \
      out_row[i] = t0 + i < t_end ? matmul_out_row(tok, rows_from_table, t0 + i) : -1;             \
      any_row |= out_row[i] >= 0;                                                                  \
    }                                                                                              \
    if (!any_row) return;                                                                          \
    const uint n_blocks = k / QK;                                                                  \
    const ulong row_bytes = (ulong)n_blocks * BLOCK_BYTES_##NAME;                                  \
    global const uchar* wp[16];                                                                    \
    _Pragma("unroll") for (uint j = 0; j < 16; ++j)                                                 \
      wp[j] = w + w_off + (ulong)min(r0 + j, row_end - 1) * row_bytes;                             \
    global const int* xq[MMI_T];                                                                   \
    global const float* xd[MMI_T];                                                                 \
    global const int* xs[MMI_T];                                                                   \
    const uint plane1_ints = k / 4, sums1_ints = n_blocks;                                         \
    _Pragma("unroll") for (uint i = 0; i < MMI_T; ++i) {                                           \
      global const uchar* row = q + (ulong)(min(t0 + i, t_end - 1) - t_begin) * q_row_bytes;       \
      xq[i] = (global const int*)row;                                                              \
      xd[i] = (global const float*)(row + 2 * k);                                                  \
      xs[i] = (global const int*)(row + 2 * k + 4 * n_blocks);                                     \
    }                                                                                              \
    /* The next item's rows (the next 16, one contiguous range), a few lines per block. */         \
    const uint next_rows = r0 + 16 < row_end ? min(16u, row_end - r0 - 16) : 0;                    \
    global const uchar* next_base = w + w_off + (ulong)(r0 + 16) * row_bytes;                      \
    const uint next_lines = (uint)((next_rows * row_bytes + 63) / 64);                             \
    const uint lines_per_block = (next_lines + n_blocks - 1) / n_blocks;                           \
    float16 acc[MMI_T];                                                                            \
    _Pragma("unroll") for (uint i = 0; i < MMI_T; ++i) acc[i] = (float16)(0.0f);                   \
    for (uint b = 0; b < n_blocks; ++b) {                                                          \
      mmi_prefetch_lines(next_base, b * lines_per_block, lines_per_block, next_lines);             \
      int16 u[8];                                                                                  \
      float16 dw;                                                                                  \
      mmi_block_##NAME(wp, (ulong)b * BLOCK_BYTES_##NAME, u);                                      \
      dw = mmi_scales(wp, (ulong)b * BLOCK_BYTES_##NAME);                                          \
      _Pragma("unroll") for (uint i = 0; i < MMI_T; ++i) {                                         \
        global const int* x4 = xq[i] + b * 8;                                                      \
        /* 8 bits: the zero point's correction here; 16: all of it in the low plane's dot. */      \
        int16 dot = (int16)(BITS == 16 ? 0 : xs[i][b]);                                            \
        _Pragma("unroll") for (uint g = 0; g < 8; ++g) dot = DOT4_##ISA(dot, u[g], (int16)(x4[g])); \
        if (BITS == 16) {                                                                          \
          int16 dot_lo = (int16)(xs[i][b + sums1_ints]);                                           \
          _Pragma("unroll") for (uint g = 0; g < 8; ++g)                                           \
            dot_lo = DOT4_##ISA(dot_lo, u[g], (int16)(x4[plane1_ints + g]));                       \
          dot = (dot << 8) + dot_lo;                                                               \
        }                                                                                          \
        const float16 scale = dw * xd[i][b];                                                       \
        acc[i] = fma(convert_float16(dot), scale, acc[i]);                                         \
      }                                                                                            \
    }                                                                                              \
    global float* y = (global float*)(arena + y_off);                                              \
    _Pragma("unroll") for (uint i = 0; i < MMI_T; ++i) {                                           \
      if (out_row[i] < 0) continue;                                                                \
      global float* yr = y + (ulong)out_row[i] * y_stride + r0;                                    \
      if (r0 + 16 <= row_end) {                                                                    \
        vstore16(__builtin_shufflevector(acc[i], acc[i], 0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, \
                                         7, 11, 15),                                               \
                 0, yr);                                                                           \
      } else {                                                                                     \
        _Pragma("unroll") for (uint L = 0; L < 16; ++L)                                            \
          if (r0 + MMI_ROW_OF_LANE(L) < row_end) yr[MMI_ROW_OF_LANE(L)] = acc[i][L];               \
      }                                                                                            \
    }                                                                                              \
  }                                                                                                \
  kernel void matmul_i8_##NAME##_t##MMI_T##_##ISA##_a##BITS(                                       \
      global const uchar* w, ulong w_off, uint k, global uchar* arena, ulong y_off, uint y_stride, \
      uint row_begin, uint row_end, uint t_begin, uint t_end, ulong tok_off, int rows_from_table,  \
      global const uchar* q, uint q_row_bytes) {                                                   \
    matmul_i8_##NAME##_t##MMI_T##_##ISA##_a##BITS##_item(                                          \
        w, w_off, k, arena, y_off, y_stride, row_begin, row_end, t_begin, t_end, tok_off,          \
        rows_from_table, q, q_row_bytes, get_global_id(0), get_global_id(1));                      \
  }
#define DEFINE_MATMUL_INT8_ALL(NAME, MMI_T)                                                        \
  DEFINE_MATMUL_INT8(NAME, MMI_T, portable, 8)                                                     \
  DEFINE_MATMUL_INT8(NAME, MMI_T, vnni, 8)                                                         \
  DEFINE_MATMUL_INT8(NAME, MMI_T, portable, 16)                                                    \
  DEFINE_MATMUL_INT8(NAME, MMI_T, vnni, 16)
DEFINE_MATMUL_INT8_ALL(q4_0, 1)
DEFINE_MATMUL_INT8_ALL(q4_0, 8)
DEFINE_MATMUL_INT8_ALL(q8_0, 1)
DEFINE_MATMUL_INT8_ALL(q8_0, 8)

#endif  // __x86_64__ && __clang__
