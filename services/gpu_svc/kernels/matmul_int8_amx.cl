// ---- CPU devices (PoCL, x86) with AMX (Intel's tile unit, Sapphire Rapids on): the integer
// matmuls' block dots (matmul_int8.cl's MMI_DOTS) as tile products, for items of 16 tokens.
//
// A tile product tdpbsud C += A B takes A = M rows of K signed bytes and B = K / 4 rows of 64
// unsigned bytes, where B's row g holds, for each of 16 columns n, 4 consecutive K values: C[m][n]
// = sum over k of A[m][k] B[k / 4][4 n + k % 4], in int32, exact, no saturation. The weights' lane
// vectors u[g] (dword g of the 16 rows' quants, lane = row) are that B as they are, and one plane
// of a group's 16 token slots (plane 0 at slot * 64, plane 1 at slot * 64 + 32) is A, rows 64
// bytes apart. So one product gives, for the 16 tokens and 16 rows, the int dots the vpdpbusd
// chains give (the same ints, hence the same bits everywhere downstream), K = 4 (G1 - G0) quants
// at once, where vpdpbusd needs 16 (G1 - G0) instructions a plane. The int32 come back through a
// private 2 KiB scratch (a tile store; no tile-to-vector move exists), and the float epilogue is
// matmul_int8.cl's. (With 8-slot input tiles, products of 8 rows: no faster than vpdpbusd; see
// bench/kquant/RESULTS.md, 2026-12-06 AMX.)
//
// Tile registers (configured per work-item by MMI_BEGIN_amx, released by MMI_END_amx):
//   tmm0, tmm1: C, plane 0 and plane 1 (16-bit activations) of the 16 tokens x 16 rows, int32
//   tmm4, tmm5: A, the 16 tokens' 4 NG quants of plane 0 and plane 1 (NG = G1 - G0: 8, Q6_K's 4)
//   tmm6: B, NG rows of 64 bytes: u[G0..G1)
// The process must have asked the kernel for the tile state first (arch_prctl
// ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA: gpu_kernels.cpp's request_amx), or the first tile
// instruction faults; gpu_svc picks these kernels only when that request succeeded.
#if defined(__x86_64__) && defined(__clang__)

#define MMI_TARGET_amx __attribute__((noinline, target("avx512vnni")))
// The K dwords per product (G1 - G0 of every MMI_DOTS of the type): 32 quants, Q6_K's 16.
#define MMI_AMX_NG_q4_0 8
#define MMI_AMX_NG_q8_0 8
#define MMI_AMX_NG_q4_k 8
#define MMI_AMX_NG_q5_k 8
#define MMI_AMX_NG_q6_k 4

// ldtilecfg's 64 bytes: palette 1, then bytes per row (16 x uint16 at 16) and rows (16 x uint8
// at 48) of each tile register.
__attribute__((always_inline)) inline void mmi_amx_config(uint ng) {
  uchar cfg[64] __attribute__((aligned(64)));
#pragma unroll
  for (uint i = 0; i < 64; ++i) cfg[i] = 0;
  cfg[0] = 1;
#pragma unroll
  for (uint t = 0; t < 8; ++t) {
    cfg[16 + 2 * t] = (uchar)(t == 4 || t == 5 ? 4 * ng : 64);
    cfg[48 + t] = (uchar)(t >= 6 ? ng : 16);
  }
  __asm__ volatile("ldtilecfg (%0)" : : "r"(cfg) : "memory");
}

// The tile products of one MMI_DOTS: b = the NG lane vectors (private), a = plane 0 of token
// slot 0 at the dwords' offset in the group; c = 32 rows of 16 int32 (plane 0 of tokens 0-15,
// then plane 1's).
__attribute__((always_inline)) inline void mmi_amx_dots(const int16* b, global const uchar* a,
                                                        int16* c, uint bits) {
  const long stride = 64;
  if (bits == 16) {
    __asm__ volatile(
        "tileloadd (%[b],%[s],1), %%tmm6\n\t"
        "tileloadd (%[a],%[s],1), %%tmm4\n\t"
        "tileloadd 32(%[a],%[s],1), %%tmm5\n\t"
        "tilezero %%tmm0\n\t"
        "tilezero %%tmm1\n\t"
        "tdpbsud %%tmm6, %%tmm4, %%tmm0\n\t"
        "tdpbsud %%tmm6, %%tmm5, %%tmm1\n\t"
        "tilestored %%tmm0, (%[c],%[s],1)\n\t"
        "tilestored %%tmm1, 1024(%[c],%[s],1)\n\t"
        :
        : [b] "r"(b), [a] "r"(a), [c] "r"(c), [s] "r"(stride)
        : "memory");
  } else {
    __asm__ volatile(
        "tileloadd (%[b],%[s],1), %%tmm6\n\t"
        "tileloadd (%[a],%[s],1), %%tmm4\n\t"
        "tilezero %%tmm0\n\t"
        "tdpbsud %%tmm6, %%tmm4, %%tmm0\n\t"
        "tilestored %%tmm0, (%[c],%[s],1)\n\t"
        :
        : [b] "r"(b), [a] "r"(a), [c] "r"(c), [s] "r"(stride)
        : "memory");
  }
}

// An AMX item is a whole input tile of 16 tokens (the array below fails to compile for others).
// The tile state is released at its end: a thread switched out between items saves none.
#define MMI_BEGIN_amx(NAME, MMI_T)                      \
  typedef char mmi_amx_needs_t16[MMI_T == 16 ? 1 : -1]; \
  mmi_amx_config(MMI_AMX_NG_##NAME);                    \
  int16 amx_b[8], amx_c[32];
#define MMI_END_amx __asm__ volatile("tilerelease" : : : "memory");

// MMI_DOTS by tiles: the lane vectors out to B's scratch, the products, then dot[i] / dot_lo[i]
// from the stored C rows with the starting value added (int adds: the same ints).
#define MMI_DOTS_amx(MMI_T, ISA, BITS, G0, G1, INIT)                       \
  _Pragma("unroll") for (uint g = G0; g < G1; ++g) amx_b[g - (G0)] = u[g]; \
  mmi_amx_dots(amx_b, group + 4 * (G0), amx_c, BITS);                      \
  _Pragma("unroll") for (uint i = 0; i < MMI_T; ++i) {                     \
    const int init = INIT;                                                 \
    dot[i] = amx_c[i] + (BITS == 16 ? 0 : init);                           \
    dot_lo[i] = BITS == 16 ? amx_c[16 + i] + init : (int16)(0);            \
  }

// An item whose tile holds 8 tokens or fewer of the launch (the last of a launch of 16 n + 1..8
// tokens) runs the VNNI 8-token item over the tile's first 8 slots: the same ints (hence bits),
// for half the work of a 16-slot product whose rows past the launch are discarded (a 54-token
// prefill's fourth tile holds 6).
#define MMI_KERNEL_HEAD_amx(NAME, BITS, LAYOUT)                                                 \
  {                                                                                             \
    const uint t0 = t_begin + (uint)get_global_id(1) * MMI_TILE;                                \
    if (t0 < t_end && t_end - t0 <= 8) {                                                        \
      matmul_i8_##NAME##_t8_vnni_a##BITS##_##LAYOUT##_item(                                     \
          w, w_off, k, arena, y_off, y_stride, row_begin, row_end, t_begin, t_end, tok_off,     \
          rows_from_table, q, get_global_id(0), 2 * (uint)get_global_id(1));                    \
      return;                                                                                   \
    }                                                                                           \
  }

// In the VNNI program only (cl_device.cpp's split): AMX implies VNNI, and the tail's item is there.
#define DEFINE_MATMUL_INT8_AMX(ITEM, NAME, LAYOUT)                 \
  INT8_ISA_vnni(DEFINE_MATMUL_INT8(ITEM, NAME, 16, amx, 8, LAYOUT)) \
  INT8_ISA_vnni(DEFINE_MATMUL_INT8(ITEM, NAME, 16, amx, 16, LAYOUT))
DEFINE_MATMUL_INT8_AMX(MMI_ITEM, q4_0, file)
DEFINE_MATMUL_INT8_AMX(MMI_ITEM, q8_0, file)
DEFINE_MATMUL_INT8_AMX(MMI_ITEM, q4_0, tiled)
DEFINE_MATMUL_INT8_AMX(MMI_ITEM, q8_0, tiled)

#endif  // __x86_64__ && __clang__
