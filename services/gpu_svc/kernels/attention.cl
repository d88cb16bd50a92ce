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
    const ulong k_at = kv_row_offset(page_table, pt_stride, seq, p, pages_offset, page_bytes, page_tokens, kv_dim, layer, 0);
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

// The same for CPU devices (head_dim a multiple of 16, at most 16 * ATTN_CPU_VECS): q, the
// accumulator and each K/V row as float16 vectors (one work-item runs as SIMD code there), the
// unrolled loops guarded so that the vectors stay in registers.
#define ATTN_CPU_VECS 8
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
  float running_max = -INFINITY;
  float running_sum = 0.0f;
  for (int p = 0; p <= pos; ++p) {
    const ulong k_at = kv_row_offset(page_table, pt_stride, seq, p, pages_offset, page_bytes,
                                     page_tokens, kv_dim, layer, 0);
    global const float* k = (global const float*)(kv + k_at) + kv_head * head_dim;
    global const float* vrow = k + (ulong)page_tokens * kv_dim;
    float16 s16 = qv[0] * vload16(0, k);
#pragma unroll
    for (uint v = 1; v < ATTN_CPU_VECS; ++v)
      if (v < nv) s16 = fma(qv[v], vload16(v, k), s16);
    const float score = sum16(s16) * scale;
    const float new_max = fmax(running_max, score);
    const float correction = exp(running_max - new_max);
    const float weight = exp(score - new_max);
    running_sum = running_sum * correction + weight;
#pragma unroll
    for (uint v = 0; v < ATTN_CPU_VECS; ++v)
      if (v < nv) acc[v] = fma(acc[v], (float16)(correction), weight * vload16(v, vrow));
    running_max = new_max;
  }
  global float* out = (global float*)(arena + out_off) + (ulong)t * out_stride + h * head_dim;
  const float inv = 1.0f / running_sum;
#pragma unroll
  for (uint v = 0; v < ATTN_CPU_VECS; ++v)
    if (v < nv) vstore16(acc[v] * inv, v, out);
}
