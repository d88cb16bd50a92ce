// y[t][r] = W[r] . x[t] for r in [row_begin, row_end), t in [t_begin, t_end), reading W in its
// stored type (Q4_0, Q8_0, F16, F32) and dequantising each 32-weight block in registers.
// With rows_from_table (the Logits op), token t writes y row tok[t].logits_row, or nothing
// when that is -1. y's row stride is y_stride (the full output width: split rows land in place).

#ifndef GEMV_LWS
#define GEMV_LWS 16  // work-items cooperating on one output row in the GPU GEMV
#endif
#ifndef GEMV_ROWS
#define GEMV_ROWS 16  // output rows per work-group in the GPU GEMV
#endif

inline int matmul_out_row(global const int* tok, int rows_from_table, uint t) {
  return rows_from_table ? tok[4 * t + TOK_LOGITS] : (int)t;
}

// Register-tiled: a work-item owns one weight row and MM_TN tokens, so each dequantised block
// is reused MM_TN times from registers (prefill GEMM); with one token it is a plain GEMV. Suits
// CPU devices (PoCL) where a work-item runs as wide SIMD code.
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
      load_block_##NAME(wr + (ulong)b * BLOCK_BYTES_##NAME, &lo, &hi);                         \
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
// 8 tokens per work-item for prefill, 1 for decode (no idle token slots in the inner loop).
DEFINE_MATMUL_TILED(q4_0, 8)
DEFINE_MATMUL_TILED(q8_0, 8)
DEFINE_MATMUL_TILED(f16, 8)
DEFINE_MATMUL_TILED(f32, 8)
DEFINE_MATMUL_TILED(q4_0, 1)
DEFINE_MATMUL_TILED(q8_0, 1)
DEFINE_MATMUL_TILED(f16, 1)
DEFINE_MATMUL_TILED(f32, 1)

// Cooperative GEMV for GPUs: a work-group computes GEMV_ROWS rows of one token, GEMV_LWS
// work-items per row; neighbouring work-items read neighbouring blocks (coalesced), then each
// row's partial sums are reduced in local memory.
#define DEFINE_GEMV_COOP(NAME)                                                                 \
  kernel void gemv_coop_##NAME(global const uchar* w, ulong w_off, uint k, global uchar* arena,     \
                               ulong x_off, uint x_stride, ulong y_off, uint y_stride,         \
                               uint row_begin, uint row_end, uint t_begin, uint t_end,         \
                               ulong tok_off, int rows_from_table) {                           \
    local float partial[GEMV_LWS * GEMV_ROWS];                                                 \
    const uint lid = get_local_id(0);                                                          \
    const uint lane = lid % GEMV_LWS;                                                          \
    const uint r = row_begin + get_group_id(0) * GEMV_ROWS + lid / GEMV_LWS;                   \
    const uint t = t_begin + get_global_id(1);                                                 \
    global const int* tok = (global const int*)(arena + tok_off);                              \
    const int out_row = matmul_out_row(tok, rows_from_table, t);                               \
    if (out_row < 0) return; /* uniform across the work-group (one token) */                  \
    const uint n_blocks = k / QK;                                                              \
    float16 acc = (float16)(0.0f);                                                             \
    if (r < row_end) {                                                                         \
      global const uchar* wr = w + w_off + (ulong)r * n_blocks * BLOCK_BYTES_##NAME;            \
      global const float* x = (global const float*)(arena + x_off) + (ulong)t * x_stride;      \
      for (uint b = lane; b < n_blocks; b += GEMV_LWS) {                                       \
        float16 lo, hi;                                                                        \
        load_block_##NAME(wr + (ulong)b * BLOCK_BYTES_##NAME, &lo, &hi);                       \
        acc = mad(lo, vload16(0, x + b * QK), acc);                                            \
        acc = mad(hi, vload16(1, x + b * QK), acc);                                            \
      }                                                                                        \
    }                                                                                          \
    partial[lid] = sum16(acc);                                                                 \
    barrier(CLK_LOCAL_MEM_FENCE);                                                              \
    for (uint half_n = GEMV_LWS / 2; half_n > 0; half_n /= 2) {                                \
      if (lane < half_n) partial[lid] += partial[lid + half_n];                                \
      barrier(CLK_LOCAL_MEM_FENCE);                                                            \
    }                                                                                          \
    if (lane == 0 && r < row_end)                                                              \
      ((global float*)(arena + y_off))[(ulong)out_row * y_stride + r] = partial[lid];          \
  }
DEFINE_GEMV_COOP(q4_0)
DEFINE_GEMV_COOP(q8_0)
DEFINE_GEMV_COOP(f16)
DEFINE_GEMV_COOP(f32)

// Q4_0 GEMV for GPUs: a work-group computes 8 rows of one token with 32 work-items per row;
// four work-items share a block, each reading 4 of its 16 quant bytes as two 16-bit loads
// (blocks are only 2-byte aligned), so a row's 32 work-items read 8 whole consecutive blocks.
#define GEMV4_ROWS 8
kernel void gemv_coop4_q4_0(global const uchar* w, ulong w_off, uint k, global uchar* arena, ulong x_off,
                            uint x_stride, ulong y_off, uint y_stride, uint row_begin, uint row_end, uint t_begin,
                            uint t_end, ulong tok_off, int rows_from_table) {
  local float partial[32 * GEMV4_ROWS];
  const uint lid = get_local_id(0);
  const uint lane = lid % 32;
  const uint quarter = lane % 4;
  const uint r = row_begin + get_group_id(0) * GEMV4_ROWS + lid / 32;
  const uint t = t_begin + get_global_id(1);
  global const int* tok = (global const int*)(arena + tok_off);
  const int out_row = matmul_out_row(tok, rows_from_table, t);
  if (out_row < 0) return;  // uniform across the work-group (one token)
  const uint n_blocks = k / QK;
  float acc = 0.0f;
  if (r < row_end) {
    global const uchar* wr = w + w_off + (ulong)r * n_blocks * BLOCK_BYTES_q4_0;
    global const float* x = (global const float*)(arena + x_off) + (ulong)t * x_stride;
    for (uint b = lane / 4; b < n_blocks; b += 8) {
      global const uchar* p = wr + (ulong)b * BLOCK_BYTES_q4_0;
      const float d = vload_half(0, (global const half*)p);
      global const ushort* qs = (global const ushort*)(p + 2 + 4 * quarter);
      const uint q = (uint)qs[0] | ((uint)qs[1] << 16);
      const float4 lo = (float4)((float)(q & 15u), (float)((q >> 8) & 15u), (float)((q >> 16) & 15u),
                                 (float)((q >> 24) & 15u)) - 8.0f;
      const float4 hi = (float4)((float)((q >> 4) & 15u), (float)((q >> 12) & 15u), (float)((q >> 20) & 15u),
                                 (float)(q >> 28)) - 8.0f;
      const float4 xl = vload4(0, x + b * QK + 4 * quarter);
      const float4 xh = vload4(0, x + b * QK + 16 + 4 * quarter);
      acc = mad(d, dot(lo, xl) + dot(hi, xh), acc);
    }
  }
  partial[lid] = acc;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (uint half_n = 16; half_n > 0; half_n /= 2) {
    if (lane < half_n) partial[lid] += partial[lid + half_n];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lane == 0 && r < row_end) ((global float*)(arena + y_off))[(ulong)out_row * y_stride + r] = partial[lid];
}
