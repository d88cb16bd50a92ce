// Causal GQA attention over the KV pages, split over the context (flash-decoding): a token's keys
// go in chunks, one work-item per (head, token, chunk) computes its chunk's running max, sum and
// weighted V (an online softmax, so no score scratch of context length and no T x T matrix), and
// attention_merge combines a token's chunks into its output. A decode step of one token at a
// long context thus runs n_heads x chunks work-items instead of n_heads.
//
// Chunking is a function of the token's position alone (attn_chunk_keys; the host mirrors it in
// gpu_kernels_attention.cpp): as many chunks of at least min_keys keys as fit, at most
// max_chunks, of equal size rounded up to a multiple of 16 (so 513 keys go as 272 + 241, not
// 256 + 256 + 1: the chunks are the work-groups the device's threads share). So a token's output
// bits do not depend on the other tokens of the step. A token with one chunk writes its output
// directly and the merge skips it. Partials are [token][head][chunk] x (head_dim values, max,
// sum) floats in a scratch buffer gpu_svc allocates once.
//
// Every KV value type has its kernels, made by the macros below from one body: rows are units of
// KV_UNIT_BYTES (a value for F32/F16, a 32-value block for Q8_0) and kv_load1/kv_load16 read a
// head's slice of a row in float.
#ifndef ATTN_MAX_HEAD_DIM
#define ATTN_MAX_HEAD_DIM 256
#endif

inline uint attn_chunk_keys(uint n_keys, uint min_keys, uint max_chunks) {
  const uint chunks = clamp(n_keys / min_keys, 1u, max_chunks);
  return ((n_keys + chunks - 1) / chunks + 15) & ~15u;
}

#define KV_UNIT_BYTES_f32 4
#define KV_UNIT_VALUES_f32 1
#define KV_UNIT_BYTES_f16 2
#define KV_UNIT_VALUES_f16 1
#define KV_UNIT_BYTES_q8_0 BLOCK_BYTES_q8_0
#define KV_UNIT_VALUES_q8_0 QK

inline float kv_load1_f32(global const uchar* r, uint i) {
  return ((global const float*)r)[i];
}
inline float kv_load1_f16(global const uchar* r, uint i) {
  return vload_half(i, (global const half*)r);
}
inline float kv_load1_q8_0(global const uchar* r, uint i) {
  global const uchar* b = r + (i / QK) * BLOCK_BYTES_q8_0;
  return vload_half(0, (global const half*)b) * (float)((global const char*)(b + 2))[i % QK];
}
inline float16 kv_load16_f32(global const uchar* r, uint v) {
  return vload16(v, (global const float*)r);
}
inline float16 kv_load16_f16(global const uchar* r, uint v) {
  return vload_half16(v, (global const half*)r);
}
inline float16 kv_load16_q8_0(global const uchar* r, uint v) {
  global const uchar* b = r + (v / 2) * BLOCK_BYTES_q8_0;
  return convert_float16(vload16(v & 1, (global const char*)(b + 2))) *
         vload_half(0, (global const half*)b);
}

inline float8 kv_load8_f32(global const uchar* r, uint v) {
  return vload8(v, (global const float*)r);
}
inline float8 kv_load8_f16(global const uchar* r, uint v) {
  return vload_half8(v, (global const half*)r);
}
inline float8 kv_load8_q8_0(global const uchar* r, uint v) {
  global const uchar* b = r + (v / 4) * BLOCK_BYTES_q8_0;
  return convert_float8(vload8(v & 3, (global const char*)(b + 2))) *
         vload_half(0, (global const half*)b);
}

// The arguments every split kernel takes (kv_units: units per row, kv_dim / KV_UNIT_VALUES), and
// what each work-item works out from them: its token, chunk and key range [k_begin, k_end), and
// the byte offsets of its K head slice and of V rows from K rows. Returns early past the token's
// chunks.
#define ATTN_SPLIT_ARGS                                                                          \
  global const uchar *arena, ulong q_off, uint q_stride, ulong out_off, uint out_stride,        \
      global const uchar *kv, ulong pages_offset, ulong page_bytes, uint page_tokens,           \
      uint kv_units, uint layer, ulong tok_off, ulong pt_off, uint pt_stride, uint n_heads,     \
      uint n_kv_heads, uint head_dim, float scale, uint t_begin, global float *partials,        \
      uint min_keys, uint max_chunks
#define ATTN_SPLIT_NAMES                                                                          \
  arena, q_off, q_stride, out_off, out_stride, kv, pages_offset, page_bytes, page_tokens,        \
      kv_units, layer, tok_off, pt_off, pt_stride, n_heads, n_kv_heads, head_dim, scale, t_begin, \
      partials, min_keys, max_chunks
#define ATTN_SPLIT_PROLOGUE(T) ATTN_SPLIT_PROLOGUE_AT(T, get_global_id(0))
#define ATTN_SPLIT_PROLOGUE_AT(T, HEAD) \
  ATTN_SPLIT_PROLOGUE_IDX(T, HEAD, get_global_id(1), get_global_id(2))
#define ATTN_SPLIT_PROLOGUE_IDX(T, HEAD, TL, C)                                                  \
  const uint h = (HEAD);                                                                         \
  const uint tl = (TL);                                                                          \
  const uint c = (C);                                                                            \
  const uint t = t_begin + tl;                                                                   \
  global const int* tok = (global const int*)(arena + tok_off);                                  \
  global const int* page_table = (global const int*)(arena + pt_off);                           \
  const int pos = tok[4 * t + TOK_POS];                                                          \
  const int seq = tok[4 * t + TOK_SEQ];                                                          \
  const uint n_keys = (uint)pos + 1;                                                             \
  const uint per = attn_chunk_keys(n_keys, min_keys, max_chunks);                                \
  const uint n_chunks = (n_keys + per - 1) / per;                                                \
  if (c >= n_chunks) return;                                                                     \
  const int k_begin = (int)(c * per);                                                            \
  const int k_end = (int)min(n_keys, (c + 1) * per);                                             \
  const ulong head_off =                                                                         \
      (ulong)(h / (n_heads / n_kv_heads)) * head_dim / KV_UNIT_VALUES_##T * KV_UNIT_BYTES_##T;   \
  const ulong v_rows = (ulong)page_tokens * kv_units * KV_UNIT_BYTES_##T;                        \
  global const float* q = (global const float*)(arena + q_off) + (ulong)t * q_stride + h * head_dim; \
  global float* out = (global float*)(arena + out_off) + (ulong)t * out_stride + h * head_dim;   \
  global float* part =                                                                           \
      partials + (((ulong)tl * n_heads + h) * max_chunks + c) * (head_dim + 2);
#define ATTN_KEY_ROW(T, p)                                                                       \
  (kv + kv_row_offset(page_table, pt_stride, seq, (p), pages_offset, page_bytes, page_tokens,   \
                      kv_units, layer, 0, KV_UNIT_BYTES_##T) +                                   \
   head_off)

// The portable kernel (GPUs): scalar loops over head_dim, the accumulator in private memory.
#define DEFINE_ATTENTION_SPLIT(T)                                                                \
  kernel void attention_split_##T(ATTN_SPLIT_ARGS) {                                             \
    ATTN_SPLIT_PROLOGUE(T)                                                                       \
    float acc[ATTN_MAX_HEAD_DIM];                                                                \
    for (uint d = 0; d < head_dim; ++d) acc[d] = 0.0f;                                           \
    float running_max = -INFINITY;                                                               \
    float running_sum = 0.0f;                                                                    \
    for (int p = k_begin; p < k_end; ++p) {                                                      \
      global const uchar* k = ATTN_KEY_ROW(T, p);                                                \
      global const uchar* v = k + v_rows;                                                        \
      float score = 0.0f;                                                                        \
      for (uint d = 0; d < head_dim; ++d) score += q[d] * kv_load1_##T(k, d);                    \
      score *= scale;                                                                            \
      const float new_max = fmax(running_max, score);                                            \
      const float correction = exp(running_max - new_max);                                       \
      const float weight = exp(score - new_max);                                                 \
      running_sum = running_sum * correction + weight;                                           \
      for (uint d = 0; d < head_dim; ++d)                                                        \
        acc[d] = acc[d] * correction + weight * kv_load1_##T(v, d);                              \
      running_max = new_max;                                                                     \
    }                                                                                            \
    if (n_chunks == 1) {                                                                         \
      const float inv = 1.0f / running_sum;                                                      \
      for (uint d = 0; d < head_dim; ++d) out[d] = acc[d] * inv;                                 \
    } else {                                                                                     \
      for (uint d = 0; d < head_dim; ++d) part[d] = acc[d];                                      \
      part[head_dim] = running_max;                                                              \
      part[head_dim + 1] = running_sum;                                                          \
    }                                                                                            \
  }
DEFINE_ATTENTION_SPLIT(f32)
DEFINE_ATTENTION_SPLIT(f16)
DEFINE_ATTENTION_SPLIT(q8_0)

// The work-group kernel (GPUs): one group of ATTN_WG work-items per (head, token, chunk), the
// chunk's keys a tile of ATTN_WG_TILE at a time. Each work-item scores whole keys (q, scaled,
// in local memory), the group reduces the tile's max and sum, and each work-item owns head
// dimensions lid, lid + ATTN_WG, ... of the weighted V sum, so V rows are read across the group
// (coalesced). head_dim a multiple of 8 (keys are read 8 values at a time; the host runs the
// portable kernel for the others). The portable kernel above ran a chunk's keys serially in one work-item, with its
// accumulator spilled to memory: 460 us a layer for the 1B's 32 heads on the H100.
// Partials and outputs as the other kernels (the max and sum of scaled scores).
#define ATTN_WG 64
#define ATTN_WG_TILE 256
#define ATTN_WG_DIMS (ATTN_MAX_HEAD_DIM / ATTN_WG)

// The group's reduction of v (max or sum) through red[ATTN_WG]; every work-item gets it.
inline float attn_wg_reduce(local float* red, float v, uint lid, int take_max) {
  red[lid] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (uint s = ATTN_WG / 2; s > 0; s >>= 1) {
    if (lid < s) red[lid] = take_max ? fmax(red[lid], red[lid + s]) : red[lid] + red[lid + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float r = red[0];
  barrier(CLK_LOCAL_MEM_FENCE);  // red is free again
  return r;
}

#define DEFINE_ATTENTION_SPLIT_WG(T)                                                             \
  kernel __attribute__((reqd_work_group_size(ATTN_WG, 1, 1))) void attention_split_wg_##T(      \
      ATTN_SPLIT_ARGS) {                                                                         \
    local float q_l[ATTN_MAX_HEAD_DIM];                                                          \
    local float w_l[ATTN_WG_TILE];                                                               \
    local float red[ATTN_WG];                                                                    \
    local ulong row_l[ATTN_WG_TILE]; /* the tile's K rows (a page-table lookup each) */          \
    const uint lid = get_local_id(0);                                                            \
    ATTN_SPLIT_PROLOGUE_AT(T, get_group_id(0))                                                   \
    for (uint d = lid; d < head_dim; d += ATTN_WG) q_l[d] = q[d] * scale;                        \
    barrier(CLK_LOCAL_MEM_FENCE);                                                                \
    float acc[ATTN_WG_DIMS];                                                                     \
    for (uint j = 0; j < ATTN_WG_DIMS; ++j) acc[j] = 0.0f;                                       \
    float running_max = -INFINITY;                                                               \
    float running_sum = 0.0f;                                                                    \
    for (int tile = k_begin; tile < k_end; tile += ATTN_WG_TILE) {                               \
      const int n_tile = min(k_end - tile, ATTN_WG_TILE);                                        \
      float tile_max = -INFINITY;                                                                \
      for (int i = (int)lid; i < n_tile; i += ATTN_WG) {                                         \
        global const uchar* k = ATTN_KEY_ROW(T, tile + i);                                       \
        row_l[i] = (ulong)(k - kv);                                                              \
        float score = 0.0f;                                                                      \
        for (uint v = 0; v < head_dim / 8; ++v) {                                                \
          const float8 kk = kv_load8_##T(k, v), qq = vload8(v, q_l);                             \
          score += dot(kk.lo, qq.lo) + dot(kk.hi, qq.hi);                                        \
        }                                                                                        \
        w_l[i] = score;                                                                          \
        tile_max = fmax(tile_max, score);                                                        \
      }                                                                                          \
      const float new_max = fmax(running_max, attn_wg_reduce(red, tile_max, lid, 1));            \
      const float correction = exp(running_max - new_max);                                       \
      float tile_sum = 0.0f;                                                                     \
      for (int i = (int)lid; i < n_tile; i += ATTN_WG) {                                         \
        const float weight = exp(w_l[i] - new_max);                                              \
        w_l[i] = weight;                                                                         \
        tile_sum += weight;                                                                      \
      }                                                                                          \
      running_sum = running_sum * correction + attn_wg_reduce(red, tile_sum, lid, 0);            \
      running_max = new_max;                                                                     \
      for (uint j = 0; j < ATTN_WG_DIMS; ++j) {                                                  \
        const uint d = lid + j * ATTN_WG;                                                        \
        if (d >= head_dim) break;                                                                \
        float a = acc[j] * correction;                                                           \
        for (int i = 0; i < n_tile; ++i) a += w_l[i] * kv_load1_##T(kv + row_l[i] + v_rows, d); \
        acc[j] = a;                                                                              \
      }                                                                                          \
      barrier(CLK_LOCAL_MEM_FENCE); /* w_l and row_l are rewritten by the next tile */           \
    }                                                                                            \
    for (uint j = 0; j < ATTN_WG_DIMS; ++j) {                                                    \
      const uint d = lid + j * ATTN_WG;                                                          \
      if (d >= head_dim) break;                                                                  \
      if (n_chunks == 1)                                                                         \
        out[d] = acc[j] * (1.0f / running_sum);                                                  \
      else                                                                                       \
        part[d] = acc[j];                                                                        \
    }                                                                                            \
    if (n_chunks > 1 && lid == 0) {                                                              \
      part[head_dim] = running_max;                                                              \
      part[head_dim + 1] = running_sum;                                                          \
    }                                                                                            \
  }
DEFINE_ATTENTION_SPLIT_WG(f32)
DEFINE_ATTENTION_SPLIT_WG(f16)
DEFINE_ATTENTION_SPLIT_WG(q8_0)

// The merges' shared part: token t's chunk count, and the largest of its chunks' maxima.
inline uint attn_token_chunks(global const uchar* arena, ulong tok_off, uint t, uint min_keys,
                              uint max_chunks) {
  global const int* tok = (global const int*)(arena + tok_off);
  const uint n_keys = (uint)tok[4 * t + TOK_POS] + 1;
  const uint per = attn_chunk_keys(n_keys, min_keys, max_chunks);
  return (n_keys + per - 1) / per;
}
inline float attn_chunks_max(global const float* part, uint n_chunks, uint stride,
                             uint head_dim) {
  float m = -INFINITY;
  for (uint c = 0; c < n_chunks; ++c) m = fmax(m, part[c * stride + head_dim]);
  return m;
}

// A token's chunks into its output, one work-item per (head, token): the chunks' sums and
// weighted V rescaled to the largest chunk max, in chunk order.
CHAIN_SHARED void attention_merge_at(global const uchar* arena, ulong out_off, uint out_stride,
                                     ulong tok_off, uint n_heads, uint head_dim, uint t_begin,
                                     global const float* partials, uint min_keys,
                                     uint max_chunks, uint h, uint tl) {
  const uint t = t_begin + tl;
  const uint n_chunks = attn_token_chunks(arena, tok_off, t, min_keys, max_chunks);
  if (n_chunks == 1) return;  // written by the split kernel
  const uint stride = head_dim + 2;
  global const float* part = partials + ((ulong)tl * n_heads + h) * max_chunks * stride;
  const float m = attn_chunks_max(part, n_chunks, stride, head_dim);
  global float* out = (global float*)(arena + out_off) + (ulong)t * out_stride + h * head_dim;
  for (uint d = 0; d < head_dim; ++d) out[d] = 0.0f;
  float sum = 0.0f;
  for (uint c = 0; c < n_chunks; ++c) {
    global const float* pc = part + c * stride;
    const float w = exp(pc[head_dim] - m);
    sum += w * pc[head_dim + 1];
    for (uint d = 0; d < head_dim; ++d) out[d] += w * pc[d];
  }
  const float inv = 1.0f / sum;
  for (uint d = 0; d < head_dim; ++d) out[d] *= inv;
}
kernel void attention_merge(global const uchar* arena, ulong out_off, uint out_stride,
                            ulong tok_off, uint n_heads, uint head_dim, uint t_begin,
                            global const float* partials, uint min_keys, uint max_chunks) {
  attention_merge_at(arena, out_off, out_stride, tok_off, n_heads, head_dim, t_begin, partials,
                     min_keys, max_chunks, get_global_id(0), get_global_id(1));
}

// attention_merge for the work-group kernel: a group per (head, token), each work-item its
// head dimensions, so the partials are read across the group; the chunks' weights once, in
// local memory (max_chunks <= ATTN_WG). The same arithmetic in the same order as
// attention_merge, so the same bits.
kernel __attribute__((reqd_work_group_size(ATTN_WG, 1, 1))) void attention_merge_wg(
    global const uchar* arena, ulong out_off, uint out_stride, ulong tok_off, uint n_heads,
    uint head_dim, uint t_begin, global const float* partials, uint min_keys, uint max_chunks) {
  local float w_l[ATTN_WG];
  const uint lid = get_local_id(0);
  const uint h = get_group_id(0);
  const uint tl = get_global_id(1);
  const uint t = t_begin + tl;
  const uint n_chunks = attn_token_chunks(arena, tok_off, t, min_keys, max_chunks);
  if (n_chunks == 1) return;  // written by the split kernel
  const uint stride = head_dim + 2;
  global const float* part = partials + ((ulong)tl * n_heads + h) * max_chunks * stride;
  const float m = attn_chunks_max(part, n_chunks, stride, head_dim);
  if (lid < n_chunks) w_l[lid] = exp(part[lid * stride + head_dim] - m);
  barrier(CLK_LOCAL_MEM_FENCE);
  float sum = 0.0f;
  for (uint c = 0; c < n_chunks; ++c) sum += w_l[c] * part[c * stride + head_dim + 1];
  const float inv = 1.0f / sum;
  global float* out = (global float*)(arena + out_off) + (ulong)t * out_stride + h * head_dim;
  for (uint d = lid; d < head_dim; d += ATTN_WG) {
    float o = 0.0f;
    for (uint c = 0; c < n_chunks; ++c) o += w_l[c] * part[c * stride + d];
    out[d] = o * inv;
  }
}

// The same split for CPU devices (head_dim a multiple of 16, at most 16 * ATTN_CPU_VECS), built
// by clang only (PoCL; vector subscripts and __builtin_shufflevector): q, the accumulator and
// each K/V row as float16 vectors (one work-item runs as SIMD code there), the unrolled loops
// guarded so that the vectors stay in registers. A chunk's keys go 16 at a time (chunks start at
// multiples of 16): the 16 scores' horizontal sums as one transposed reduction, the online
// softmax's max and rescale once per 16 keys and one vector exp for their weights (per key, the
// scalar exps and their serial dependency cost more than the dots). The work-groups run a
// (token, chunk)'s heads together, so the heads sharing a KV head read its rows from cache.
// x86 clang only, as matmul_int8.cl: where a GPU compiler defines __clang__ too, these
// unrolled kernels, which a GPU never runs, were most of its compile time (gpu_kernels.cpp
// probes for them on CPU devices only).
#if defined(__clang__) && defined(__x86_64__)
#define ATTN_CPU_VECS 8
#define ATTN_KEYS 16
// Row j of the block of keys b .. b + ATTN_KEYS - 1 (b a multiple of ATTN_KEYS: chunks start at
// multiples of 16), given base = that block's first row (ATTN_KEY_ROW(T, b)). Where a page holds
// whole blocks (page_tokens a multiple of 16: always, in duet's pool) the block lies in one page,
// so its rows follow base: one page-table lookup and one division by page_tokens per block
// instead of per key (at 544 keys those per-key lookups cost more than the dots).
#define ATTN_BLOCK_ROW(T, b, j, base)                                                 \
  (page_tokens % ATTN_KEYS == 0 ? (base) + (ulong)(j) * kv_units * KV_UNIT_BYTES_##T \
                                : ATTN_KEY_ROW(T, (b) + (j)))

inline float max16(float16 v) {
  const float8 a = fmax(v.lo, v.hi);
  const float4 b = fmax(a.lo, a.hi);
  const float2 c = fmax(b.lo, b.hi);
  return fmax(c.x, c.y);
}
// Lane j of the result = the sum of d[j]'s 16 lanes.
inline float16 attn_hsum16x16(const float16* d) {
#define ATTN_H1A 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define ATTN_H1B 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define ATTN_H2A 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27
#define ATTN_H2B 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31
#define ATTN_H3A 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29
#define ATTN_H3B 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31
#define ATTN_H4A 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30
#define ATTN_H4B 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31
#define ATTN_PAIR(x, y, A, B) \
  (__builtin_shufflevector((x), (y), A) + __builtin_shufflevector((x), (y), B))
  float16 e[8], f[4], g[2];
#pragma unroll
  for (uint i = 0; i < 8; ++i) e[i] = ATTN_PAIR(d[2 * i], d[2 * i + 1], ATTN_H1A, ATTN_H1B);
#pragma unroll
  for (uint i = 0; i < 4; ++i) f[i] = ATTN_PAIR(e[2 * i], e[2 * i + 1], ATTN_H2A, ATTN_H2B);
#pragma unroll
  for (uint i = 0; i < 2; ++i) g[i] = ATTN_PAIR(f[2 * i], f[2 * i + 1], ATTN_H3A, ATTN_H3B);
  return ATTN_PAIR(g[0], g[1], ATTN_H4A, ATTN_H4B);
}

// A KV head's slice of a row is 1/n_kv_heads of it (128 of 1024 bytes at f16 on the 1B), the
// rows 16 to a page and the pages scattered: a work-item's reads are short strided runs that the
// hardware prefetcher does not follow past a page, so at contexts past the caches (and in a
// decode step, where the weights have just evicted the KV) the split ran at a few GB/s. So both
// CPU kernels ask, before their first block, for the whole chunk's K and V slices into L2
// (prefetcht2: up to 256 keys x 2 x 128 bytes, more than L1 holds): the chunk's DRAM reads are
// in flight together instead of one block's at a time. The shared kernel also lifts the next
// block from L2 into L1 while it computes this one (prefetcht0). In a llama3.2-1b decode step at
// 544 keys (the KV cold after the weights) the chunk prefetch took attention from 3.9-5.0 to
// 2.6-3.6 ms a token; prefetching every KV head's rows of the chunk from the group's first
// work-item instead, or dropping the per-block prefetch, was slower (bench/longctx/RESULTS.md,
// 2026-11-27 18:10). x86 only: prefetches never fault; elsewhere a no-op.
inline void attn_prefetch(global const uchar* p, uint bytes) {
#if defined(__x86_64__)
  for (uint i = 0; i < bytes; i += 64) __asm__ volatile("prefetcht0 (%0)" : : "r"(p + i));
#endif
}
inline void attn_prefetch_l2(global const uchar* p, uint bytes) {
#if defined(__x86_64__)
  for (uint i = 0; i < bytes; i += 64) __asm__ volatile("prefetcht2 (%0)" : : "r"(p + i));
#endif
}
#define ATTN_PREFETCH_CHUNK(T, bytes)                                       \
  for (int pb = k_begin; pb < k_end; pb += ATTN_KEYS) {                     \
    global const uchar* p0 = ATTN_KEY_ROW(T, pb);                           \
    for (int j = 0; j < min(ATTN_KEYS, k_end - pb); ++j) {                  \
      global const uchar* pr = ATTN_BLOCK_ROW(T, pb, j, p0);                \
      attn_prefetch_l2(pr, (bytes));                                        \
      attn_prefetch_l2(pr + v_rows, (bytes));                               \
    }                                                                       \
  }

// (Each CPU kernel's body is a CHAIN_SHARED function of its work-item's indices, which the step
// chains call too: step_chain_cpu.cl.)
#define DEFINE_ATTENTION_SPLIT_CPU(T)                                                            \
  CHAIN_SHARED void attention_split_cpu_##T##_at(ATTN_SPLIT_ARGS, uint wi, uint wt, uint wc) {   \
    ATTN_SPLIT_PROLOGUE_IDX(T, wi, wt, wc)                                                       \
    const uint nv = head_dim / 16;                                                               \
    float16 qv[ATTN_CPU_VECS], acc[ATTN_CPU_VECS];                                               \
    _Pragma("unroll") for (uint v = 0; v < ATTN_CPU_VECS; ++v) {                                 \
      qv[v] = v < nv ? vload16(v, q) : (float16)(0.0f);                                          \
      acc[v] = (float16)(0.0f);                                                                  \
    }                                                                                            \
    float running_max = -INFINITY;                                                               \
    float running_sum = 0.0f;                                                                    \
    ATTN_PREFETCH_CHUNK(T, head_dim / KV_UNIT_VALUES_##T * KV_UNIT_BYTES_##T)                     \
    for (int b = k_begin; b < k_end; b += ATTN_KEYS) {                                           \
      const int n = min(ATTN_KEYS, k_end - b);                                                   \
      global const uchar* k[ATTN_KEYS];                                                          \
      global const uchar* k0 = ATTN_KEY_ROW(T, b);                                               \
      float16 d[ATTN_KEYS];                                                                      \
      _Pragma("unroll") for (int j = 0; j < ATTN_KEYS; ++j) {                                    \
        d[j] = (float16)(0.0f);                                                                  \
        k[j] = 0;                                                                                \
        if (j < n) {                                                                             \
          k[j] = ATTN_BLOCK_ROW(T, b, j, k0);                                                    \
          d[j] = qv[0] * kv_load16_##T(k[j], 0);                                                 \
          _Pragma("unroll") for (uint v = 1; v < ATTN_CPU_VECS; ++v) if (v < nv) d[j] =          \
              fma(qv[v], kv_load16_##T(k[j], v), d[j]);                                          \
        }                                                                                        \
      }                                                                                          \
      const int16 lane = (int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);          \
      const float16 scores =                                                                     \
          select((float16)(-INFINITY), attn_hsum16x16(d) * scale, lane < n);                     \
      const float new_max = fmax(running_max, max16(scores));                                    \
      const float correction = exp(running_max - new_max);                                      \
      const float16 w = exp(scores - new_max); /* 0 past the last key */                         \
      running_sum = running_sum * correction + sum16(w);                                         \
      _Pragma("unroll") for (uint v = 0; v < ATTN_CPU_VECS; ++v) if (v < nv) acc[v] *=           \
          correction;                                                                            \
      _Pragma("unroll") for (int j = 0; j < ATTN_KEYS; ++j) if (j < n) {                         \
        _Pragma("unroll") for (uint v = 0; v < ATTN_CPU_VECS; ++v) if (v < nv) acc[v] =          \
            fma((float16)(w[j]), kv_load16_##T(k[j] + v_rows, v), acc[v]);                       \
      }                                                                                          \
      running_max = new_max;                                                                     \
    }                                                                                            \
    if (n_chunks == 1) {                                                                         \
      const float inv = 1.0f / running_sum;                                                      \
      _Pragma("unroll") for (uint v = 0; v < ATTN_CPU_VECS; ++v) if (v < nv)                     \
          vstore16(acc[v] * inv, v, out);                                                        \
    } else {                                                                                     \
      _Pragma("unroll") for (uint v = 0; v < ATTN_CPU_VECS; ++v) if (v < nv)                     \
          vstore16(acc[v], v, part);                                                             \
      part[head_dim] = running_max;                                                              \
      part[head_dim + 1] = running_sum;                                                          \
    }                                                                                            \
  }                                                                                              \
  kernel void attention_split_cpu_##T(ATTN_SPLIT_ARGS) {                                         \
    attention_split_cpu_##T##_at(ATTN_SPLIT_NAMES, get_global_id(0), get_global_id(1),          \
                                 get_global_id(2));                                              \
  }
DEFINE_ATTENTION_SPLIT_CPU(f32)
DEFINE_ATTENTION_SPLIT_CPU(f16)
DEFINE_ATTENTION_SPLIT_CPU(q8_0)

// GQA-shared split for CPU devices: one work-item per (KV head, token, chunk) serves GQ of the
// query heads that share the KV head (llama3.2-1b: 4 of 32 on 8), so each K and V row of a
// chunk is loaded and converted to float once per token instead of once per query head (the
// per-head kernel above spends as many loads and conversions as FMAs). NV (head_dim / 16) and
// GQ are compile-time so that the GQ x NV accumulators are fixed registers rather than
// guarded, loop-carried slots; the host picks the kernel whose NV and GQ fit the shape. Per
// head, the arithmetic is the per-head kernel's in the same order (scores of 16 keys as one
// transposed reduction, one max/rescale per 16 keys), so the outputs are the same bits.
#define DEFINE_ATTENTION_GQA_CPU(T, NV, GQ)                                                     \
  CHAIN_SHARED void attention_gqa_cpu_##T##_##NV##x##GQ##_at(ATTN_SPLIT_ARGS, uint wi, uint tl,  \
                                                          uint c) {                             \
    const uint t = t_begin + tl;                                                                 \
    global const int* tok = (global const int*)(arena + tok_off);                                \
    global const int* page_table = (global const int*)(arena + pt_off);                         \
    const int pos = tok[4 * t + TOK_POS];                                                        \
    const int seq = tok[4 * t + TOK_SEQ];                                                        \
    const uint n_keys = (uint)pos + 1;                                                           \
    const uint per = attn_chunk_keys(n_keys, min_keys, max_chunks);                              \
    const uint n_chunks = (n_keys + per - 1) / per;                                              \
    if (c >= n_chunks) return;                                                                   \
    const int k_begin = (int)(c * per);                                                          \
    const int k_end = (int)min(n_keys, (c + 1) * per);                                           \
    /* the GQ heads of this work-item: a KV head's group when GQ is the group, else a slice */  \
    const uint group = n_heads / n_kv_heads;                                                     \
    const uint h0 = (wi / (group / GQ)) * group + (wi % (group / GQ)) * GQ;                      \
    const ulong head_off = (ulong)(h0 / group) * head_dim / KV_UNIT_VALUES_##T * KV_UNIT_BYTES_##T; \
    const ulong v_rows = (ulong)page_tokens * kv_units * KV_UNIT_BYTES_##T;                      \
    const uint slice_bytes = head_dim / KV_UNIT_VALUES_##T * KV_UNIT_BYTES_##T;                  \
    global const float* q = (global const float*)(arena + q_off) + (ulong)t * q_stride + h0 * head_dim; \
    float16 qv[GQ][NV], acc[GQ][NV];                                                             \
    float running_max[GQ], running_sum[GQ];                                                      \
    _Pragma("unroll") for (uint g = 0; g < GQ; ++g) {                                            \
      _Pragma("unroll") for (uint v = 0; v < NV; ++v) {                                          \
        qv[g][v] = vload16(g * NV + v, q);                                                       \
        acc[g][v] = (float16)(0.0f);                                                             \
      }                                                                                          \
      running_max[g] = -INFINITY;                                                                \
      running_sum[g] = 0.0f;                                                                     \
    }                                                                                            \
    const int16 lane = (int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);            \
    ATTN_PREFETCH_CHUNK(T, slice_bytes)                                                          \
    for (int b = k_begin; b < k_end; b += ATTN_KEYS) {                                           \
      const int n = min(ATTN_KEYS, k_end - b);                                                   \
      if (b + ATTN_KEYS < k_end) {                                                               \
        const int nb = b + ATTN_KEYS;                                                            \
        global const uchar* next0 = ATTN_KEY_ROW(T, nb);                                         \
        for (int j = 0; j < min(ATTN_KEYS, k_end - nb); ++j) {                                   \
          global const uchar* next = ATTN_BLOCK_ROW(T, nb, j, next0);                            \
          attn_prefetch(next, slice_bytes);                                                      \
          attn_prefetch(next + v_rows, slice_bytes);                                             \
        }                                                                                        \
      }                                                                                          \
      global const uchar* k[ATTN_KEYS];                                                          \
      global const uchar* k0 = ATTN_KEY_ROW(T, b);                                               \
      float16 d[GQ][ATTN_KEYS];                                                                  \
      _Pragma("unroll") for (int j = 0; j < ATTN_KEYS; ++j) {                                    \
        k[j] = 0;                                                                                \
        _Pragma("unroll") for (uint g = 0; g < GQ; ++g) d[g][j] = (float16)(0.0f);               \
        if (j < n) {                                                                             \
          k[j] = ATTN_BLOCK_ROW(T, b, j, k0);                                                    \
          float16 kr[NV];                                                                        \
          _Pragma("unroll") for (uint v = 0; v < NV; ++v) kr[v] = kv_load16_##T(k[j], v);        \
          _Pragma("unroll") for (uint g = 0; g < GQ; ++g) {                                      \
            d[g][j] = qv[g][0] * kr[0];                                                          \
            _Pragma("unroll") for (uint v = 1; v < NV; ++v) d[g][j] =                            \
                fma(qv[g][v], kr[v], d[g][j]);                                                   \
          }                                                                                      \
        }                                                                                        \
      }                                                                                          \
      float16 w[GQ];                                                                             \
      _Pragma("unroll") for (uint g = 0; g < GQ; ++g) {                                          \
        const float16 scores =                                                                   \
            select((float16)(-INFINITY), attn_hsum16x16(d[g]) * scale, lane < n);                \
        const float new_max = fmax(running_max[g], max16(scores));                               \
        const float correction = exp(running_max[g] - new_max);                                  \
        w[g] = exp(scores - new_max); /* 0 past the last key */                                  \
        running_sum[g] = running_sum[g] * correction + sum16(w[g]);                              \
        _Pragma("unroll") for (uint v = 0; v < NV; ++v) acc[g][v] *= correction;                 \
        running_max[g] = new_max;                                                                \
      }                                                                                          \
      _Pragma("unroll") for (int j = 0; j < ATTN_KEYS; ++j) if (j < n) {                         \
        float16 vr[NV];                                                                          \
        _Pragma("unroll") for (uint v = 0; v < NV; ++v) vr[v] = kv_load16_##T(k[j] + v_rows, v); \
        _Pragma("unroll") for (uint g = 0; g < GQ; ++g)                                          \
            _Pragma("unroll") for (uint v = 0; v < NV; ++v) acc[g][v] =                          \
                fma((float16)(w[g][j]), vr[v], acc[g][v]);                                       \
      }                                                                                          \
    }                                                                                            \
    _Pragma("unroll") for (uint g = 0; g < GQ; ++g) {                                            \
      const uint h = h0 + g;                                                                     \
      if (n_chunks == 1) {                                                                       \
        global float* out =                                                                      \
            (global float*)(arena + out_off) + (ulong)t * out_stride + h * head_dim;             \
        const float inv = 1.0f / running_sum[g];                                                 \
        _Pragma("unroll") for (uint v = 0; v < NV; ++v) vstore16(acc[g][v] * inv, v, out);       \
      } else {                                                                                   \
        global float* part =                                                                     \
            partials + (((ulong)tl * n_heads + h) * max_chunks + c) * (head_dim + 2);            \
        _Pragma("unroll") for (uint v = 0; v < NV; ++v) vstore16(acc[g][v], v, part);            \
        part[head_dim] = running_max[g];                                                         \
        part[head_dim + 1] = running_sum[g];                                                     \
      }                                                                                          \
    }                                                                                            \
  }                                                                                              \
  kernel void attention_gqa_cpu_##T##_##NV##x##GQ(ATTN_SPLIT_ARGS) {                            \
    attention_gqa_cpu_##T##_##NV##x##GQ##_at(ATTN_SPLIT_NAMES, get_global_id(0),                \
                                             get_global_id(1), get_global_id(2));                \
  }
// head_dim 64 (llama3.2-1b, the 1B shapes): 4 heads a work-item (16 + 16 vector registers of
// q and accumulators, AVX-512's 32); head_dim 128: 2 heads (the same 32).
DEFINE_ATTENTION_GQA_CPU(f32, 4, 4)
DEFINE_ATTENTION_GQA_CPU(f16, 4, 4)
DEFINE_ATTENTION_GQA_CPU(q8_0, 4, 4)
DEFINE_ATTENTION_GQA_CPU(f32, 8, 2)
DEFINE_ATTENTION_GQA_CPU(f16, 8, 2)
DEFINE_ATTENTION_GQA_CPU(q8_0, 8, 2)
#endif  // __clang__ && __x86_64__
