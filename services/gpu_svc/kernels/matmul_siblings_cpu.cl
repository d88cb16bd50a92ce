// ---- CPU devices (PoCL, x86): sibling matmuls as one launch (the runner's op_fusion.h,
// Fusion::sibling_matmuls; GpuKernels::matmul_siblings).
//
// A layer's Q, K and V projections, and its gate and up projections, read the same quantised
// input. Launched apart, each is a kernel of its own, and on PoCL every launch that waits for the
// one before wakes the worker threads and waits for the slowest: ~10-20 us beyond its work here
// (bench/kquant/RESULTS.md), for a decode GEMV of ~100-900 us. This kernel runs up to three such
// matmuls as ONE NDRange: its work-items are segment 0's 16-row items, then segment 1's, then
// segment 2's, and each calls the per-item function of its segment's own kernel
// (matmul_i8_<type>_t1_<isa>_a<bits>_tiled_item, matmul_int8.cl / matmul_kq_cpu.cl) with that
// segment's weights, rows and output: so every output has the bits of the matmuls apart.
//
// One token (the T = 1 kernels: decode), tiled weights, whole tensors (rows from 0). Segments may
// differ in type (Q4_K_M puts Q6_K on some V tensors beside Q4_K Q and K) where they share the
// quantised input, i.e. its zero-point shift: Q4_0 alone, Q8_0 alone, or the K types together.
// Unused segments have 0 rows. Only the decode variants exist: each kernel is compiled for the
// whole program (PoCL), and prefill's few large launches lose little to launch costs.
#if defined(__x86_64__) && defined(__clang__)

// Segment type codes (sibling_type_code in gpu_kernels_fused.cpp).
#define SIB_Q4_0 0
#define SIB_Q8_0 1
#define SIB_Q4_K 2
#define SIB_Q5_K 3
#define SIB_Q6_K 4
// ITEM(NAME, ...) for the segment type code `type`: the type dispatch of the sibling launch and
// of the step chains' matmul stages (step_chain_cpu.cl).
#define SIB_SWITCH_TYPE(type, ITEM, ...) \
  switch (type) {                        \
    case SIB_Q4_0:                       \
      ITEM(q4_0, __VA_ARGS__);           \
      break;                             \
    case SIB_Q8_0:                       \
      ITEM(q8_0, __VA_ARGS__);           \
      break;                             \
    case SIB_Q4_K:                       \
      ITEM(q4_k, __VA_ARGS__);           \
      break;                             \
    case SIB_Q5_K:                       \
      ITEM(q5_k, __VA_ARGS__);           \
      break;                             \
    case SIB_Q6_K:                       \
      ITEM(q6_k, __VA_ARGS__);           \
      break;                             \
  }

#define SIB_ITEM(NAME, ISA, BITS)                                                            \
  matmul_i8_##NAME##_t1_##ISA##_a##BITS##_tiled_item(w, 0, k, arena, y_off, y_stride, 0, rows, \
                                                     t_begin, t_begin + 1, 0, 0, q, item, 0)

#define DEFINE_MATMUL_SIBLINGS(ISA, BITS)                                                         \
  kernel void matmul_i8_siblings_t1_##ISA##_a##BITS(                                              \
      uint k, global uchar* arena, uint t_begin, global const uchar* q, global const uchar* w0,   \
      uint type0, uint rows0, ulong y0_off, uint y0_stride, global const uchar* w1, uint type1,   \
      uint rows1, ulong y1_off, uint y1_stride, global const uchar* w2, uint type2, uint rows2,   \
      ulong y2_off, uint y2_stride) {                                                             \
    uint item = get_global_id(0);                                                                 \
    const uint items0 = (rows0 + 15) / 16, items1 = (rows1 + 15) / 16;                            \
    global const uchar* w = w0;                                                                   \
    uint type = type0, rows = rows0, y_stride = y0_stride;                                        \
    ulong y_off = y0_off;                                                                         \
    if (item >= items0) {                                                                         \
      item -= items0;                                                                             \
      w = w1;                                                                                     \
      type = type1;                                                                               \
      rows = rows1;                                                                               \
      y_off = y1_off;                                                                             \
      y_stride = y1_stride;                                                                       \
      if (item >= items1) { /* past segment 2's items: its item function returns */               \
        item -= items1;                                                                           \
        w = w2;                                                                                   \
        type = type2;                                                                             \
        rows = rows2;                                                                             \
        y_off = y2_off;                                                                           \
        y_stride = y2_stride;                                                                     \
      }                                                                                           \
    }                                                                                             \
    SIB_SWITCH_TYPE(type, SIB_ITEM, ISA, BITS)                                                    \
  }
INT8_ISA_portable(DEFINE_MATMUL_SIBLINGS(portable, 8))
INT8_ISA_vnni(DEFINE_MATMUL_SIBLINGS(vnni, 8))
INT8_ISA_portable(DEFINE_MATMUL_SIBLINGS(portable, 16))
INT8_ISA_vnni(DEFINE_MATMUL_SIBLINGS(vnni, 16))

#endif  // __x86_64__ && __clang__
