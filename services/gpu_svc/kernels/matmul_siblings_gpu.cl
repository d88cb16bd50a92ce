// ---- GPUs: sibling GEMVs as one launch (the runner's op_fusion.h, Fusion::sibling_matmuls;
// GpuKernels::matmul_siblings).
//
// A layer's Q, K and V projections, and its gate and up projections, read the same input rows.
// Launched apart each is a kernel of its own, and NVIDIA's OpenCL costs 16-19 us of host time per
// enqueue: a llama3.2-1b decode step's ~259 launches took ~4.5 ms of a ~7 ms token on the H100,
// beside ~3 ms of kernels (bench/gpu/RESULTS.md, "2026-11-28: discrete GPUs"). These kernels run
// up to three such GEMVs as ONE NDRange: work-groups [0, groups(rows0)) are segment 0's, the next
// groups(rows1) segment 1's, the rest segment 2's, and each runs the work-group code of the GEMV
// the segment would launch apart (GEMV_FAST_BEGIN/END, GEMV_COOP_GROUP, GEMV_COOP4_Q4_0_GROUP in
// matmul_gpu.cl; KQ_GEMV_BEGIN/END in matmul_kq_gpu.cl) with that segment's weights, rows and output,
// its group index counted from the segment's first: so every output has the bits of the GEMVs
// apart.
//
// Every segment would launch the same kernel (the same type, layout and variant; the host's
// GpuKernels::siblings_fuse checks), except that the K-quant one takes Q4_K, Q5_K and Q6_K
// segments together (Q4_K_M puts Q6_K on some V tensors beside Q4_K Q and K): its segments carry
// a type code. Segments start at row 0 and write token rows t_begin + get_global_id(1) (the
// GEMVs' up to 4 tokens); an unused segment has 0 rows and so no work-groups. Only the GEMV
// variants GpuKernels picks by shape have sibling kernels (not the tuning ones).

// K-quant segment type codes (sibling_type_code in gpu_kernels_fused.cpp).
#define GEMV_SIB_Q4_K 2
#define GEMV_SIB_Q5_K 3
#define GEMV_SIB_Q6_K 4

// The arguments every sibling kernel takes: the shared input and token, then per segment its
// weights (buffer, byte offset, the tensor's rows: a packed layout's w_rows), type code, rows
// computed (from 0) and output.
#define GEMV_SIB_PARAMS                                                                             \
  uint k, global uchar* arena, ulong x_off, uint x_stride, uint t_begin, ulong tok_off,             \
      global const uchar* w0, ulong w0_off, uint w0_rows, uint type0, uint rows0, ulong y0_off,     \
      uint y0_stride, global const uchar* w1, ulong w1_off, uint w1_rows, uint type1, uint rows1,   \
      ulong y1_off, uint y1_stride, global const uchar* w2, ulong w2_off, uint w2_rows,             \
      uint type2, uint rows2, ulong y2_off, uint y2_stride

// This work-group's segment: the names the GEMVs' group code reads (w, w_off, w_rows, row_begin,
// row_end, y_off, y_stride, rows_from_table) and grp, its group index in the segment.
#define GEMV_SIB_SEGMENT(ROWS_PER_GROUP)                                                            \
  const uint groups0 = (rows0 + (ROWS_PER_GROUP) - 1) / (ROWS_PER_GROUP);                           \
  const uint groups1 = (rows1 + (ROWS_PER_GROUP) - 1) / (ROWS_PER_GROUP);                           \
  const uint seg = get_group_id(0) < groups0 ? 0u : get_group_id(0) < groups0 + groups1 ? 1u : 2u;  \
  const uint grp = get_group_id(0) - (seg == 0 ? 0u : seg == 1 ? groups0 : groups0 + groups1);      \
  global const uchar* w = seg == 0 ? w0 : seg == 1 ? w1 : w2;                                       \
  const ulong w_off = seg == 0 ? w0_off : seg == 1 ? w1_off : w2_off;                               \
  const uint w_rows = seg == 0 ? w0_rows : seg == 1 ? w1_rows : w2_rows;                            \
  const uint type = seg == 0 ? type0 : seg == 1 ? type1 : type2;                                    \
  const uint row_end = seg == 0 ? rows0 : seg == 1 ? rows1 : rows2;                                 \
  const ulong y_off = seg == 0 ? y0_off : seg == 1 ? y1_off : y2_off;                               \
  const uint y_stride = seg == 0 ? y0_stride : seg == 1 ? y1_stride : y2_stride;                    \
  const uint row_begin = 0;                                                                         \
  const int rows_from_table = 0;                                                                    \
  (void)w_rows;                                                                                     \
  (void)type;

// The fast GEMV (packed Q4_0/Q8_0, aligned F16/F32): gemv_<type>_<variant>_siblings.
#define GEMV_FAST_SIBLINGS(KNAME, LANES, RPL, LOCALS, BODY)                                        \
  kernel __attribute__((reqd_work_group_size(LANES * PG_GROUPS, 1, 1))) void KNAME(                \
      GEMV_SIB_PARAMS) {                                                                           \
    GEMV_FAST_LOCALS(LANES, RPL)                                                                   \
    LOCALS                                                                                         \
    GEMV_SIB_SEGMENT(PG_GROUPS * RPL)                                                              \
    GEMV_FAST_BEGIN(LANES, RPL)                                                                    \
    BODY                                                                                           \
    GEMV_FAST_END(LANES, RPL)                                                                      \
  }
// GpuKernels' picks by shape: l32r2 / l128r4 for F16/F32, l16r4x / l64r4x for packed tensors.
#define DEFINE_GEMV_FAST_SIBLINGS_FLOAT(TYPE, BODY)                                              \
  GEMV_FAST_SIBLINGS(gemv_##TYPE##_l32r2_siblings, 32, 2, , BODY(32, 2, 0))                      \
  GEMV_FAST_SIBLINGS(gemv_##TYPE##_l128r4_siblings, 128, 4, , BODY(128, 4, 0))
#define DEFINE_GEMV_FAST_SIBLINGS_PACKED(TYPE, X_BODY, LOCALS)                                   \
  GEMV_FAST_SIBLINGS(gemv_##TYPE##_l16r4x_siblings, 16, 4, LOCALS, X_BODY(16, 4, 1))             \
  GEMV_FAST_SIBLINGS(gemv_##TYPE##_l64r4x_siblings, 64, 4, LOCALS, X_BODY(64, 4, 1))
DEFINE_GEMV_FAST_SIBLINGS_PACKED(packed_q4_0, GEMV_PACKED_Q4_0_X_BODY, GEMV_X_LOCALS)
DEFINE_GEMV_FAST_SIBLINGS_PACKED(packed_q8_0, GEMV_PACKED_Q8_0_X_BODY, GEMV_X_LOCALS)
DEFINE_GEMV_FAST_SIBLINGS_FLOAT(vec_f16, GEMV_VEC_F16_BODY)
DEFINE_GEMV_FAST_SIBLINGS_FLOAT(vec_f32, GEMV_VEC_F32_BODY)

// The file layout's cooperative GEMVs: gemv_coop_<type>_siblings, gemv_coop4_q4_0_siblings.
#define DEFINE_GEMV_COOP_SIBLINGS(NAME)                                                            \
  kernel void gemv_coop_##NAME##_siblings(GEMV_SIB_PARAMS) {                                       \
    GEMV_COOP_LOCALS                                                                               \
    GEMV_SIB_SEGMENT(GEMV_ROWS)                                                                    \
    GEMV_COOP_GROUP(NAME)                                                                          \
  }
DEFINE_GEMV_COOP_SIBLINGS(q8_0)
DEFINE_GEMV_COOP_SIBLINGS(f16)
DEFINE_GEMV_COOP_SIBLINGS(f32)
kernel void gemv_coop4_q4_0_siblings(GEMV_SIB_PARAMS) {
  GEMV_COOP4_LOCALS
  GEMV_SIB_SEGMENT(GEMV4_ROWS)
  GEMV_COOP4_Q4_0_GROUP
}

// The K-quant GEMV, any mix of Q4_K, Q5_K and Q6_K segments: gemv_kq_siblings. A work-group's
// type is its segment's (uniform: no divergence), its lane code gemv_kq_<type>'s.
#define GEMV_KQ_SIB_BLOCK_BYTES \
  (type == GEMV_SIB_Q4_K ? KQ_BYTES_q4_k : type == GEMV_SIB_Q5_K ? KQ_BYTES_q5_k : KQ_BYTES_q6_k)
#define GEMV_KQ_SIB_QS_AT (type == GEMV_SIB_Q4_K ? 16u : type == GEMV_SIB_Q5_K ? 48u : 0u)
#define GEMV_KQ_SIB_LANES                \
  if (type == GEMV_SIB_Q4_K) {           \
    KQ_GEMV_LANE_SCALED(0)               \
  } else if (type == GEMV_SIB_Q5_K) {    \
    KQ_GEMV_LANE_SCALED(1)               \
  } else {                               \
    KQ_GEMV_LANE_Q6                      \
  }
kernel __attribute__((reqd_work_group_size(32 * KQ_GEMV_ROWS, 1, 1))) void gemv_kq_siblings(
    GEMV_SIB_PARAMS) {
  KQ_GEMV_LOCALS
  GEMV_SIB_SEGMENT(KQ_GEMV_ROWS)
  KQ_GEMV_BEGIN(GEMV_KQ_SIB_BLOCK_BYTES, GEMV_KQ_SIB_QS_AT)
  GEMV_KQ_SIB_LANES
  KQ_GEMV_END
}
