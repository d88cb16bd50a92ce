// Causal GQA attention over the KV pages: one work-item per (head, token), a single pass with
// an online softmax (running max and sum), so scores need no scratch of context length.
#ifndef ATTN_MAX_HEAD_DIM
#define ATTN_MAX_HEAD_DIM 256
#endif
kernel void attention(global const uchar* arena, ulong q_off, uint q_stride, ulong out_off, uint out_stride,
                      global const uchar* kv, ulong pages_offset, ulong page_bytes, uint page_tokens, uint kv_dim, uint layer,
                      ulong tok_off, ulong pt_off, uint pt_stride,
                      uint n_heads, uint n_kv_heads, uint head_dim, float scale, uint t_begin) {
  const uint h = get_global_id(0);
  const uint t = t_begin + get_global_id(1);
  global const int* tok = (global const int*)(arena + tok_off);
  global const int* page_table = (global const int*)(arena + pt_off);
  const int pos = tok[4 * t + TOK_POS];
  const int seq = tok[4 * t + TOK_SEQ];
  const uint kv_head = h / (n_heads / n_kv_heads);
  global const float* q = (global const float*)(arena + q_off) + (ulong)t * q_stride + h * head_dim;
  float acc[ATTN_MAX_HEAD_DIM];
  for (uint d = 0; d < head_dim; ++d) acc[d] = 0.0f;
  float running_max = -INFINITY;
  float running_sum = 0.0f;
  for (int p = 0; p <= pos; ++p) {
    const ulong k_at = kv_row_offset(page_table, pt_stride, seq, p, pages_offset, page_bytes, page_tokens, kv_dim, layer, 0, 4);
    global const float* k = (global const float*)(kv + k_at) + kv_head * head_dim;
    global const float* v = k + (ulong)page_tokens * kv_dim;  // the V rows follow the page's K rows
    float score = 0.0f;
    for (uint d = 0; d < head_dim; ++d) score += q[d] * k[d];
    score *= scale;
    const float new_max = fmax(running_max, score);
    const float correction = exp(running_max - new_max);
    const float weight = exp(score - new_max);
    running_sum = running_sum * correction + weight;
    for (uint d = 0; d < head_dim; ++d) acc[d] = acc[d] * correction + weight * v[d];
    running_max = new_max;
  }
  global float* out = (global float*)(arena + out_off) + (ulong)t * out_stride + h * head_dim;
  const float inv = 1.0f / running_sum;
  for (uint d = 0; d < head_dim; ++d) out[d] = acc[d] * inv;
}

// The same for CPU devices (head_dim a multiple of 16, at most 16 * ATTN_CPU_VECS), built by
// clang only (PoCL; vector subscripts and __builtin_shufflevector): q, the
// accumulator and each K/V row as float16 vectors (one work-item runs as SIMD code there), the
// unrolled loops guarded so that the vectors stay in registers. Keys go in chunks of 16
// positions (0..15, 16..31, ...: fixed by the position alone, so a token's output does not
// depend on the other tokens of the step): the 16 scores' horizontal sums as one transposed
// reduction, the online softmax's max and rescale once per chunk and one vector exp for the
// chunk's weights (per key, the scalar exps and their serial dependency cost more than the dots).
#if defined(__clang__)
#define ATTN_CPU_VECS 8
#define ATTN_CHUNK 16

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

kernel void attention_cpu(global const uchar* arena, ulong q_off, uint q_stride, ulong out_off,
                          uint out_stride, global const uchar* kv, ulong pages_offset,
                          ulong page_bytes, uint page_tokens, uint kv_dim, uint layer, ulong tok_off,
                          ulong pt_off, uint pt_stride, uint n_heads, uint n_kv_heads, uint head_dim,
                          float scale, uint t_begin) {
  const uint h = get_global_id(0);
  const uint t = t_begin + get_global_id(1);
  global const int* tok = (global const int*)(arena + tok_off);
  global const int* page_table = (global const int*)(arena + pt_off);
  const int pos = tok[4 * t + TOK_POS];
  const int seq = tok[4 * t + TOK_SEQ];
  const uint kv_head = h / (n_heads / n_kv_heads);
  const uint nv = head_dim / 16;
  global const float* q = (global const float*)(arena + q_off) + (ulong)t * q_stride + h * head_dim;
  float16 qv[ATTN_CPU_VECS], acc[ATTN_CPU_VECS];
#pragma unroll
  for (uint v = 0; v < ATTN_CPU_VECS; ++v) {
    qv[v] = v < nv ? vload16(v, q) : (float16)(0.0f);
    acc[v] = (float16)(0.0f);
  }
  const ulong v_rows = (ulong)page_tokens * kv_dim;  // the V rows follow the page's K rows
  float running_max = -INFINITY;
  float running_sum = 0.0f;
  for (int c = 0; c <= pos; c += ATTN_CHUNK) {
    const int n = min(ATTN_CHUNK, pos + 1 - c);
    global const float* k[ATTN_CHUNK];
    float16 d[ATTN_CHUNK];
#pragma unroll
    for (int j = 0; j < ATTN_CHUNK; ++j) {
      d[j] = (float16)(0.0f);
      k[j] = 0;
      if (j < n) {
        k[j] = (global const float*)(kv + kv_row_offset(page_table, pt_stride, seq, c + j,
                                                         pages_offset, page_bytes, page_tokens,
                                                         kv_dim, layer, 0, 4)) +
               kv_head * head_dim;
        d[j] = qv[0] * vload16(0, k[j]);
#pragma unroll
        for (uint v = 1; v < ATTN_CPU_VECS; ++v)
          if (v < nv) d[j] = fma(qv[v], vload16(v, k[j]), d[j]);
      }
    }
    const int16 lane = (int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const float16 scores = select((float16)(-INFINITY), attn_hsum16x16(d) * scale, lane < n);
    const float new_max = fmax(running_max, max16(scores));
    const float correction = exp(running_max - new_max);
    const float16 w = exp(scores - new_max);  // 0 past the chunk's last key
    running_sum = running_sum * correction + sum16(w);
#pragma unroll
    for (uint v = 0; v < ATTN_CPU_VECS; ++v)
      if (v < nv) acc[v] *= correction;
#pragma unroll
    for (int j = 0; j < ATTN_CHUNK; ++j)
      if (j < n) {
#pragma unroll
        for (uint v = 0; v < ATTN_CPU_VECS; ++v)
          if (v < nv) acc[v] = fma((float16)(w[j]), vload16(v, k[j] + v_rows), acc[v]);
      }
    running_max = new_max;
  }
  global float* out = (global float*)(arena + out_off) + (ulong)t * out_stride + h * head_dim;
  const float inv = 1.0f / running_sum;
#pragma unroll
  for (uint v = 0; v < ATTN_CPU_VECS; ++v)
    if (v < nv) vstore16(acc[v] * inv, v, out);
}
#endif  // __clang__
