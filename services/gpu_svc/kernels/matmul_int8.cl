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

// The quantised input, by tiles of MMI_TILE tokens (counted from t_begin) and blocks: the group of
// tile t and block b starts at q + (t * n_blocks + b) * MMI_GROUP_BYTES and holds, for token slot
// s = 0..15 of the tile, its plane 0 (32 int8) at s * 64 and plane 1 at s * 64 + 32, then the 16
// float scales d (at 1024), 16 int32 sums of plane 0 (at 1088), 16 int32 sums of the block's
// quants or of plane 1 (at 1152) and 16 of its first 16 quants (at 1216, the whole quants'
// sum as SUMS1 for 16 bits); 1280 bytes, twenty cache lines. A matmul's work-item then reads a
// whole block of its tokens at fixed offsets from one pointer (with a row per token it kept 24
// pointers, reloaded from the stack in the inner loop), and a plane of the 16 slots is one AMX
// tile (16 rows 64 bytes apart: matmul_int8_amx.cl; 8-slot tiles gave it half-height products,
// no faster than vpdpbusd). The VNNI GEMM's items take 8 of a tile's slots. With bits = 8
// (llama.cpp's Q8_0 activations) a block is q = round(x / d), d = amax / 127, in plane 0. With
// bits = 16, q = round(x / d) with d = amax / (127 * 256), split as q = 256 * q_hi + q_lo (q_hi in
// plane 0, q_lo in [-128, 127] in plane 1), so the same 8-bit dot instruction serves and the int
// dot is 256 * hi + lo.
#define MMI_TILE 16
#define MMI_GROUP_BYTES 1280
#define MMI_SCALES 1024
#define MMI_SUMS0 1088
#define MMI_SUMS1 1152
#define MMI_HALF_SUMS 1216  // the first 16 quants' sums (as SUMS1 for 16 bits): matmul_kq_cpu.cl
// One block of 32 values (lo, hi) of token slot i (counted from t_begin) into the group of block
// b: quantize_q8_act's work-item, and the fused kernels' below (the same bits by construction).
__attribute__((always_inline)) inline void q8_act_block(float16 lo, float16 hi, global uchar* q,
                                                        uint n_blocks, uint b, uint i, uint bits,
                                                        uint zp_shift) {
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
  const uint slot = i % MMI_TILE;
  global uchar* group = q + ((ulong)(i / MMI_TILE) * n_blocks + b) * MMI_GROUP_BYTES;
  global char* quants = (global char*)(group + slot * 64);
  vstore16(convert_char16(q0lo), 0, quants);
  vstore16(convert_char16(q0hi), 1, quants);
  vstore16(convert_char16(q1lo), 2, quants);
  vstore16(convert_char16(q1hi), 3, quants);
  ((global float*)(group + MMI_SCALES))[slot] = d;
  // Sums: plane 0's, and for 16 bits the whole quants' (256 * hi + lo: the matmul folds the
  // zero point's correction for both planes into plane 1's dot), stored as that correction:
  // -(sum << zp_shift), the weights' zero point being 1 << zp_shift (the dot's starting value).
  const int16 s0 = q0lo + q0hi, s1 = q1lo + q1hi + (s0 << 8) * (int)(bits == 16);
  const int8 t0 = s0.lo + s0.hi, t1 = s1.lo + s1.hi;
  const int4 u0 = t0.lo + t0.hi, u1 = t1.lo + t1.hi;
  ((global int*)(group + MMI_SUMS0))[slot] = -((u0.x + u0.y + u0.z + u0.w) << zp_shift);
  ((global int*)(group + MMI_SUMS1))[slot] = -((u1.x + u1.y + u1.z + u1.w) << zp_shift);
  // The first 16 values' quants (Q6_K's scales cover 16 values), as the correction above.
  const int16 first = bits == 16 ? (q0lo << 8) + q1lo : q0lo;
  const int8 f8 = first.lo + first.hi;
  const int4 f4 = f8.lo + f8.hi;
  ((global int*)(group + MMI_HALF_SUMS))[slot] = -((f4.x + f4.y + f4.z + f4.w) << zp_shift);
}

kernel void quantize_q8_act(global const uchar* arena, ulong x_off, uint x_stride, uint k,
                            uint t_begin, uint t_end, global uchar* q, uint bits, uint zp_shift) {
  const uint b = get_global_id(0), i = get_global_id(1);
  const uint n_blocks = k / QK;
  if (b >= n_blocks || t_begin + i >= t_end) return;
  global const float* x =
      (global const float*)(arena + x_off) + (ulong)(t_begin + i) * x_stride + b * QK;
  q8_act_block(vload16(0, x), vload16(1, x), q, n_blocks, b, i, bits, zp_shift);
}

// ---- Fused per-token ops ahead of an integer matmul (the runner's op_fusion.h): each writes
// what the ops it replaces write, with their arithmetic (so the same bits), and also the
// consumer matmul's quantised input (q8_act_block), so that a decode layer launches 4 kernels
// fewer: PoCL wakes its worker threads for every kernel, which on this path cost more than
// these ops' own work (bench/kquant/RESULTS.md, 2026-11-26 decode19).

// add_rmsnorm_q8's two loops, which the step chains' stage (step_chain_cpu.cl) runs too, so both
// give the same bits. Lane lid of lsz: [x = a + b when has_add] over values lid, lid + lsz, ...,
// returning their sum of squares in that order.
__attribute__((always_inline)) inline float add_square_sum(global uchar* arena, ulong a_off,
                                                           uint a_stride, ulong b_off,
                                                           uint b_stride, uint has_add,
                                                           global float* x, uint dim, uint t,
                                                           uint lid, uint lsz) {
  float s = 0.0f;
  if (has_add) {
    global const float* a = (global const float*)(arena + a_off) + (ulong)t * a_stride;
    global const float* b = (global const float*)(arena + b_off) + (ulong)t * b_stride;
    for (uint i = lid; i < dim; i += lsz) {
      const float v = a[i] + b[i];
      x[i] = v;
      s += v * v;
    }
  } else {
    for (uint i = lid; i < dim; i += lsz) s += x[i] * x[i];
  }
  return s;
}
// out = x * scale * w over blocks blk, blk + step, ..., each quantised (token slot `slot`).
__attribute__((always_inline)) inline void rmsnorm_q8_blocks(global const float* x, float scale,
                                                             global const float* wt,
                                                             global float* out, global uchar* q,
                                                             uint n_blocks, uint blk, uint step,
                                                             uint slot, uint bits,
                                                             uint zp_shift) {
  for (; blk < n_blocks; blk += step) {
    const uint c = blk * QK;
    const float16 lo = vload16(0, x + c) * scale * vload16(0, wt + c);
    const float16 hi = vload16(1, x + c) * scale * vload16(1, wt + c);
    vstore16(lo, 0, out + c);
    vstore16(hi, 1, out + c);
    q8_act_block(lo, hi, q, n_blocks, blk, slot, bits, zp_shift);
  }
}

// [x = a + b when has_add (the residual add; x may be a)]; out = rmsnorm(x) * w, as kernel
// rmsnorm (one work-group per token, the same partial sums in the same order: the same scale);
// then out's blocks quantised as quantize_q8_act's (token slot = the group's token).
kernel void add_rmsnorm_q8(global uchar* arena, ulong a_off, uint a_stride, ulong b_off,
                           uint b_stride, uint has_add, ulong x_off, uint x_stride, ulong out_off,
                           uint out_stride, global const uchar* w, ulong w_off, uint dim, float eps,
                           uint t_begin, global uchar* q, uint bits, uint zp_shift,
                           local float* partial) {
  const uint lid = get_local_id(0);
  const uint lsz = get_local_size(0);
  const uint slot = get_group_id(1);
  const uint t = t_begin + slot;
  global float* x = (global float*)(arena + x_off) + (ulong)t * x_stride;
  partial[lid] = add_square_sum(arena, a_off, a_stride, b_off, b_stride, has_add, x, dim, t, lid,
                                lsz);
  barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);  // x's sums, and x's new values
  for (uint half_n = lsz / 2; half_n > 0; half_n /= 2) {
    if (lid < half_n) partial[lid] += partial[lid + half_n];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float scale = rsqrt(partial[0] / (float)dim + eps);
  global const float* wt = (global const float*)(w + w_off);
  global float* out = (global float*)(arena + out_off) + (ulong)t * out_stride;
  rmsnorm_q8_blocks(x, scale, wt, out, q, dim / QK, lid, lsz, slot, bits, zp_shift);
}

// out = silu(g) * u over one 32-value block of a token (out may be g): swiglu_blocks and
// swiglu_q8 share it, so a product has the same bits whether or not the down matmul's
// quantisation was fused in. (Kernel swiglu, a work-item per value, calls the scalar exp, whose
// results differ from the vector one's in the last bit: CPU devices with this path run
// swiglu_blocks instead.)
__attribute__((always_inline)) inline void swiglu_block(global const uchar* arena, ulong g_off,
                                                        uint g_stride, ulong u_off, uint u_stride,
                                                        ulong out_off, uint out_stride, ulong t,
                                                        uint b, float16* lo, float16* hi) {
  global const float* g = (global const float*)(arena + g_off) + t * g_stride + b * QK;
  global const float* u = (global const float*)(arena + u_off) + t * u_stride + b * QK;
  global float* out = (global float*)(arena + out_off) + t * out_stride + b * QK;
  const float16 glo = vload16(0, g), ghi = vload16(1, g);
  *lo = glo / (1.0f + exp(-glo)) * vload16(0, u);
  *hi = ghi / (1.0f + exp(-ghi)) * vload16(1, u);
  vstore16(*lo, 0, out);
  vstore16(*hi, 1, out);
}

// The SwiGlu op on CPU devices with the integer path: a work-item per 32-value block and token.
kernel void swiglu_blocks(global uchar* arena, ulong g_off, uint g_stride, ulong u_off,
                          uint u_stride, ulong out_off, uint out_stride, uint k, uint t_begin,
                          uint t_end) {
  const uint b = get_global_id(0), i = get_global_id(1);
  if (b >= k / QK || t_begin + i >= t_end) return;
  float16 lo, hi;
  swiglu_block(arena, g_off, g_stride, u_off, u_stride, out_off, out_stride, t_begin + i, b, &lo,
               &hi);
}

// swiglu_blocks, and the blocks quantised as quantize_q8_act's: the gated FFN's product straight
// into the down matmul's input.
kernel void swiglu_q8(global uchar* arena, ulong g_off, uint g_stride, ulong u_off, uint u_stride,
                      ulong out_off, uint out_stride, uint k, uint t_begin, uint t_end,
                      global uchar* q, uint bits, uint zp_shift) {
  const uint b = get_global_id(0), i = get_global_id(1);
  const uint n_blocks = k / QK;
  if (b >= n_blocks || t_begin + i >= t_end) return;
  float16 lo, hi;
  swiglu_block(arena, g_off, g_stride, u_off, u_stride, out_off, out_stride, t_begin + i, b, &lo,
               &hi);
  q8_act_block(lo, hi, q, n_blocks, b, i, bits, zp_shift);
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
// Which ISA families a program holds (ClDevice, cl_device.h): a VNNI host's program holds the
// VNNI kernels and a second program, built on first use, the portable ones; loading a program
// into PoCL parses all its IR, and the portable family is more than half of it (~0.35 s of a
// restarted gpu_svc). Without either option (GPUs, other hosts) a program holds both.
#if defined(DUET_INT8_ISA_VNNI_ONLY)
#define INT8_ISA_portable(...)
#else
#define INT8_ISA_portable(...) __VA_ARGS__
#endif
#if defined(DUET_INT8_ISA_PORTABLE_ONLY)
#define INT8_ISA_vnni(...)
#else
#define INT8_ISA_vnni(...) __VA_ARGS__
#endif

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

// Q4_0 quants as unsigned bytes: lane vector t (dword g of each row's qs) holds elements 4g..4g+3
// in its low nibbles and 4g+16..4g+19 in its high ones, i.e. u[g] and u[g + 4].
__attribute__((always_inline)) inline void mmi_nibbles(int16 t, uint g, int16* u) {
  u[g] = t & 0x0F0F0F0F;
  u[g + 4] = (t >> 4) & 0x0F0F0F0F;
}
// 16 fp16 bit patterns (sign-extended) as floats, exactly (cpu_scale_bits).
__attribute__((always_inline)) inline float16 mmi_fp16_to_float(int16 h) {
  return as_float16((h << 13) & (int)0x8FFFE000) * 0x1p112f;
}

// A block's weights of the 16 rows as 8 unsigned-byte vectors u[g] (g = the 4-element group,
// matching x's dwords 0..7).
// Row j of the item is w + min(j, n_rows - 1) * row_bytes: with n_rows = 16 (every item but a
// range's last) the addresses are one pointer plus multiples of the stride, which the compiler
// keeps in a few registers (16 row pointers did not fit and were reloaded in the inner loop).
#define MMI_ROW(w, j, n_rows, row_bytes) ((w) + (ulong)min((uint)(j), (n_rows) - 1) * (row_bytes))
__attribute__((always_inline)) inline void mmi_block_q4_0(global const uchar* w, ulong row_bytes,
                                                          uint n_rows, int16* u) {
  int4 r[16];
#pragma unroll
  for (uint j = 0; j < 16; ++j) r[j] = as_int4(vload16(0, MMI_ROW(w, j, n_rows, row_bytes) + 2));
  int16 t[4];
  mmi_transpose(r, t);
#pragma unroll
  for (uint g = 0; g < 4; ++g) mmi_nibbles(t[g], g, u);
}
__attribute__((always_inline)) inline void mmi_block_q8_0(global const uchar* w, ulong row_bytes,
                                                          uint n_rows, int16* u) {
  int4 r[16];
#pragma unroll
  for (uint part = 0; part < 2; ++part) {
#pragma unroll
    for (uint j = 0; j < 16; ++j)
      r[j] = as_int4(vload16(0, MMI_ROW(w, j, n_rows, row_bytes) + 2 + 16 * part));
    mmi_transpose(r, u + 4 * part);
  }
#pragma unroll
  for (uint g = 0; g < 8; ++g) u[g] ^= (int)0x80808080;  // w + 128: unsigned
}
// The 16 rows' fp16 scales of a block (lane order as the quants) as floats. 16 scalar loads: a
// dword gather measured slower (bench/gpu/RESULTS.md).
__attribute__((always_inline)) inline float16 mmi_scales(global const uchar* w, ulong row_bytes,
                                                         uint n_rows) {
  int16 h;
#pragma unroll
  for (uint L = 0; L < 16; ++L)
    h[L] = *(global const short*)MMI_ROW(w, MMI_ROW_OF_LANE(L), n_rows, row_bytes);
  return mmi_fp16_to_float(h);
}
// 16 rows read side by side are 16 streams, too many for the hardware prefetcher (a Logits
// GEMV from DRAM ran 3x slower than one row per work-item). The next work-item's 16 rows are one
// contiguous range: a few of its lines are prefetched per block of this one, in order (better
// than each row's line some blocks ahead, measured). Prefetches never fault.
__attribute__((always_inline)) inline void mmi_prefetch_lines(global const uchar* first,
                                                              uint count) {
  for (uint i = 0; i < count; ++i) __asm__ volatile("prefetcht0 (%0)" : : "r"(first + i * 64));
}

// Tiled weights (tiled_weights.h): a group's block is 32 bytes of scales in lane order, then the
// quants as the lane vectors themselves.
#define TILED_BYTES_q4_0 288
#define TILED_BYTES_q8_0 544
__attribute__((always_inline)) inline void mmi_tiled_q4_0(global const uchar* wb, int16* u) {
#pragma unroll
  for (uint g = 0; g < 4; ++g) mmi_nibbles(vload16(g, (global const int*)(wb + 32)), g, u);
}
__attribute__((always_inline)) inline void mmi_tiled_q8_0(global const uchar* wb, int16* u) {
#pragma unroll
  for (uint g = 0; g < 8; ++g) u[g] = vload16(g, (global const int*)(wb + 32));
}
__attribute__((always_inline)) inline float16 mmi_tiled_scales(global const uchar* wb) {
  return mmi_fp16_to_float(convert_int16(vload16(0, (global const short*)wb)));
}

// Token i of an item: the group of the current block holding it (group: the block's group in the
// item's first tile; 16-token items span two tiles, tile_step bytes apart) and its slot there.
#define MMI_TOK_GROUP(MMI_T, i) (MMI_T > MMI_TILE ? group + ((i) / MMI_TILE) * tile_step : group)
#define MMI_TOK_SLOT(MMI_T, i) (MMI_T > MMI_TILE ? (i) % MMI_TILE : slot0 + (i))
// Token i's int32 at byte `at` of the group's per-slot arrays (MMI_SUMS0, ...), its float scale.
#define MMI_TOK_INT(MMI_T, i, at) \
  ((global const int*)(MMI_TOK_GROUP(MMI_T, i) + (at)))[MMI_TOK_SLOT(MMI_T, i)]
#define MMI_TOK_DX(MMI_T, i) \
  ((global const float*)(MMI_TOK_GROUP(MMI_T, i) + MMI_SCALES))[MMI_TOK_SLOT(MMI_T, i)]
// Token i's dword g of plane p (the 4 quants of x's elements 4g..4g+3).
#define MMI_TOK_QUANTS(MMI_T, i, p, g) \
  (((global const int*)(MMI_TOK_GROUP(MMI_T, i) + MMI_TOK_SLOT(MMI_T, i) * 64))[8 * (p) + (g)])

// The int dots of the tokens' activation block (group) with the weights' lane vectors u[g] for g
// in [G0, G1), starting from INIT (an expression of i; in the low plane's dot for 16 bits):
// dot[i] (plane 0) and dot_lo[i] (plane 1, 16 bits), 16 rows a vector. The int of token i is then
// MMI_INT(i, BITS): exact, so every ISA gives the same one.
#define MMI_DOTS(MMI_T, ISA, BITS, G0, G1, INIT) \
  int16 dot[MMI_T], dot_lo[MMI_T];               \
  MMI_DOTS_##ISA(MMI_T, ISA, BITS, G0, G1, INIT)
#define MMI_INT(i, BITS) (BITS == 16 ? (dot[i] << 8) + dot_lo[i] : dot[i])
// vpdpbusd (or its emulation): per token, a chain of G1 - G0 dot instructions a plane, each 4
// activation quants broadcast to the 16 rows.
#define MMI_DOTS_DOT4(MMI_T, ISA, BITS, G0, G1, INIT)                                              \
  _Pragma("unroll") for (uint i = 0; i < MMI_T; ++i) {                                             \
    const int init = INIT;                                                                         \
    dot[i] = (int16)(BITS == 16 ? 0 : init);                                                       \
    dot_lo[i] = (int16)(BITS == 16 ? init : 0);                                                    \
  }                                                                                                \
  _Pragma("unroll") for (uint g = G0; g < G1; ++g) {                                               \
    _Pragma("unroll") for (uint i = 0; i < MMI_T; ++i) dot[i] =                                    \
        DOT4_##ISA(dot[i], u[g], (int16)MMI_TOK_QUANTS(MMI_T, i, 0, g));                           \
    if (BITS == 16)                                                                                \
      _Pragma("unroll") for (uint i = 0; i < MMI_T; ++i) dot_lo[i] =                               \
          DOT4_##ISA(dot_lo[i], u[g], (int16)MMI_TOK_QUANTS(MMI_T, i, 1, g));                      \
  }
#define MMI_DOTS_portable MMI_DOTS_DOT4
#define MMI_DOTS_vnni MMI_DOTS_DOT4
// What an item does before its first and after its last block dots, by ISA (matmul_int8_amx.cl:
// the tile configuration).
#define MMI_BEGIN_portable(NAME, MMI_T)
#define MMI_BEGIN_vnni(NAME, MMI_T)
#define MMI_END_portable
#define MMI_END_vnni
// What a kernel does before its item (matmul_int8_amx.cl: a tile's last items of 8 tokens or
// fewer take the VNNI item instead).
#define MMI_KERNEL_HEAD_portable(NAME, BITS, LAYOUT)
#define MMI_KERNEL_HEAD_vnni(NAME, BITS, LAYOUT)

// One block of a matmul_i8 work-item (DEFINE_MATMUL_INT8): acc[i] += the 16 rows' dots (u, the
// weights' lane vectors; dw, their scales) with token i's block b. 8 bits: the zero point's
// correction (MMI_SUMS0) starts the dot; 16: all of it (MMI_SUMS1) the low plane's.
#define MMI_BLOCK_DOTS(MMI_T, ISA, BITS)                                                           \
  {                                                                                                \
    global const uchar* group = groups + (ulong)b * MMI_GROUP_BYTES;                               \
    MMI_DOTS(MMI_T, ISA, BITS, 0, 8,                                                               \
             MMI_TOK_INT(MMI_T, i, BITS == 16 ? MMI_SUMS1 : MMI_SUMS0))                            \
    _Pragma("unroll") for (uint i = 0; i < MMI_T; ++i) {                                           \
      const float16 scale = dw * MMI_TOK_DX(MMI_T, i);                                             \
      acc[i] = fma(convert_float16(MMI_INT(i, BITS)), scale, acc[i]);                              \
    }                                                                                              \
  }

// The block loop over the file's layout: the item's first row r0, N_ROWS of its 16 rows valid.
#define MMI_LOOP_file(NAME, MMI_T, ISA, BITS, N_ROWS)                                              \
  for (uint b = 0; b < n_blocks; ++b) {                                                            \
    mmi_prefetch_lines(next_base + (ulong)b * lines_per_block * 64, lines_per_block);              \
    global const uchar* wb = w_item + (ulong)b * BLOCK_BYTES_##NAME;                               \
    int16 u[8];                                                                                    \
    mmi_block_##NAME(wb, row_bytes, N_ROWS, u);                                                    \
    const float16 dw = mmi_scales(wb, row_bytes, N_ROWS);                                          \
    MMI_BLOCK_DOTS(MMI_T, ISA, BITS)                                                               \
  }
// Items of the file's layout start at row_begin; two copies of the loop: all 16 rows valid
// (strided addresses), or a range's last rows.
#define MMI_ITEM_file(NAME, MMI_T, ISA, BITS)                                                      \
  const uint r0 = row_begin + item_rows * 16;                                                      \
  MMI_ITEM_START(NAME, MMI_T, ISA)                                                                 \
  const ulong row_bytes = (ulong)n_blocks * BLOCK_BYTES_##NAME;                                    \
  global const uchar* w_item = w + w_off + (ulong)r0 * row_bytes;                                  \
  /* The next item's rows (the next 16, one contiguous range), a few lines per block (a few       \
     past its end at most: prefetches never fault). */                                            \
  const uint next_rows = r0 + 16 < row_end ? min(16u, row_end - r0 - 16) : 0;                      \
  global const uchar* next_base = w_item + 16 * row_bytes;                                         \
  const uint next_lines = (uint)((next_rows * row_bytes + 63) / 64);                               \
  const uint lines_per_block = (next_lines + n_blocks - 1) / n_blocks;                             \
  if (r0 + 16 <= row_end)                                                                          \
    MMI_LOOP_file(NAME, MMI_T, ISA, BITS, 16u) else MMI_LOOP_file(NAME, MMI_T, ISA, BITS,          \
                                                                  row_end - r0)
// Items of the tiled layout are its 16-row groups (w: the whole tensor's copy, w_off 0), from the
// one holding row_begin. A copy is one ascending stream, read front to back. Prefetching the
// next group's block with each block (as the file layout does) took 1.2-1.3x (Q4_0) and 1.8x
// (Q8_0) the CPU time of none in a llama3.2-1b decode's GEMVs on an AMD EPYC (bench/kquant/
// RESULTS.md, 2026-11-26). Prefetching the same stream a few KiB ahead into L2 (prefetcht2, one
// per line of the block, as the K-quants do) is what an Intel Xeon's two cores need to keep
// enough lines in flight: its hardware prefetcher alone left a decode token's Q4_0 GEMVs at
// 45 ms, 31.7 with 4 KiB ahead (Q8_0: 64 -> 47.7 ms with 8 KiB; 8-token tiles 65 -> 49 and
// 103 -> 70 ms; bench/kquant/RESULTS.md, 2026-12-06). Past the tensor's end it reads nothing:
// prefetches never fault.
#define MMI_AHEAD_q4_0 4096
#define MMI_AHEAD_q8_0 8192
// Every line of [first, first + bytes) into L2; the K-quants' KQ_PREFETCH uses it too.
#define MMI_PREFETCH_L2(first, bytes)                                                              \
  for (uint l = 0; l < ((bytes) + 63) / 64; ++l)                                                   \
      __asm__ volatile("prefetcht2 (%0)" : : "r"((first) + l * 64));
#define MMI_PREFETCH_AHEAD(NAME, wb) MMI_PREFETCH_L2((wb) + MMI_AHEAD_##NAME, TILED_BYTES_##NAME)
#define MMI_ITEM_tiled(NAME, MMI_T, ISA, BITS)                                                     \
  const uint r0 = (row_begin & ~15u) + item_rows * 16;                                             \
  MMI_ITEM_START(NAME, MMI_T, ISA)                                                                 \
  global const uchar* w_item = w + (ulong)(r0 / 16) * n_blocks * TILED_BYTES_##NAME;               \
  for (uint b = 0; b < n_blocks; ++b) {                                                            \
    global const uchar* wb = w_item + (ulong)b * TILED_BYTES_##NAME;                               \
    MMI_PREFETCH_AHEAD(NAME, wb)                                                                   \
    int16 u[8];                                                                                    \
    mmi_tiled_##NAME(wb, u);                                                                       \
    const float16 dw = mmi_tiled_scales(wb);                                                       \
    MMI_BLOCK_DOTS(MMI_T, ISA, BITS)                                                               \
  }
// Shared by both: the item's output rows, the tile of its tokens, the accumulators.
#define MMI_ITEM_START(NAME, MMI_T, ISA)                                                           \
  const uint t0 = t_begin + item_tokens * MMI_T;                                                   \
  if (r0 >= row_end || t0 >= t_end) return;                                                        \
  global const int* tok = (global const int*)(arena + tok_off);                                    \
  int out_row[MMI_T];                                                                              \
  int any_row = 0;                                                                                 \
  _Pragma("unroll") for (uint i = 0; i < MMI_T; ++i) {                                             \
    out_row[i] = t0 + i < t_end ? matmul_out_row(tok, rows_from_table, t0 + i) : -1;               \
    any_row |= out_row[i] >= 0;                                                                    \
  }                                                                                                \
  if (!any_row) return;                                                                            \
  const uint n_blocks = k / QK;                                                                    \
  /* The tile's groups (slots past t_end hold stale data: their outputs are not written). */      \
  const uint slot0 = (t0 - t_begin) % MMI_TILE;                                                    \
  global const uchar* groups =                                                                     \
      q + (ulong)((t0 - t_begin) / MMI_TILE) * n_blocks * MMI_GROUP_BYTES;                         \
  const ulong tile_step = (ulong)n_blocks * MMI_GROUP_BYTES;                                       \
  float16 acc[MMI_T];                                                                              \
  _Pragma("unroll") for (uint i = 0; i < MMI_T; ++i) acc[i] = (float16)(0.0f);                    \
  MMI_BEGIN_##ISA(NAME, MMI_T)

// y[t][r] for 16 rows x MMI_T tokens per work-item (MMI_T = 1, 8 or MMI_TILE = 16: an item's
// tokens lie in one tile of the quantised input; the block dots also serve 2 MMI_TILE, whose
// items span two tiles, for kernel benches). With rows_from_table, token t writes y row
// tok[t].logits_row (nothing for -1), as matmul.cl's kernels. Only rows in [row_begin, row_end)
// are written. ITEM names the family of per-item bodies (ITEM##_file / ITEM##_tiled: MMI_ITEM here,
// KQ_ITEM in matmul_kq_cpu.cl), each declaring r0, out_row and acc.
#define DEFINE_MATMUL_INT8(ITEM, NAME, MMI_T, ISA, BITS, LAYOUT)                                   \
  MMI_TARGET_##ISA void matmul_i8_##NAME##_t##MMI_T##_##ISA##_a##BITS##_##LAYOUT##_item(           \
      global const uchar* w, ulong w_off, uint k, global uchar* arena, ulong y_off, uint y_stride, \
      uint row_begin, uint row_end, uint t_begin, uint t_end, ulong tok_off, int rows_from_table,  \
      global const uchar* q, uint item_rows, uint item_tokens) {                                   \
    ITEM##_##LAYOUT(NAME, MMI_T, ISA, BITS) MMI_END_##ISA                                          \
    global float* y = (global float*)(arena + y_off);                                              \
    _Pragma("unroll") for (uint i = 0; i < MMI_T; ++i) {                                           \
      if (out_row[i] < 0) continue;                                                                \
      global float* yr = y + (ulong)out_row[i] * y_stride + r0;                                    \
      if (r0 >= row_begin && r0 + 16 <= row_end) {                                                 \
        vstore16(__builtin_shufflevector(acc[i], acc[i], 0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, \
                                         7, 11, 15),                                               \
                 0, yr);                                                                           \
      } else {                                                                                     \
        _Pragma("unroll") for (uint L = 0; L < 16; ++L) {                                          \
          const uint r = r0 + MMI_ROW_OF_LANE(L);                                                  \
          if (r >= row_begin && r < row_end) yr[MMI_ROW_OF_LANE(L)] = acc[i][L];                   \
        }                                                                                          \
      }                                                                                            \
    }                                                                                              \
  }                                                                                                \
  kernel void matmul_i8_##NAME##_t##MMI_T##_##ISA##_a##BITS##_##LAYOUT(                            \
      global const uchar* w, ulong w_off, uint k, global uchar* arena, ulong y_off, uint y_stride, \
      uint row_begin, uint row_end, uint t_begin, uint t_end, ulong tok_off, int rows_from_table,  \
      global const uchar* q) {                                                                     \
    MMI_KERNEL_HEAD_##ISA(NAME, BITS, LAYOUT)                                                      \
    matmul_i8_##NAME##_t##MMI_T##_##ISA##_a##BITS##_##LAYOUT##_item(                               \
        w, w_off, k, arena, y_off, y_stride, row_begin, row_end, t_begin, t_end, tok_off,          \
        rows_from_table, q, get_global_id(0), get_global_id(1));                                   \
  }
#define DEFINE_MATMUL_INT8_ALL(ITEM, NAME, MMI_T, LAYOUT)                                          \
  INT8_ISA_portable(DEFINE_MATMUL_INT8(ITEM, NAME, MMI_T, portable, 8, LAYOUT))                    \
  INT8_ISA_vnni(DEFINE_MATMUL_INT8(ITEM, NAME, MMI_T, vnni, 8, LAYOUT))                            \
  INT8_ISA_portable(DEFINE_MATMUL_INT8(ITEM, NAME, MMI_T, portable, 16, LAYOUT))                   \
  INT8_ISA_vnni(DEFINE_MATMUL_INT8(ITEM, NAME, MMI_T, vnni, 16, LAYOUT))
DEFINE_MATMUL_INT8_ALL(MMI_ITEM, q4_0, 1, file)
DEFINE_MATMUL_INT8_ALL(MMI_ITEM, q4_0, 8, file)  // half a tile
DEFINE_MATMUL_INT8_ALL(MMI_ITEM, q8_0, 1, file)
DEFINE_MATMUL_INT8_ALL(MMI_ITEM, q8_0, 8, file)
DEFINE_MATMUL_INT8_ALL(MMI_ITEM, q4_0, 1, tiled)
DEFINE_MATMUL_INT8_ALL(MMI_ITEM, q4_0, 8, tiled)
DEFINE_MATMUL_INT8_ALL(MMI_ITEM, q8_0, 1, tiled)
DEFINE_MATMUL_INT8_ALL(MMI_ITEM, q8_0, 8, tiled)

#endif  // __x86_64__ && __clang__
