// y[t][r] = W[r] . x[t] for r in [row_begin, row_end), t in [t_begin, t_end), reading W in its
// stored type (Q4_0, Q8_0, F16, F32) and dequantising each 32-weight block in registers.
// With rows_from_table (the Logits op), token t writes y row tok[t].logits_row, or nothing
// when that is -1. y's row stride is y_stride (the full output width: split rows land in place).

inline int matmul_out_row(global const int* tok, int rows_from_table, uint t) {
  return rows_from_table ? tok[4 * t + TOK_LOGITS] : (int)t;
}

// Register-tiled: a work-item owns one weight row and MM_TN tokens, so each dequantised block
// is reused MM_TN times from registers. The generic prefill GEMM (GPUs without a packed layout
// run it); CPU devices take matmul_cpu_gemm_* below.
#define DEFINE_MATMUL_TILED(NAME, MM_TN)                                                       \
  kernel void matmul_t##MM_TN##_##NAME(global const uchar* w, ulong w_off, uint k, global uchar* arena,  \
                                  ulong x_off, uint x_stride, ulong y_off, uint y_stride,      \
                                  uint row_begin, uint row_end, uint t_begin, uint t_end,      \
                                  ulong tok_off, int rows_from_table) {                \
    const uint r = row_begin + get_global_id(0);                                               \
    const uint t0 = t_begin + get_global_id(1) * MM_TN;                                        \
    if (r >= row_end || t0 >= t_end) return;                                                   \
    const uint n_blocks = k / QK;                                                              \
    global const uchar* wr = w + w_off + (ulong)r * n_blocks * BLOCK_BYTES_##NAME;              \
    global const float* x = (global const float*)(arena + x_off);                              \
    global const int* tok = (global const int*)(arena + tok_off);                              \
    int out_row[MM_TN];                                                                        \
    float16 acc[MM_TN];                                                                        \
    for (uint i = 0; i < MM_TN; ++i) {                                                         \
      out_row[i] = (t0 + i < t_end) ? matmul_out_row(tok, rows_from_table, t0 + i) : -1;       \
      acc[i] = (float16)(0.0f);                                                                \
    }                                                                                          \
    for (uint b = 0; b < n_blocks; ++b) {                                                      \
      float16 lo, hi;                                                                          \
      load_block_at_##NAME(wr, b, &lo, &hi);                                                     \
      for (uint i = 0; i < MM_TN; ++i) {                                                       \
        if (out_row[i] < 0) continue;                                                          \
        global const float* xb = x + (ulong)(t0 + i) * x_stride + b * QK;                      \
        acc[i] = mad(lo, vload16(0, xb), acc[i]);                                              \
        acc[i] = mad(hi, vload16(1, xb), acc[i]);                                              \
      }                                                                                        \
    }                                                                                          \
    global float* y = (global float*)(arena + y_off);                                          \
    for (uint i = 0; i < MM_TN; ++i)                                                           \
      if (out_row[i] >= 0) y[(ulong)out_row[i] * y_stride + r] = sum16(acc[i]);                \
  }
DEFINE_MATMUL_TILED(q4_0, 8)
DEFINE_MATMUL_TILED(q8_0, 8)
DEFINE_MATMUL_TILED(f16, 8)
DEFINE_MATMUL_TILED(f32, 8)

// ---- CPU devices (PoCL): a work-item runs as 16-wide SIMD code (AVX-512 here), so the
// kernels below keep a whole weight block in one float16 and count instructions per block.

// The scale of a Q4_0/Q8_0 block, in all 16 lanes. PoCL's vload_half is a long scalar
// sequence; this is three integer ops, a broadcast from an integer register and a multiply:
// the sign-extended half shifted into float position (sign at bit 31, exponent and mantissa at
// 27..13) is the value times 2^-112, exactly, for every finite half including subnormals and 0.
inline int cpu_scale_bits(global const uchar* p) {  // the scale times 2^-112, as float bits
  const int h = *(global const short*)p;
  return (h << 13) & (int)0x8FFFE000;
}
inline float16 cpu_block_scale(global const uchar* p) {
  return as_float16((int16)(cpu_scale_bits(p))) * 0x1p112f;
}
// A block's 32 weights as two float16 (elements 0..15 and 16..31): cpu_values_* unscaled (the
// GEMV scales a block's dot product once), cpu_block_* scaled (the GEMM reuses the block).
#if defined(__AVX512F__)
// AVX-512 (PoCL on x86 defines it): the 16 possible Q4_0 weights form a 16-float table, and
// vpermps picks an entry per lane by the low 4 bits of a zero-extended quant byte: the low
// nibble needs no mask, the zero point and the int -> float conversion cost nothing.
#define Q4_0_TABLE \
  (float16)(-8.f, -7.f, -6.f, -5.f, -4.f, -3.f, -2.f, -1.f, 0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f)
inline void cpu_values_q4_0(global const uchar* p, float16* lo, float16* hi) {
  const int16 q = convert_int16(vload16(0, p + 2));
  *lo = __builtin_ia32_permvarsf512(Q4_0_TABLE, q);
  *hi = __builtin_ia32_permvarsf512(Q4_0_TABLE, q >> 4);
}
// The GEMM scales the table instead (16 multiplies, not 32). 2^112 in the table undoes
// cpu_scale_bits' 2^-112 exactly: (i - 8) * d is exact in float, and PoCL does not flush
// denormal inputs (checked), so subnormal scales stay exact too.
inline void cpu_block_q4_0(global const uchar* p, float16* lo, float16* hi) {
  const float16 table = Q4_0_TABLE * 0x1p112f * as_float16((int16)(cpu_scale_bits(p)));
  const int16 q = convert_int16(vload16(0, p + 2));
  *lo = __builtin_ia32_permvarsf512(table, q);
  *hi = __builtin_ia32_permvarsf512(table, q >> 4);
}
#else
// Portable: int -> float by OR-ing the nibble into the mantissa of 2^23 (Transformer-Lite's
// trick), the zero point folded into the subtraction.
inline void cpu_values_q4_0(global const uchar* p, float16* lo, float16* hi) {
  const uint16 q = convert_uint16(vload16(0, p + 2));
  *lo = as_float16((q & 15u) | 0x4B000000u) - 8388616.0f;
  *hi = as_float16((q >> 4) | 0x4B000000u) - 8388616.0f;
}
inline void cpu_block_q4_0(global const uchar* p, float16* lo, float16* hi) {
  const float16 d = cpu_block_scale(p);
  cpu_values_q4_0(p, lo, hi);
  *lo *= d;
  *hi *= d;
}
#endif
inline void cpu_values_q8_0(global const uchar* p, float16* lo, float16* hi) {
  *lo = convert_float16(vload16(0, (global const char*)(p + 2)));
  *hi = convert_float16(vload16(1, (global const char*)(p + 2)));
}
inline void cpu_block_q8_0(global const uchar* p, float16* lo, float16* hi) {
  const float16 d = cpu_block_scale(p);
  cpu_values_q8_0(p, lo, hi);
  *lo *= d;
  *hi *= d;
}
#define cpu_block_f16 load_block_f16
#define cpu_block_f32 load_block_f32
#define cpu_block_at_q4_0(wr, b, lo, hi) cpu_block_q4_0(BLOCK_AT(q4_0, wr, b), lo, hi)
#define cpu_block_at_q8_0(wr, b, lo, hi) cpu_block_q8_0(BLOCK_AT(q8_0, wr, b), lo, hi)
#define cpu_block_at_f16(wr, b, lo, hi) cpu_block_f16(BLOCK_AT(f16, wr, b), lo, hi)
#define cpu_block_at_f32(wr, b, lo, hi) cpu_block_f32(BLOCK_AT(f32, wr, b), lo, hi)

// acc += block . x[32], per lane (the GEMV's step). Quantised types scale the block's 16-lane
// dot product once (one FMA) instead of scaling every weight.
#define DEFINE_CPU_DOT_QUANT(NAME)                                                                \
  inline float16 cpu_dot_##NAME(global const uchar* p, global const float* x, float16 acc) {     \
    float16 lo, hi;                                                                               \
    cpu_values_##NAME(p, &lo, &hi);                                                               \
    const float16 d = cpu_block_scale(p);                                                         \
    return fma(fma(hi, vload16(1, x), lo * vload16(0, x)), d, acc);                               \
  }
DEFINE_CPU_DOT_QUANT(q4_0)
DEFINE_CPU_DOT_QUANT(q8_0)

// GEMV (decode): one weight row and one token per work-item, walking the row's blocks in
// order (one sequential stream per work-item: several rows per work-item interleave streams
// and measured 2x slower from DRAM here), two blocks per step into two accumulators so the
// FMA chains overlap. Also the generic one-token kernel on GPUs without the coop path.
#define DEFINE_MATMUL_GEMV(NAME)                                                                     \
  kernel void matmul_t1_##NAME(global const uchar* w, ulong w_off, uint k, global uchar* arena,      \
                               ulong x_off, uint x_stride, ulong y_off, uint y_stride, uint row_begin, \
                               uint row_end, uint t_begin, uint t_end, ulong tok_off,                \
                               int rows_from_table) {                                                \
    const uint r = row_begin + get_global_id(0);                                                     \
    const uint t = t_begin + get_global_id(1);                                                       \
    if (r >= row_end || t >= t_end) return;                                                          \
    const int out_row = matmul_out_row((global const int*)(arena + tok_off), rows_from_table, t);    \
    if (out_row < 0) return;                                                                         \
    const uint n_blocks = k / QK;                                                                    \
    global const uchar* wr = w + w_off + (ulong)r * n_blocks * BLOCK_BYTES_##NAME;                   \
    global const float* x = (global const float*)(arena + x_off) + (ulong)t * x_stride;              \
    float16 acc0 = (float16)(0.0f), acc1 = (float16)(0.0f);                                          \
    uint b = 0;                                                                                      \
    for (; b + 2 <= n_blocks; b += 2) {                                                              \
      acc0 = cpu_dot_##NAME(wr + (ulong)b * BLOCK_BYTES_##NAME, x + b * QK, acc0);                   \
      acc1 = cpu_dot_##NAME(wr + (ulong)(b + 1) * BLOCK_BYTES_##NAME, x + (b + 1) * QK, acc1);       \
    }                                                                                                \
    if (b < n_blocks) acc0 = cpu_dot_##NAME(wr + (ulong)b * BLOCK_BYTES_##NAME, x + b * QK, acc0);   \
    ((global float*)(arena + y_off))[(ulong)out_row * y_stride + r] = sum16(acc0 + acc1);            \
  }
DEFINE_MATMUL_GEMV(q4_0)
DEFINE_MATMUL_GEMV(q8_0)

// F16/F32: one accumulator, each block's two FMAs in the GEMM's order (matmul_cpu_gemm_*), so
// a token's output has the same bits from the GEMV and from any GEMM tile (batch invariance;
// the Q4_0/Q8_0 fp32 kernels above are not, matmul_int8.cl is).
#define DEFINE_MATMUL_GEMV_INVARIANT(NAME)                                                         \
  kernel void matmul_t1_##NAME(global const uchar* w, ulong w_off, uint k, global uchar* arena,      \
                               ulong x_off, uint x_stride, ulong y_off, uint y_stride, uint row_begin, \
                               uint row_end, uint t_begin, uint t_end, ulong tok_off,                \
                               int rows_from_table) {                                                \
    const uint r = row_begin + get_global_id(0);                                                     \
    const uint t = t_begin + get_global_id(1);                                                       \
    if (r >= row_end || t >= t_end) return;                                                          \
    const int out_row = matmul_out_row((global const int*)(arena + tok_off), rows_from_table, t);    \
    if (out_row < 0) return;                                                                         \
    const uint n_blocks = k / QK;                                                                    \
    global const uchar* wr = w + w_off + (ulong)r * n_blocks * BLOCK_BYTES_##NAME;                   \
    global const float* x = (global const float*)(arena + x_off) + (ulong)t * x_stride;              \
    float16 acc = (float16)(0.0f);                                                                   \
    for (uint b = 0; b < n_blocks; ++b) {                                                            \
      float16 lo, hi;                                                                                \
      cpu_block_at_##NAME(wr, b, &lo, &hi);                                                       \
      acc = fma(hi, vload16(1, x + b * QK), fma(lo, vload16(0, x + b * QK), acc));                   \
    }                                                                                                \
    ((global float*)(arena + y_off))[(ulong)out_row * y_stride + r] = sum16(acc);                    \
  }
DEFINE_MATMUL_GEMV_INVARIANT(f16)
DEFINE_MATMUL_GEMV_INVARIANT(f32)

// GEMM (prefill) on CPUs: a work-item owns a tile of CPU_GEMM_ROWS weight rows x
// CPU_GEMM_TOKENS tokens (18 float16 accumulators of AVX-512's 32 registers), so each
// dequantised block serves CPU_GEMM_TOKENS tokens and each loaded x block CPU_GEMM_ROWS rows.
// 3x6 measured best of 2x8..4x6 here (more accumulators spill). Edge tiles clamp their row and
// token indices (computing a duplicate) and store only what is theirs.
#define CPU_GEMM_ROWS 3    // kCpuGemmRows in GpuKernels::matmul_cpu
#define CPU_GEMM_TOKENS 6  // kCpuGemmTokens in GpuKernels::matmul_cpu
#define DEFINE_MATMUL_CPU_GEMM(NAME)                                                                 \
  kernel void matmul_cpu_gemm_##NAME(global const uchar* w, ulong w_off, uint k, global uchar* arena, \
                                     ulong x_off, uint x_stride, ulong y_off, uint y_stride,         \
                                     uint row_begin, uint row_end, uint t_begin, uint t_end,         \
                                     ulong tok_off, int rows_from_table) {                           \
    const uint r0 = row_begin + get_global_id(0) * CPU_GEMM_ROWS;                                    \
    const uint t0 = t_begin + get_global_id(1) * CPU_GEMM_TOKENS;                                    \
    if (r0 >= row_end || t0 >= t_end) return;                                                        \
    /* A tile whose tokens have no output row (Logits during prefill: all but the last token) */     \
    /* costs nothing: only a tile with one computes (its other tokens ride along). */                \
    global const int* tok = (global const int*)(arena + tok_off);                                    \
    int out_row[CPU_GEMM_TOKENS];                                                                    \
    int any_row = 0;                                                                                 \
    _Pragma("unroll") for (uint i = 0; i < CPU_GEMM_TOKENS; ++i) {                                   \
      out_row[i] = t0 + i < t_end ? matmul_out_row(tok, rows_from_table, t0 + i) : -1;              \
      any_row |= out_row[i] >= 0;                                                                    \
    }                                                                                                \
    if (!any_row) return;                                                                            \
    const uint n_blocks = k / QK;                                                                    \
    const ulong row_bytes = (ulong)n_blocks * BLOCK_BYTES_##NAME;                                    \
    global const uchar* wr[CPU_GEMM_ROWS];                                                           \
    _Pragma("unroll") for (uint j = 0; j < CPU_GEMM_ROWS; ++j)                                       \
      wr[j] = w + w_off + (ulong)min(r0 + j, row_end - 1) * row_bytes;                               \
    global const float* xt[CPU_GEMM_TOKENS];                                                         \
    _Pragma("unroll") for (uint i = 0; i < CPU_GEMM_TOKENS; ++i)                                     \
      xt[i] = (global const float*)(arena + x_off) + (ulong)min(t0 + i, t_end - 1) * x_stride;       \
    float16 acc[CPU_GEMM_ROWS][CPU_GEMM_TOKENS];                                                     \
    _Pragma("unroll") for (uint j = 0; j < CPU_GEMM_ROWS; ++j)                                       \
      _Pragma("unroll") for (uint i = 0; i < CPU_GEMM_TOKENS; ++i) acc[j][i] = (float16)(0.0f);      \
    for (uint b = 0; b < n_blocks; ++b) {                                                            \
      float16 lo[CPU_GEMM_ROWS], hi[CPU_GEMM_ROWS];                                                  \
      _Pragma("unroll") for (uint j = 0; j < CPU_GEMM_ROWS; ++j)                                     \
        cpu_block_at_##NAME(wr[j], b, &lo[j], &hi[j]);                                            \
      _Pragma("unroll") for (uint i = 0; i < CPU_GEMM_TOKENS; ++i) {                                 \
        const float16 xl = vload16(0, xt[i] + b * QK), xh = vload16(1, xt[i] + b * QK);              \
        _Pragma("unroll") for (uint j = 0; j < CPU_GEMM_ROWS; ++j)                                   \
          acc[j][i] = fma(hi[j], xh, fma(lo[j], xl, acc[j][i]));                                     \
      }                                                                                              \
    }                                                                                                \
    global float* y = (global float*)(arena + y_off);                                                \
    _Pragma("unroll") for (uint i = 0; i < CPU_GEMM_TOKENS; ++i) {                                   \
      if (out_row[i] < 0) continue;                                                                  \
      _Pragma("unroll") for (uint j = 0; j < CPU_GEMM_ROWS; ++j)                                     \
        if (r0 + j < row_end) y[(ulong)out_row[i] * y_stride + r0 + j] = sum16(acc[j][i]);           \
    }                                                                                                \
  }
DEFINE_MATMUL_CPU_GEMM(q4_0)
DEFINE_MATMUL_CPU_GEMM(q8_0)
DEFINE_MATMUL_CPU_GEMM(f16)
DEFINE_MATMUL_CPU_GEMM(f32)

// The GPU GEMVs (file and packed layouts) are in matmul_gpu.cl.
