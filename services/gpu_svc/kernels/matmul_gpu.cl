// Matmul kernels for GPUs (concatenated after matmul.cl, whose matmul_out_row they use). Same
// contract as matmul.cl: y[t][r] = W[r] . x[t] for r in [row_begin, row_end), t in
// [t_begin, t_end); with rows_from_table (Logits) token t writes y row tok[t].logits_row.
//
// Two weight layouts:
// - the file's (ggml blocks, core/model/quant.h): gemv_coop_*, gemv_coop4_q4_0, gemv_vec_*; used on
//   GPUs that share host memory (zero copy) and for tensors the runner could not pack;
// - the packed layout of services/gpu_svc/weight_pack.h, which the runner writes in place at
//   upload on discrete GPUs (copies mode), for Q4_0/Q8_0:
//     tensor of w_rows rows, nb = k / 32 blocks per row, at byte offset w_off (16-aligned):
//       quants at w_off                       block (r, b): Q bytes at w_off + (r * nb + b) * Q,
//                                             ggml's qs[] unchanged (Q = 16 Q4_0, 32 Q8_0)
//       scales at w_off + w_rows * nb * Q     block (r, b): fp16 d at + (r * nb + b) * 2
//   so a block's quants are one (Q4_0) or two (Q8_0) aligned uint4 loads, and neighbouring
//   work-items read neighbouring 16-byte pieces: gemv_packed_*, matmul_packed_t*_*,
//   embed_packed_*. The packed tensor holds the same bits as the file's: still W4A16 / W8A16.

#ifndef GEMV_LWS
#define GEMV_LWS 16  // work-items cooperating on one output row in gemv_coop_*
#endif
#ifndef GEMV_ROWS
#define GEMV_ROWS 16  // output rows per work-group in gemv_coop_*
#endif

// ---- file layout, cooperative GEMV (any GPU; the fallback for unpacked tensors)

// A GEMV work-group's token t (global id 1) and its output row out_row (matmul_out_row); the
// group returns where the token has none (uniform across the group: it holds one token). Reads
// t_begin, arena, tok_off and rows_from_table by name.
#define GEMV_GROUP_TOKEN                                                  \
  const uint t = t_begin + get_global_id(1);                              \
  global const int* tok = (global const int*)(arena + tok_off);           \
  const int out_row = matmul_out_row(tok, rows_from_table, t);            \
  if (out_row < 0) return;

// The end of a row-per-lanes GEMV group: each work-item's partial sum `VALUE` into local memory,
// a tree over the row's LANES work-items (lane = lid % LANES), and lane 0 stores the row's y. The
// cooperative GEMVs here and the K-quant ones (matmul_kq_gpu.cl) end with it.
#define GEMV_LANES_SUM_STORE(VALUE, LANES)                                                     \
  partial[lid] = (VALUE);                                                                      \
  barrier(CLK_LOCAL_MEM_FENCE);                                                                \
  for (uint half_n = (LANES) / 2; half_n > 0; half_n /= 2) {                                   \
    if (lane < half_n) partial[lid] += partial[lid + half_n];                                  \
    barrier(CLK_LOCAL_MEM_FENCE);                                                              \
  }                                                                                            \
  if (lane == 0 && r < row_end)                                                                \
    ((global float*)(arena + y_off))[(ulong)out_row * y_stride + r] = partial[lid];

// A work-group computes GEMV_ROWS rows of one token, GEMV_LWS work-items per row; neighbouring
// work-items read neighbouring blocks, then each row's partial sums are reduced in local memory.
// GEMV_COOP_GROUP is work-group `grp`'s part: the kernel below runs it for its own group, the
// sibling kernels of matmul_siblings_gpu.cl for one of a segment's (the same code, so the same
// bits). It reads w, w_off, k, arena, x_off, x_stride, y_off, y_stride, row_begin, row_end,
// t_begin, tok_off and rows_from_table by name; `partial` is declared at kernel scope.
#define GEMV_COOP_LOCALS local float partial[GEMV_LWS * GEMV_ROWS];
#define GEMV_COOP_GROUP(NAME)                                                                  \
  const uint lid = get_local_id(0);                                                            \
  const uint lane = lid % GEMV_LWS;                                                            \
  const uint r = row_begin + grp * GEMV_ROWS + lid / GEMV_LWS;                                 \
  GEMV_GROUP_TOKEN                                                                             \
  const uint n_blocks = k / QK;                                                                \
  float16 acc = (float16)(0.0f);                                                               \
  if (r < row_end) {                                                                           \
    global const uchar* wr = w + w_off + (ulong)r * n_blocks * BLOCK_BYTES_##NAME;              \
    global const float* x = (global const float*)(arena + x_off) + (ulong)t * x_stride;        \
    for (uint b = lane; b < n_blocks; b += GEMV_LWS) {                                         \
      float16 lo, hi;                                                                          \
      load_block_at_##NAME(wr, b, &lo, &hi);                                                     \
      acc = mad(lo, vload16(0, x + b * QK), acc);                                              \
      acc = mad(hi, vload16(1, x + b * QK), acc);                                              \
    }                                                                                          \
  }                                                                                            \
  GEMV_LANES_SUM_STORE(sum16(acc), GEMV_LWS)
#define DEFINE_GEMV_COOP(NAME)                                                                 \
  kernel void gemv_coop_##NAME(global const uchar* w, ulong w_off, uint k, global uchar* arena,     \
                               ulong x_off, uint x_stride, ulong y_off, uint y_stride,         \
                               uint row_begin, uint row_end, uint t_begin, uint t_end,         \
                               ulong tok_off, int rows_from_table) {                           \
    GEMV_COOP_LOCALS                                                                           \
    const uint grp = get_group_id(0);                                                          \
    GEMV_COOP_GROUP(NAME)                                                                      \
  }
DEFINE_GEMV_COOP(q4_0)
DEFINE_GEMV_COOP(q8_0)
DEFINE_GEMV_COOP(f16)
DEFINE_GEMV_COOP(f32)

// Q4_0, file layout: a work-group computes 8 rows of one token with 32 work-items per row;
// four work-items share a block, each reading 4 of its 16 quant bytes as two 16-bit loads
// (blocks are only 2-byte aligned), so a row's 32 work-items read 8 whole consecutive blocks.
#define GEMV4_ROWS 8
// Work-group `grp`'s part (as GEMV_COOP_GROUP; `partial` declared at kernel scope).
#define GEMV_COOP4_LOCALS local float partial[32 * GEMV4_ROWS];
#define GEMV_COOP4_Q4_0_GROUP                                                                                    \
  const uint lid = get_local_id(0);                                                                              \
  const uint lane = lid % 32;                                                                                    \
  const uint quarter = lane % 4;                                                                                 \
  const uint r = row_begin + grp * GEMV4_ROWS + lid / 32;                                                        \
  GEMV_GROUP_TOKEN                                                                                               \
  const uint n_blocks = k / QK;                                                                                  \
  float acc = 0.0f;                                                                                              \
  if (r < row_end) {                                                                                             \
    global const uchar* wr = w + w_off + (ulong)r * n_blocks * BLOCK_BYTES_q4_0;                                 \
    global const float* x = (global const float*)(arena + x_off) + (ulong)t * x_stride;                          \
    for (uint b = lane / 4; b < n_blocks; b += 8) {                                                              \
      global const uchar* p = wr + (ulong)b * BLOCK_BYTES_q4_0;                                                  \
      const float d = vload_half(0, (global const half*)p);                                                      \
      global const ushort* qs = (global const ushort*)(p + 2 + 4 * quarter);                                     \
      const uint q = (uint)qs[0] | ((uint)qs[1] << 16);                                                          \
      const float4 lo = (float4)((float)(q & 15u), (float)((q >> 8) & 15u), (float)((q >> 16) & 15u),            \
                                 (float)((q >> 24) & 15u)) - 8.0f;                                               \
      const float4 hi = (float4)((float)((q >> 4) & 15u), (float)((q >> 12) & 15u), (float)((q >> 20) & 15u),    \
                                 (float)(q >> 28)) - 8.0f;                                                       \
      const float4 xl = vload4(0, x + b * QK + 4 * quarter);                                                     \
      const float4 xh = vload4(0, x + b * QK + 16 + 4 * quarter);                                                \
      acc = mad(d, dot(lo, xl) + dot(hi, xh), acc);                                                              \
    }                                                                                                            \
  }                                                                                                              \
  GEMV_LANES_SUM_STORE(acc, 32)
kernel void gemv_coop4_q4_0(global const uchar* w, ulong w_off, uint k, global uchar* arena, ulong x_off,
                            uint x_stride, ulong y_off, uint y_stride, uint row_begin, uint row_end, uint t_begin,
                            uint t_end, ulong tok_off, int rows_from_table) {
  GEMV_COOP4_LOCALS
  const uint grp = get_group_id(0);
  GEMV_COOP4_Q4_0_GROUP
}

// ---- the fast GPU GEMV (packed Q4_0/Q8_0; F16/F32 whose rows are 16-byte aligned)
//
// A work-group is PG_GROUPS lane groups of LANES work-items; a lane group owns RPL consecutive
// rows. Lane l reads 16-byte pieces l, l + LANES, ... of each of its rows (a lane group's loads
// of one row are LANES * 16 contiguous bytes: coalesced), loads the matching x values once for
// all RPL rows, and keeps RPL partial sums; the rows' partials are summed in local memory.
// Rows past row_end read the last row (in bounds) and are not written. The variants' speeds on
// an H100, and which one GpuKernels picks per shape: bench/gpu/RESULTS.md.
#define PG_GROUPS 8

// Eight x values as two float4; x rows are 16-byte aligned when x_aligned (the usual arena
// layout), else read with 4-byte vloads.
inline void load_x8(global const float* x, int x_aligned, float4* a, float4* b) {
  if (x_aligned) {
    *a = ((global const float4*)x)[0];
    *b = ((global const float4*)x)[1];
  } else {
    *a = vload4(0, x);
    *b = vload4(1, x);
  }
}
inline float4 load_x4(global const float* x, int x_aligned) {
  return x_aligned ? *(global const float4*)x : vload4(0, x);
}

// Dequantising without int->float conversions: a quant OR-ed into the top of the mantissa of
// 1.0f is exactly 1 + q / 2^bits (one shift and one and-or per weight), and the offset is
// folded out per block: with f = 1 + q/16, sum((q - 8) x) = 16 sum(f x) - 24 sum(x) (Q4_0);
// with f = 1 + (q + 128)/256, sum(q x) = 256 sum(f x) - 384 sum(x) (Q8_0). sum(x) of a block is
// computed once for all the rows a work-item reads.
//
// The low (high) nibbles of w's four bytes as 1 + q/16: each moved to mantissa bits 19..22.
inline float4 q4_lo_unit(uint w) {
  return as_float4(((uint4)(w << 19, w << 11, w << 3, w >> 5) & 0x00780000u) | 0x3F800000u);
}
inline float4 q4_hi_unit(uint w) {
  return as_float4(((uint4)(w << 15, w << 7, w >> 1, w >> 9) & 0x00780000u) | 0x3F800000u);
}
// w's four int8 as 1 + (q + 128)/256: q + 128 is the byte q ^ 0x80, moved to bits 15..22.
inline float4 q8_unit(uint w) {
  const uint u = w ^ 0x80808080u;
  return as_float4(((uint4)(u << 15, u << 7, u >> 1, u >> 9) & 0x007F8000u) | 0x3F800000u);
}
// sum(f x) of a Q4_0 block (16 quant bytes: byte j holds weight j in its low nibble and j + 16
// in its high one); xl[c] = x[4c..4c+3], xh[c] = x[16+4c..]. Four independent fma chains.
inline float dot_q4_block(uint4 q, float4 xl0, float4 xl1, float4 xl2, float4 xl3, float4 xh0, float4 xh1,
                          float4 xh2, float4 xh3) {
  float4 a = q4_lo_unit(q.x) * xl0;
  a = fma(q4_lo_unit(q.y), xl1, a);
  a = fma(q4_lo_unit(q.z), xl2, a);
  a = fma(q4_lo_unit(q.w), xl3, a);
  a = fma(q4_hi_unit(q.x), xh0, a);
  a = fma(q4_hi_unit(q.y), xh1, a);
  a = fma(q4_hi_unit(q.z), xh2, a);
  a = fma(q4_hi_unit(q.w), xh3, a);
  return (a.x + a.y) + (a.z + a.w);
}
// sum(f x) of 32 int8 quants (two 16-byte pieces) and x0..x7.
inline float dot_q8_block(uint4 q0, uint4 q1, float4 x0, float4 x1, float4 x2, float4 x3, float4 x4, float4 x5,
                          float4 x6, float4 x7) {
  float4 a = q8_unit(q0.x) * x0;
  a = fma(q8_unit(q0.y), x1, a);
  a = fma(q8_unit(q0.z), x2, a);
  a = fma(q8_unit(q0.w), x3, a);
  a = fma(q8_unit(q1.x), x4, a);
  a = fma(q8_unit(q1.y), x5, a);
  a = fma(q8_unit(q1.z), x6, a);
  a = fma(q8_unit(q1.w), x7, a);
  return (a.x + a.y) + (a.z + a.w);
}
inline float sum_x8(float4 a, float4 b, float4 c, float4 d, float4 e, float4 f, float4 g, float4 h) {
  return dot(((a + b) + (c + d)) + ((e + f) + (g + h)), (float4)(1.0f));
}

// The shared frame: a work-group's rows, the token, the reduction and the store. BODY runs
// with: lane, rows[RPL] (clamped row indices), acc[RPL], x (this token's row), x_aligned and
// LOCALS (declarations at kernel scope, as OpenCL wants local arrays). GEMV_FAST_BEGIN, BODY,
// GEMV_FAST_END is work-group `grp`'s part, for the kernel's own group (GEMV_FAST_FRAME) or one of
// a sibling segment's (matmul_siblings_gpu.cl): the same code, so the same bits. It reads w, w_off,
// k, arena, x_off, x_stride, y_off, y_stride, row_begin, row_end, t_begin, tok_off,
// rows_from_table and w_rows by name. (BODY goes between, not as an argument: expanded, it holds
// commas that would split a macro's arguments.)
#define GEMV_FAST_LOCALS(LANES, RPL) local float partial[PG_GROUPS * RPL * LANES];
#define GEMV_FAST_BEGIN(LANES, RPL)                                                                      \
  const uint lane = get_local_id(0) % LANES;                                                                  \
  const uint group = get_local_id(0) / LANES;                                                                 \
  const uint r0 = row_begin + (grp * PG_GROUPS + group) * RPL;                                                \
  GEMV_GROUP_TOKEN                                                                                            \
  const ulong x_byte = x_off + (ulong)t * x_stride * 4;                                                       \
  global const float* x = (global const float*)(arena + x_byte);                                              \
  const int x_aligned = (x_byte % 16) == 0;                                                                   \
  uint rows[RPL];                                                                                             \
  float acc[RPL];                                                                                             \
  for (uint i = 0; i < RPL; ++i) {                                                                            \
    rows[i] = min(r0 + i, row_end - 1);                                                                       \
    acc[i] = 0.0f;                                                                                            \
  }
#define GEMV_FAST_END(LANES, RPL)                                                                             \
  for (uint i = 0; i < RPL; ++i) partial[(group * RPL + i) * LANES + lane] = acc[i];                          \
  barrier(CLK_LOCAL_MEM_FENCE);                                                                               \
  for (uint half_n = LANES / 2; half_n > 0; half_n /= 2) {                                                    \
    if (lane < half_n)                                                                                        \
      for (uint i = 0; i < RPL; ++i)                                                                          \
        partial[(group * RPL + i) * LANES + lane] += partial[(group * RPL + i) * LANES + lane + half_n];      \
    barrier(CLK_LOCAL_MEM_FENCE);                                                                             \
  }                                                                                                           \
  if (lane < RPL && r0 + lane < row_end)                                                                      \
    ((global float*)(arena + y_off))[(ulong)out_row * y_stride + r0 + lane] =                                 \
        partial[(group * RPL + lane) * LANES];
#define GEMV_FAST_FRAME(KNAME, LANES, RPL, LOCALS, BODY)                                                         \
  kernel __attribute__((reqd_work_group_size(LANES * PG_GROUPS, 1, 1))) void KNAME(                      \
      global const uchar* w, ulong w_off, uint k, global uchar* arena, ulong x_off, uint x_stride,        \
      ulong y_off, uint y_stride, uint row_begin, uint row_end, uint t_begin, uint t_end, ulong tok_off, \
      int rows_from_table, uint w_rows) {                                                                \
    GEMV_FAST_LOCALS(LANES, RPL)                                                                         \
    LOCALS                                                                                               \
    const uint grp = get_group_id(0);                                                                    \
    GEMV_FAST_BEGIN(LANES, RPL)                                                                          \
    BODY                                                                                                 \
    GEMV_FAST_END(LANES, RPL)                                                                            \
  }

// Packed Q4_0: one block (16 quant bytes, one fp16 scale) per row per lane per step. With PF,
// the next step's quants and scales are loaded before this step's arithmetic, so loads stay in
// flight while a work-item computes. Block indices are 32-bit (the host checks the tensor fits).
#define GEMV_PACKED_Q4_0_BODY(LANES, RPL, PF)                                                      \
  const uint nb = k / QK;                                                                          \
  global const uint4* q = (global const uint4*)(w + w_off);                                        \
  global const half* d = (global const half*)(w + w_off + (ulong)w_rows * nb * 16);                \
  uint base[RPL];                                                                                  \
  uint4 qn[RPL];                                                                                   \
  float dn[RPL];                                                                                   \
  for (uint i = 0; i < RPL; ++i) {                                                                 \
    base[i] = rows[i] * nb;                                                                        \
    qn[i] = (uint4)(0u);                                                                           \
    dn[i] = 0.0f;                                                                                  \
    if (PF && lane < nb) {                                                                         \
      qn[i] = q[base[i] + lane];                                                                   \
      dn[i] = vload_half(base[i] + lane, d);                                                       \
    }                                                                                              \
  }                                                                                                \
  for (uint b = lane; b < nb; b += LANES) {                                                        \
    uint4 qc[RPL];                                                                                 \
    float dc[RPL];                                                                                 \
    for (uint i = 0; i < RPL; ++i) {                                                               \
      qc[i] = PF ? qn[i] : q[base[i] + b];                                                         \
      dc[i] = PF ? dn[i] : vload_half(base[i] + b, d);                                             \
    }                                                                                              \
    if (PF && b + LANES < nb)                                                                      \
      for (uint i = 0; i < RPL; ++i) {                                                             \
        qn[i] = q[base[i] + b + LANES];                                                            \
        dn[i] = vload_half(base[i] + b + LANES, d);                                                \
      }                                                                                            \
    float4 xl0, xl1, xl2, xl3, xh0, xh1, xh2, xh3;                                                 \
    load_x8(x + b * QK, x_aligned, &xl0, &xl1);                                                    \
    load_x8(x + b * QK + 8, x_aligned, &xl2, &xl3);                                                \
    load_x8(x + b * QK + 16, x_aligned, &xh0, &xh1);                                               \
    load_x8(x + b * QK + 24, x_aligned, &xh2, &xh3);                                               \
    const float sx = 24.0f * sum_x8(xl0, xl1, xl2, xl3, xh0, xh1, xh2, xh3);                       \
    for (uint i = 0; i < RPL; ++i) {                                                               \
      const float s = dot_q4_block(qc[i], xl0, xl1, xl2, xl3, xh0, xh1, xh2, xh3);                 \
      acc[i] = mad(dc[i], mad(16.0f, s, -sx), acc[i]);                                             \
    }                                                                                              \
  }
// Packed Q8_0: one block (two 16-byte pieces, one fp16 scale) per row per lane per step.
#define GEMV_PACKED_Q8_0_BODY(LANES, RPL, PF)                                                      \
  const uint nb = k / QK;                                                                          \
  global const uint4* q = (global const uint4*)(w + w_off);                                        \
  global const half* d = (global const half*)(w + w_off + (ulong)w_rows * nb * 32);                \
  uint base[RPL];                                                                                  \
  uint4 qn0[RPL], qn1[RPL];                                                                        \
  float dn[RPL];                                                                                   \
  for (uint i = 0; i < RPL; ++i) {                                                                 \
    base[i] = rows[i] * nb;                                                                        \
    qn0[i] = qn1[i] = (uint4)(0u);                                                                 \
    dn[i] = 0.0f;                                                                                  \
    if (PF && lane < nb) {                                                                         \
      qn0[i] = q[2 * (base[i] + lane)];                                                            \
      qn1[i] = q[2 * (base[i] + lane) + 1];                                                        \
      dn[i] = vload_half(base[i] + lane, d);                                                       \
    }                                                                                              \
  }                                                                                                \
  for (uint b = lane; b < nb; b += LANES) {                                                        \
    uint4 qc0[RPL], qc1[RPL];                                                                      \
    float dc[RPL];                                                                                 \
    for (uint i = 0; i < RPL; ++i) {                                                               \
      qc0[i] = PF ? qn0[i] : q[2 * (base[i] + b)];                                                 \
      qc1[i] = PF ? qn1[i] : q[2 * (base[i] + b) + 1];                                             \
      dc[i] = PF ? dn[i] : vload_half(base[i] + b, d);                                             \
    }                                                                                              \
    if (PF && b + LANES < nb)                                                                      \
      for (uint i = 0; i < RPL; ++i) {                                                             \
        qn0[i] = q[2 * (base[i] + b + LANES)];                                                     \
        qn1[i] = q[2 * (base[i] + b + LANES) + 1];                                                 \
        dn[i] = vload_half(base[i] + b + LANES, d);                                                \
      }                                                                                            \
    float4 x0, x1, x2, x3, x4, x5, x6, x7;                                                         \
    load_x8(x + b * QK, x_aligned, &x0, &x1);                                                      \
    load_x8(x + b * QK + 8, x_aligned, &x2, &x3);                                                  \
    load_x8(x + b * QK + 16, x_aligned, &x4, &x5);                                                 \
    load_x8(x + b * QK + 24, x_aligned, &x6, &x7);                                                 \
    const float sx = 384.0f * sum_x8(x0, x1, x2, x3, x4, x5, x6, x7);                              \
    for (uint i = 0; i < RPL; ++i) {                                                               \
      const float s = dot_q8_block(qc0[i], qc1[i], x0, x1, x2, x3, x4, x5, x6, x7);               \
      acc[i] = mad(dc[i], mad(256.0f, s, -sx), acc[i]);                                            \
    }                                                                                              \
  }
// "x" variants of the packed bodies (prefetching too): the work-group first copies x, up to
// GEMV_X_TILE blocks at a time, into local memory with coalesced loads, padded to 36 floats per
// block so that the lanes' 16-byte reads of their own blocks hit distinct banks. Reading x
// straight from global memory, a warp's lanes touch 32 different cache lines per load.
#define GEMV_X_TILE 128  // a multiple of every LANES
#define GEMV_X_LOCALS local float4 xs[GEMV_X_TILE * 9];
#define GEMV_STAGE_X(t0, t1)                                                                       \
  barrier(CLK_LOCAL_MEM_FENCE);                                                                    \
  for (uint e = get_local_id(0); e < (t1 - t0) * 8; e += get_local_size(0))                        \
    xs[(e / 8) * 9 + e % 8] = load_x4(x + t0 * QK + 4 * e, x_aligned);                              \
  barrier(CLK_LOCAL_MEM_FENCE);
#define GEMV_PACKED_Q4_0_X_BODY(LANES, RPL, PF)                                                    \
  const uint nb = k / QK;                                                                          \
  global const uint4* q = (global const uint4*)(w + w_off);                                        \
  global const half* d = (global const half*)(w + w_off + (ulong)w_rows * nb * 16);                \
  uint base[RPL];                                                                                  \
  uint4 qn[RPL];                                                                                   \
  float dn[RPL];                                                                                   \
  for (uint i = 0; i < RPL; ++i) {                                                                 \
    base[i] = rows[i] * nb;                                                                        \
    qn[i] = (uint4)(0u);                                                                           \
    dn[i] = 0.0f;                                                                                  \
    if (lane < nb) {                                                                               \
      qn[i] = q[base[i] + lane];                                                                   \
      dn[i] = vload_half(base[i] + lane, d);                                                       \
    }                                                                                              \
  }                                                                                                \
  for (uint t0 = 0; t0 < nb; t0 += GEMV_X_TILE) {                                                  \
    const uint t1 = min(nb, t0 + GEMV_X_TILE);                                                     \
    GEMV_STAGE_X(t0, t1)                                                                           \
    for (uint b = t0 + lane; b < t1; b += LANES) {                                                 \
      uint4 qc[RPL];                                                                               \
      float dc[RPL];                                                                               \
      for (uint i = 0; i < RPL; ++i) {                                                             \
        qc[i] = qn[i];                                                                             \
        dc[i] = dn[i];                                                                             \
      }                                                                                            \
      if (b + LANES < nb)                                                                          \
        for (uint i = 0; i < RPL; ++i) {                                                           \
          qn[i] = q[base[i] + b + LANES];                                                          \
          dn[i] = vload_half(base[i] + b + LANES, d);                                              \
        }                                                                                          \
      local const float4* xb = xs + (b - t0) * 9;                                                  \
      const float4 xl0 = xb[0], xl1 = xb[1], xl2 = xb[2], xl3 = xb[3];                             \
      const float4 xh0 = xb[4], xh1 = xb[5], xh2 = xb[6], xh3 = xb[7];                             \
      const float sx = 24.0f * sum_x8(xl0, xl1, xl2, xl3, xh0, xh1, xh2, xh3);                     \
      for (uint i = 0; i < RPL; ++i) {                                                             \
        const float s = dot_q4_block(qc[i], xl0, xl1, xl2, xl3, xh0, xh1, xh2, xh3);               \
        acc[i] = mad(dc[i], mad(16.0f, s, -sx), acc[i]);                                           \
      }                                                                                            \
    }                                                                                              \
  }
#define GEMV_PACKED_Q8_0_X_BODY(LANES, RPL, PF)                                                    \
  const uint nb = k / QK;                                                                          \
  global const uint4* q = (global const uint4*)(w + w_off);                                        \
  global const half* d = (global const half*)(w + w_off + (ulong)w_rows * nb * 32);                \
  uint base[RPL];                                                                                  \
  uint4 qn0[RPL], qn1[RPL];                                                                        \
  float dn[RPL];                                                                                   \
  for (uint i = 0; i < RPL; ++i) {                                                                 \
    base[i] = rows[i] * nb;                                                                        \
    qn0[i] = qn1[i] = (uint4)(0u);                                                                 \
    dn[i] = 0.0f;                                                                                  \
    if (lane < nb) {                                                                               \
      qn0[i] = q[2 * (base[i] + lane)];                                                            \
      qn1[i] = q[2 * (base[i] + lane) + 1];                                                        \
      dn[i] = vload_half(base[i] + lane, d);                                                       \
    }                                                                                              \
  }                                                                                                \
  for (uint t0 = 0; t0 < nb; t0 += GEMV_X_TILE) {                                                  \
    const uint t1 = min(nb, t0 + GEMV_X_TILE);                                                     \
    GEMV_STAGE_X(t0, t1)                                                                           \
    for (uint b = t0 + lane; b < t1; b += LANES) {                                                 \
      uint4 qc0[RPL], qc1[RPL];                                                                    \
      float dc[RPL];                                                                               \
      for (uint i = 0; i < RPL; ++i) {                                                             \
        qc0[i] = qn0[i];                                                                           \
        qc1[i] = qn1[i];                                                                           \
        dc[i] = dn[i];                                                                             \
      }                                                                                            \
      if (b + LANES < nb)                                                                          \
        for (uint i = 0; i < RPL; ++i) {                                                           \
          qn0[i] = q[2 * (base[i] + b + LANES)];                                                   \
          qn1[i] = q[2 * (base[i] + b + LANES) + 1];                                               \
          dn[i] = vload_half(base[i] + b + LANES, d);                                              \
        }                                                                                          \
      local const float4* xb = xs + (b - t0) * 9;                                                  \
      const float4 x0 = xb[0], x1 = xb[1], x2 = xb[2], x3 = xb[3];                                 \
      const float4 x4 = xb[4], x5 = xb[5], x6 = xb[6], x7 = xb[7];                                 \
      const float sx = 384.0f * sum_x8(x0, x1, x2, x3, x4, x5, x6, x7);                            \
      for (uint i = 0; i < RPL; ++i) {                                                             \
        const float s = dot_q8_block(qc0[i], qc1[i], x0, x1, x2, x3, x4, x5, x6, x7);              \
        acc[i] = mad(dc[i], mad(256.0f, s, -sx), acc[i]);                                          \
      }                                                                                            \
    }                                                                                              \
  }
// F16, file layout with 16-byte aligned rows: 8 weights (16 bytes) per lane per step.
#define GEMV_VEC_F16_BODY(LANES, RPL, PF)                                                              \
  global const half* wh = (global const half*)(w + w_off);                                         \
  for (uint c = lane; c < k / 8; c += LANES) {                                                     \
    float4 x0, x1;                                                                                 \
    load_x8(x + c * 8, x_aligned, &x0, &x1);                                                       \
    for (uint i = 0; i < RPL; ++i) {                                                               \
      const float8 v = vloada_half8((ulong)rows[i] * (k / 8) + c, wh);                             \
      acc[i] += dot(v.lo, x0) + dot(v.hi, x1);                                                     \
    }                                                                                              \
  }
// F32, file layout with 16-byte aligned rows: 4 weights per lane per step.
#define GEMV_VEC_F32_BODY(LANES, RPL, PF)                                                              \
  global const float4* wf = (global const float4*)(w + w_off);                                     \
  for (uint c = lane; c < k / 4; c += LANES) {                                                     \
    const float4 xv = load_x4(x + c * 4, x_aligned);                                               \
    for (uint i = 0; i < RPL; ++i) acc[i] += dot(wf[(ulong)rows[i] * (k / 4) + c], xv);            \
  }

// Variants "l<LANES>r<RPL>[p|x]" (p: prefetching; x: x staged in local memory, prefetching;
// both for the packed bodies only). GpuKernels picks one per shape from the four measured best on
// the devices it runs on (bench/gpu/RESULTS.md: l32r2 / l128r4 for F16/F32, l16r4x / l64r4x for
// packed tensors; PoCL runs them only in tests, GpuKernels::set_gpu_kernels): only those are in
// the default program. The other eleven are built only under DUET_GEMV_TUNING
// (DeviceOptions::gemv_tuning, which gpu_bench --gemv-variants sets) so that a new device can be
// tuned without every program carrying 60 kernels. Keep in step with GpuKernels::kGemvVariants
// and kGemvTuningVariants.
#define DEFINE_GEMV_FAST(TYPE, BODY, LANES, RPL) \
  GEMV_FAST_FRAME(gemv_##TYPE##_l##LANES##r##RPL, LANES, RPL, , BODY(LANES, RPL, 0))
#define DEFINE_GEMV_FAST_PF(TYPE, BODY, LANES, RPL) \
  GEMV_FAST_FRAME(gemv_##TYPE##_l##LANES##r##RPL##p, LANES, RPL, , BODY(LANES, RPL, 1))
#define DEFINE_GEMV_FAST_X(TYPE, X_BODY, LOCALS, LANES, RPL) \
  GEMV_FAST_FRAME(gemv_##TYPE##_l##LANES##r##RPL##x, LANES, RPL, LOCALS, X_BODY(LANES, RPL, 1))
#define DEFINE_GEMV_FAST_PICKED(TYPE, BODY, X_BODY, LOCALS) \
  DEFINE_GEMV_FAST(TYPE, BODY, 32, 2)                       \
  DEFINE_GEMV_FAST(TYPE, BODY, 128, 4)                      \
  DEFINE_GEMV_FAST_X(TYPE, X_BODY, LOCALS, 16, 4)           \
  DEFINE_GEMV_FAST_X(TYPE, X_BODY, LOCALS, 64, 4)
#define DEFINE_GEMV_FAST_TUNING(TYPE, BODY, X_BODY, LOCALS) \
  DEFINE_GEMV_FAST(TYPE, BODY, 32, 4)                       \
  DEFINE_GEMV_FAST(TYPE, BODY, 32, 8)                       \
  DEFINE_GEMV_FAST(TYPE, BODY, 16, 8)                       \
  DEFINE_GEMV_FAST(TYPE, BODY, 64, 4)                       \
  DEFINE_GEMV_FAST_PF(TYPE, BODY, 16, 4)                    \
  DEFINE_GEMV_FAST_PF(TYPE, BODY, 16, 8)                    \
  DEFINE_GEMV_FAST_PF(TYPE, BODY, 32, 4)                    \
  DEFINE_GEMV_FAST_PF(TYPE, BODY, 32, 8)                    \
  DEFINE_GEMV_FAST_PF(TYPE, BODY, 64, 4)                    \
  DEFINE_GEMV_FAST_X(TYPE, X_BODY, LOCALS, 16, 8)           \
  DEFINE_GEMV_FAST_X(TYPE, X_BODY, LOCALS, 32, 4)
// F16/F32 x variants are the plain bodies (no local copy): their lanes read adjacent x already.
#define DEFINE_GEMV_FAST_FOR_TYPES(WHICH)                                                   \
  WHICH(packed_q4_0, GEMV_PACKED_Q4_0_BODY, GEMV_PACKED_Q4_0_X_BODY, GEMV_X_LOCALS)         \
  WHICH(packed_q8_0, GEMV_PACKED_Q8_0_BODY, GEMV_PACKED_Q8_0_X_BODY, GEMV_X_LOCALS)         \
  WHICH(vec_f16, GEMV_VEC_F16_BODY, GEMV_VEC_F16_BODY, )                                    \
  WHICH(vec_f32, GEMV_VEC_F32_BODY, GEMV_VEC_F32_BODY, )
DEFINE_GEMV_FAST_FOR_TYPES(DEFINE_GEMV_FAST_PICKED)
#ifdef DUET_GEMV_TUNING
DEFINE_GEMV_FAST_FOR_TYPES(DEFINE_GEMV_FAST_TUNING)
#endif

// ---- packed layout: GEMM (register-tiled like matmul.cl's matmul_t*) and embedding lookup

// Block `blk` (= row * nb + b) of a packed tensor of `n_blocks` blocks at p, as two float16.
inline void load_packed_q4_0(global const uchar* p, ulong n_blocks, ulong blk, float16* lo, float16* hi) {
  const float d = vload_half(blk, (global const half*)(p + n_blocks * 16));
  const uint16 q = convert_uint16(vload16(0, p + blk * 16));
  *lo = (as_float16((q & 15u) | 0x4B000000u) - 8388616.0f) * d;
  *hi = (as_float16((q >> 4) | 0x4B000000u) - 8388616.0f) * d;
}
inline void load_packed_q8_0(global const uchar* p, ulong n_blocks, ulong blk, float16* lo, float16* hi) {
  const float d = vload_half(blk, (global const half*)(p + n_blocks * 32));
  *lo = convert_float16(vload16(0, (global const char*)(p + blk * 32))) * d;
  *hi = convert_float16(vload16(1, (global const char*)(p + blk * 32))) * d;
}

// A work-item owns one weight row and MM_TN tokens (each dequantised block reused MM_TN times).
#define DEFINE_MATMUL_PACKED(NAME, MM_TN)                                                                  \
  kernel void matmul_packed_t##MM_TN##_##NAME(global const uchar* w, ulong w_off, uint k, global uchar* arena, \
                                              ulong x_off, uint x_stride, ulong y_off, uint y_stride,     \
                                              uint row_begin, uint row_end, uint t_begin, uint t_end,     \
                                              ulong tok_off, int rows_from_table, uint w_rows) {          \
    const uint r = row_begin + get_global_id(0);                                                           \
    const uint t0 = t_begin + get_global_id(1) * MM_TN;                                                    \
    if (r >= row_end || t0 >= t_end) return;                                                               \
    const uint nb = k / QK;                                                                                \
    global const float* x = (global const float*)(arena + x_off);                                          \
    global const int* tok = (global const int*)(arena + tok_off);                                          \
    int out_row[MM_TN];                                                                                    \
    float16 acc[MM_TN];                                                                                    \
    for (uint i = 0; i < MM_TN; ++i) {                                                                     \
      out_row[i] = (t0 + i < t_end) ? matmul_out_row(tok, rows_from_table, t0 + i) : -1;                   \
      acc[i] = (float16)(0.0f);                                                                            \
    }                                                                                                      \
    for (uint b = 0; b < nb; ++b) {                                                                        \
      float16 lo, hi;                                                                                      \
      load_packed_##NAME(w + w_off, (ulong)w_rows * nb, (ulong)r * nb + b, &lo, &hi);                      \
      for (uint i = 0; i < MM_TN; ++i) {                                                                   \
        if (out_row[i] < 0) continue;                                                                      \
        global const float* xb = x + (ulong)(t0 + i) * x_stride + b * QK;                                  \
        acc[i] = mad(lo, vload16(0, xb), acc[i]);                                                          \
        acc[i] = mad(hi, vload16(1, xb), acc[i]);                                                          \
      }                                                                                                    \
    }                                                                                                      \
    global float* y = (global float*)(arena + y_off);                                                      \
    for (uint i = 0; i < MM_TN; ++i)                                                                       \
      if (out_row[i] >= 0) y[(ulong)out_row[i] * y_stride + r] = sum16(acc[i]);                            \
  }
DEFINE_MATMUL_PACKED(q4_0, 8)
DEFINE_MATMUL_PACKED(q8_0, 8)
DEFINE_MATMUL_PACKED(q4_0, 1)
DEFINE_MATMUL_PACKED(q8_0, 1)

// out[t] = row tok[t].id of a packed table of w_rows rows (a tied embedding that the Logits op
// made the runner pack), one 32-element block per work-item.
#define DEFINE_EMBED_PACKED(NAME)                                                                     \
  kernel void embed_packed_##NAME(global const uchar* w, ulong w_off, uint cols, ulong tok_off,       \
                                  global uchar* arena, ulong out_off, uint out_stride, uint t_begin,  \
                                  uint w_rows) {                                                      \
    const uint b = get_global_id(0);                                                                  \
    const uint t = t_begin + get_global_id(1);                                                        \
    global const int* tok = (global const int*)(arena + tok_off);                                     \
    const uint nb = cols / QK;                                                                        \
    const int id = tok[4 * t + TOK_ID];                                                               \
    float16 lo, hi;                                                                                   \
    load_packed_##NAME(w + w_off, (ulong)w_rows * nb, (ulong)id * nb + b, &lo, &hi);                  \
    global float* out = (global float*)(arena + out_off) + (ulong)t * out_stride + b * QK;            \
    vstore16(lo, 0, out);                                                                             \
    vstore16(hi, 1, out);                                                                             \
  }
DEFINE_EMBED_PACKED(q4_0)
DEFINE_EMBED_PACKED(q8_0)
