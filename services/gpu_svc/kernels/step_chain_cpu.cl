// ---- CPU devices (PoCL, x86): a run of a decode step's ops as ONE launch (GpuKernels' chains,
// gpu_kernels_chain.cpp; issue 19's decode share).
//
// On PoCL every kernel that follows another wakes the worker threads, which sleep between
// kernels: 12-19 us a launch on two threads in a KVM guest, ~170 launches a llama3.2-1b decode
// token (bench/kquant/RESULTS.md). llama.cpp's threads spin between ops instead. Here the ops of
// a run are stages of one kernel of one work-group per compute unit (each of one work-item), and
// the groups spin between the stages that depend on each other: so the threads never sleep
// inside a run.
//
// Scheduling: a stage is cut into chunks (a few matmul items, or blocks); group g first runs the
// chunks of its own contiguous share (so each thread streams one range of the weights, as
// PoCL's split of an NDRange does; interleaved chunks measured 25% slower), then steals what is
// left of the other shares. A chunk is claimed by an atomic increment of its share's counter, so
// a group that starts late (or never) only has its share done by the others: no group waits for
// work that nobody claimed, and the kernel cannot deadlock however PoCL places the groups. A
// stage with `barrier` set waits until every stage since the last barrier is done (sibling
// matmuls share one barrier). The last group to leave zeroes the counters for the next launch.
//
// Every stage calls the very function its kernel apart calls (the matmuls' noinline _item
// functions, q8_act_block, swiglu_block, the CHAIN_SHARED bodies of rope_heads_pair, the KV
// writes and the CPU attention kernels) or repeats its arithmetic in its order (add_rmsnorm_q8's
// lsz partial sums and their tree), so a chained step has the bits of the kernels apart. A
// llama3.2-1b decode step is then the embedding, two chains (64 weight buffers a chain: the
// file's and each tiled copy) and the output projection.
// One token (decode: t_end = t_begin + 1), the quantised-input slot 0.
#if defined(__x86_64__) && defined(__clang__)

// Stage table: CH_WORDS uints a stage (GpuKernels::ChainStage writes them).
#define CH_WORDS 32
#define CH_QUANTIZE 1
#define CH_MATMUL 2
#define CH_ADD_RMSNORM_Q8 3
#define CH_SWIGLU_Q8 4
#define CH_ROPE_PAIR 5
#define CH_KV_WRITE 6
#define CH_ATTENTION 7
#define CH_ATTN_MERGE 8
// Counters: CH_SYNC uints a stage, a 64-byte line per group w: [16 w] the next chunk of share w,
// [16 w + 1] the chunks group w has done. One line each, so a group claims and counts its own
// chunks without taking a line from the other (the counts of all groups shared one line, and
// shares 2k and 2k + 1 another: a cross-core transfer at every chunk). A barrier sums the counts
// with plain loads (x86 loads of aligned words are atomic, and the fence orders what follows).
#define CH_SYNC 128
#define CH_MAX_GROUPS 8
#define CH_MAX_STAGES 256
#define CH_EXIT (CH_MAX_STAGES * CH_SYNC)  // groups that left

#define CH_U64(st, i) ((ulong)(st)[i] | ((ulong)(st)[(i) + 1] << 32))

__attribute__((always_inline)) inline void ch_pause(void) {
  __asm__ volatile("pause");
}

// add_rmsnorm_q8 (matmul_int8.cl) for one token, by one work-item: the same lsz partial sums
// (add_square_sum, lane by lane), the same tree (serially: the kernel's barriers cannot run in a
// chain), the same scale and blocks (rmsnorm_q8_blocks).
__attribute__((always_inline)) inline void ch_add_rmsnorm_q8(global const uint* st,
                                                             global uchar* arena,
                                                             global const uchar* w,
                                                             global uchar* q) {
  const ulong a_off = CH_U64(st, 4), b_off = CH_U64(st, 7), x_off = CH_U64(st, 11);
  const ulong out_off = CH_U64(st, 14), w_off = CH_U64(st, 17);
  const uint a_stride = st[6], b_stride = st[9], has_add = st[10], x_stride = st[13];
  const uint out_stride = st[16], dim = st[20], t = st[26], bits = st[23], zp_shift = st[24];
  const uint lsz = st[25];  // t: st[26], as every stage
  const float eps = as_float(st[21]);
  global float* x = (global float*)(arena + x_off) + (ulong)t * x_stride;
  float partial[16];
  for (uint lid = 0; lid < lsz; ++lid)
    partial[lid] =
        add_square_sum(arena, a_off, a_stride, b_off, b_stride, has_add, x, dim, t, lid, lsz);
  for (uint half_n = lsz / 2; half_n > 0; half_n /= 2)
    for (uint lid = 0; lid < half_n; ++lid) partial[lid] += partial[lid + half_n];
  const float scale = rsqrt(partial[0] / (float)dim + eps);
  global float* out = (global float*)(arena + out_off) + (ulong)t * out_stride;
  rmsnorm_q8_blocks(x, scale, (global const float*)(w + w_off), out, q, dim / QK, 0, 1, 0, bits,
                    zp_shift);
}

// One matmul item through its kernel's own item function (type SIB_* code, layout 0 file /
// 1 tiled, bits 8 / 16).
#define CH_ITEM(NAME, ISA, BITS, LAYOUT)                                                         \
  matmul_i8_##NAME##_t1_##ISA##_a##BITS##_##LAYOUT##_item(w, w_off, k, arena, y_off, y_stride,   \
                                                          row_begin, row_end, t, t + 1, tok_off, \
                                                          rows_from_table, q, item, 0)
#define CH_ITEM_BITS(NAME, ISA, LAYOUT) \
  if (bits == 16)                       \
    CH_ITEM(NAME, ISA, 16, LAYOUT);     \
  else                                  \
    CH_ITEM(NAME, ISA, 8, LAYOUT)
#define CH_ITEM_TYPE(ISA, LAYOUT) SIB_SWITCH_TYPE(type, CH_ITEM_BITS, ISA, LAYOUT)

// A group that waits at a barrier has its core and its share of the memory bus idle (8.5% of a
// llama3.2-1b Q4_K_M decode's CPU time was spent there, perf). It spends the wait prefetching
// into L2 the start of its own share of the next tiled matmul (within 4 stages): the lines it
// will read first, which then come from L2 while the other group still streams from DRAM. At
// most CH_WAIT_PREFETCH bytes a matmul, continued across the barriers before it. Returns the
// bytes of that start (0: no tiled matmul ahead) and sets *first.
#ifndef CH_WAIT_PREFETCH
#define CH_WAIT_PREFETCH 262144
#endif
__attribute__((always_inline)) inline ulong ch_next_weights(global const uint* table, uint s,
                                                            uint n_stages, uint g, uint ng,
                                                            global const uchar* const* ws,
                                                            global const uchar** first) {
  for (uint n = s + 1; n < min(n_stages, s + 5); ++n) {
    global const uint* st = table + n * CH_WORDS;
    if (st[0] != CH_MATMUL || !st[19]) continue;
    const uint type = st[4];  // SIB_* (sibling_type_code)
    const bool k_quant = type == SIB_Q4_K || type == SIB_Q5_K || type == SIB_Q6_K;
    const ulong item_bytes = (ulong)(st[9] / (k_quant ? 256 : QK)) *
                             (type == SIB_Q4_0   ? TILED_BYTES_q4_0
                              : type == SIB_Q8_0 ? TILED_BYTES_q8_0
                              : type == SIB_Q4_K ? TILED_BYTES_q4_k
                              : type == SIB_Q5_K ? TILED_BYTES_q5_k
                                                 : TILED_BYTES_q6_k);
    const uint chunks = st[2], unit = st[3], items = st[20];
    const uint i0 = min(items, chunks * g / ng * unit);
    const uint i1 = min(items, chunks * (g + 1) / ng * unit);
    *first = ws[st[6]] + ((ulong)(st[10] >> 4) + i0) * item_bytes;
    return min((ulong)CH_WAIT_PREFETCH, (ulong)(i1 - i0) * item_bytes);
  }
  return 0;
}

// A one-token rope_heads_pair, KV write and attention (split and merge), through the functions
// their kernels apart call (elementwise.cl, kv_write.cl, attention.cl), item by item.
__attribute__((always_inline)) inline void ch_rope_pair(global const uint* st, uint chunk,
                                                        global uchar* arena,
                                                        global const uchar* const* ws) {
  const uint pairs = st[22], unit = st[3], t = st[26];
  for (uint i = chunk * unit; i < min(pairs, (chunk + 1) * unit); ++i)
    rope_heads_pair_at(arena, CH_U64(st, 4), st[6], st[7], CH_U64(st, 8), st[10], st[11], st[12],
                       as_float(st[13]), CH_U64(st, 14), t, 1, as_float(st[16]), st[17],
                       ws[st[18]], CH_U64(st, 19), st[21], i, 0);
}
__attribute__((always_inline)) inline void ch_kv_write(global const uint* st, uint chunk,
                                                       global uchar* arena, global uchar* kv) {
  const uint units = st[16], unit = st[3], t = st[26];
  for (uint i = chunk * unit; i < min(units, (chunk + 1) * unit); ++i) {
#define CH_KV_ARGS                                                                             \
  arena, CH_U64(st, 5), st[7], CH_U64(st, 8), st[10], kv, CH_U64(st, 11), CH_U64(st, 13), st[15], \
      units, st[17], CH_U64(st, 18), CH_U64(st, 20), st[22], i, t
    if (st[4] == 0)
      kv_write_f32_at(CH_KV_ARGS);
    else if (st[4] == 1)
      kv_write_f16_at(CH_KV_ARGS);
    else
      kv_write_q8_0_at(CH_KV_ARGS);
#undef CH_KV_ARGS
  }
}
// Variant [4]: KV type (0 f32, 1 f16, 2 q8_0) x 3 + kernel (0 attention_split_cpu, 1 the GQA
// kernel 4x4, 2 8x2); item j is work-item j % [30] of key chunk j / [30].
#define CH_ATTN_ARGS(j)                                                                          \
  arena, CH_U64(st, 5), st[7], CH_U64(st, 8), st[10], kv, CH_U64(st, 11), CH_U64(st, 13), st[15], \
      st[16], st[17], CH_U64(st, 18), CH_U64(st, 20), st[22], st[23], st[24], st[25],            \
      as_float(st[27]), st[26], partials, st[28], st[29], (j) % st[30], 0, (j) / st[30]
__attribute__((always_inline)) inline void ch_attention(global const uint* st, uint j,
                                                        global uchar* arena, global uchar* kv,
                                                        global float* partials) {
  switch (st[4]) {
    case 0: attention_split_cpu_f32_at(CH_ATTN_ARGS(j)); break;
    case 1: attention_gqa_cpu_f32_4x4_at(CH_ATTN_ARGS(j)); break;
    case 2: attention_gqa_cpu_f32_8x2_at(CH_ATTN_ARGS(j)); break;
    case 3: attention_split_cpu_f16_at(CH_ATTN_ARGS(j)); break;
    case 4: attention_gqa_cpu_f16_4x4_at(CH_ATTN_ARGS(j)); break;
    case 5: attention_gqa_cpu_f16_8x2_at(CH_ATTN_ARGS(j)); break;
    case 6: attention_split_cpu_q8_0_at(CH_ATTN_ARGS(j)); break;
    case 7: attention_gqa_cpu_q8_0_4x4_at(CH_ATTN_ARGS(j)); break;
    case 8: attention_gqa_cpu_q8_0_8x2_at(CH_ATTN_ARGS(j)); break;
  }
}
#undef CH_ATTN_ARGS

// The weight buffers the stages read (a slot each: the file's segment and every tiled copy), as
// CH_MAX_BUFFERS kernel arguments w00 .. w77 (64 pointers: 512 of PoCL's 1024 argument bytes).
#define CH_MAX_BUFFERS 64
#define CH_W8(a)                                                                               \
  global const uchar *w##a##0, global const uchar *w##a##1, global const uchar *w##a##2,       \
      global const uchar *w##a##3, global const uchar *w##a##4, global const uchar *w##a##5,   \
      global const uchar *w##a##6, global const uchar *w##a##7
#define CH_W_PARAMS CH_W8(0), CH_W8(1), CH_W8(2), CH_W8(3), CH_W8(4), CH_W8(5), CH_W8(6), CH_W8(7)
#define CH_N8(a) w##a##0, w##a##1, w##a##2, w##a##3, w##a##4, w##a##5, w##a##6, w##a##7
#define CH_W_NAMES CH_N8(0), CH_N8(1), CH_N8(2), CH_N8(3), CH_N8(4), CH_N8(5), CH_N8(6), CH_N8(7)

#define DEFINE_STEP_CHAIN(ISA)                                                                  \
  void ch_chunk_##ISA(global const uint* st, uint chunk, global uchar* arena, global uchar* q,  \
                      global uchar* kv, global float* partials,                                 \
                      global const uchar* const* ws) {                                          \
    const uint unit = st[3], t = st[26];                                                        \
    switch (st[0]) {                                                                            \
      case CH_QUANTIZE: {                                                                       \
        const ulong x_off = CH_U64(st, 4);                                                      \
        const uint x_stride = st[6], n_blocks = st[7] / QK, bits = st[9], zp_shift = st[10];    \
        global const float* x = (global const float*)(arena + x_off) + (ulong)t * x_stride;     \
        for (uint b = chunk * unit; b < min(n_blocks, (chunk + 1) * unit); ++b)                 \
          q8_act_block(vload16(0, x + b * QK), vload16(1, x + b * QK), q, n_blocks, b, 0, bits, \
                       zp_shift);                                                               \
        break;                                                                                  \
      }                                                                                         \
      case CH_MATMUL: {                                                                         \
        const uint type = st[4], bits = st[5], k = st[9], row_begin = st[10], row_end = st[11]; \
        const ulong w_off = CH_U64(st, 7), y_off = CH_U64(st, 12), tok_off = CH_U64(st, 16);    \
        const uint y_stride = st[14], items = st[20], tiled = st[19];                           \
        const int rows_from_table = (int)st[18];                                                \
        global const uchar* w = ws[st[6]];                                                      \
        for (uint item = chunk * unit; item < min(items, (chunk + 1) * unit); ++item) {         \
          if (tiled) {                                                                          \
            CH_ITEM_TYPE(ISA, tiled)                                                            \
          } else {                                                                              \
            CH_ITEM_TYPE(ISA, file)                                                             \
          }                                                                                     \
        }                                                                                       \
        break;                                                                                  \
      }                                                                                         \
      case CH_ADD_RMSNORM_Q8:                                                                   \
        ch_add_rmsnorm_q8(st, arena, ws[st[19]], q);                                            \
        break;                                                                                  \
      case CH_SWIGLU_Q8: {                                                                      \
        const ulong g_off = CH_U64(st, 4), u_off = CH_U64(st, 7), out_off = CH_U64(st, 10);     \
        const uint g_stride = st[6], u_stride = st[9], out_stride = st[12];                     \
        const uint n_blocks = st[13] / QK, bits = st[15], zp_shift = st[16];                    \
        for (uint b = chunk * unit; b < min(n_blocks, (chunk + 1) * unit); ++b) {               \
          float16 lo, hi;                                                                       \
          swiglu_block(arena, g_off, g_stride, u_off, u_stride, out_off, out_stride, t, b, &lo, \
                       &hi);                                                                    \
          q8_act_block(lo, hi, q, n_blocks, b, 0, bits, zp_shift);                              \
        }                                                                                       \
        break;                                                                                  \
      }                                                                                         \
      case CH_ROPE_PAIR:                                                                        \
        ch_rope_pair(st, chunk, arena, ws);                                                     \
        break;                                                                                  \
      case CH_KV_WRITE:                                                                         \
        ch_kv_write(st, chunk, arena, kv);                                                      \
        break;                                                                                  \
      case CH_ATTENTION:                                                                        \
        for (uint j = chunk * unit; j < min(st[31], (chunk + 1) * unit); ++j)                   \
          ch_attention(st, j, arena, kv, partials);                                             \
        break;                                                                                  \
      case CH_ATTN_MERGE:                                                                       \
        for (uint h = chunk * unit; h < min(st[23], (chunk + 1) * unit); ++h)                   \
          attention_merge_at(arena, CH_U64(st, 8), st[10], CH_U64(st, 18), st[23], st[25], t,   \
                             partials, st[28], st[29], h, 0);                                   \
        break;                                                                                  \
    }                                                                                           \
  }                                                                                             \
  kernel void step_chain_t1_##ISA(                                                              \
      global const uint* table, uint n_stages, global uchar* arena, global uchar* q,            \
      global volatile uint* sync, global uchar* kv, global float* partials, CH_W_PARAMS) {      \
    global const uchar* ws[CH_MAX_BUFFERS] = {CH_W_NAMES};                                      \
    const uint g = get_group_id(0), ng = get_num_groups(0);                                     \
    uint wait_from = 0; /* the first stage since the last barrier */                            \
    global const uchar* pf_first = 0; /* what waits prefetch (ch_next_weights), how far */      \
    ulong pf_done = 0;                                                                          \
    for (uint s = 0; s < n_stages; ++s) {                                                       \
      global const uint* st = table + s * CH_WORDS;                                             \
      global volatile uint* sy = sync + s * CH_SYNC;                                            \
      const uint chunks = st[2];                                                                \
      for (uint i = 0; i < ng; ++i) {                                                           \
        const uint share = (g + i) % ng;                                                        \
        const uint c0 = chunks * share / ng, c1 = chunks * (share + 1) / ng;                    \
        uint c;                                                                                 \
        while ((c = c0 + atomic_inc(&sy[16 * share])) < c1) {                                   \
          ch_chunk_##ISA(st, c, arena, q, kv, partials, ws);                                    \
          mem_fence(CLK_GLOBAL_MEM_FENCE);                                                      \
          atomic_inc(&sy[16 * g + 1]);                                                          \
        }                                                                                       \
      }                                                                                         \
      if (st[1]) {                                                                              \
        global const uchar* next = 0;                                                           \
        const ulong next_bytes = ch_next_weights(table, s, n_stages, g, ng, ws, &next);         \
        if (next != pf_first) pf_first = next, pf_done = 0;                                     \
        for (uint b = wait_from; b <= s; ++b)                                                   \
          for (;;) {                                                                            \
            uint done = 0;                                                                      \
            for (uint w = 0; w < ng; ++w)                                                       \
              done += sync[b * CH_SYNC + 16 * w + 1]; /* a load: no RMW takes the line */       \
            if (done >= table[b * CH_WORDS + 2]) break;                                         \
            if (pf_done < next_bytes) {                                                         \
              MMI_PREFETCH_L2(pf_first + pf_done, 256);                                         \
              pf_done += 256;                                                                   \
            } else {                                                                            \
              ch_pause();                                                                       \
            }                                                                                   \
          }                                                                                     \
        mem_fence(CLK_GLOBAL_MEM_FENCE);                                                        \
        wait_from = s + 1;                                                                      \
      }                                                                                         \
    }                                                                                           \
    if (atomic_inc(&sync[CH_EXIT]) == ng - 1) {                                                 \
      for (uint i = 0; i < n_stages; ++i)                                                       \
        for (uint w = 0; w < ng; ++w) {                                                         \
          sync[i * CH_SYNC + 16 * w] = 0;                                                       \
          sync[i * CH_SYNC + 16 * w + 1] = 0;                                                   \
        }                                                                                       \
      sync[CH_EXIT] = 0;                                                                        \
    }                                                                                           \
  }
INT8_ISA_portable(DEFINE_STEP_CHAIN(portable))
INT8_ISA_vnni(DEFINE_STEP_CHAIN(vnni))

#endif  // __x86_64__ && __clang__
