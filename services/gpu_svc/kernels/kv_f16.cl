// KV pages of F16 values (issue 20: half the bytes of F32, as llama.cpp stores its cache): the
// kv_write, attention and attention_cpu kernels of elementwise.cl and attention.cl with K and V
// rows stored as half (vstore_half_rte / vload_half*: core OpenCL, no cl_khr_fp16 needed) and
// every computation in float, like the reference interpreter (core/program_interpreter.cpp).
// Same arguments; the runner passes each layer's own region (pages_offset, page_bytes, layer 0).

kernel void kv_write_f16(global const uchar* arena, ulong k_off, uint k_stride, ulong v_off,
                         uint v_stride, global uchar* kv, ulong pages_offset, ulong page_bytes,
                         uint page_tokens, uint kv_dim, uint layer, ulong tok_off, ulong pt_off,
                         uint pt_stride, uint t_begin) {
  const uint i = get_global_id(0);
  const uint t = t_begin + get_global_id(1);
  global const int* tok = (global const int*)(arena + tok_off);
  global const int* page_table = (global const int*)(arena + pt_off);
  const int pos = tok[4 * t + TOK_POS];
  const int seq = tok[4 * t + TOK_SEQ];
  const ulong k_dst = kv_row_offset(page_table, pt_stride, seq, pos, pages_offset, page_bytes,
                                    page_tokens, kv_dim, layer, 0, 2);
  const ulong v_dst = kv_row_offset(page_table, pt_stride, seq, pos, pages_offset, page_bytes,
                                    page_tokens, kv_dim, layer, 1, 2);
  vstore_half_rte(((global const float*)(arena + k_off))[(ulong)t * k_stride + i], i,
                  (global half*)(kv + k_dst));
  vstore_half_rte(((global const float*)(arena + v_off))[(ulong)t * v_stride + i], i,
                  (global half*)(kv + v_dst));
}

kernel void attention_f16(global const uchar* arena, ulong q_off, uint q_stride, ulong out_off,
                          uint out_stride, global const uchar* kv, ulong pages_offset,
                          ulong page_bytes, uint page_tokens, uint kv_dim, uint layer,
                          ulong tok_off, ulong pt_off, uint pt_stride, uint n_heads,
                          uint n_kv_heads, uint head_dim, float scale, uint t_begin) {
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
    const ulong k_at = kv_row_offset(page_table, pt_stride, seq, p, pages_offset, page_bytes,
                                     page_tokens, kv_dim, layer, 0, 2);
    global const half* k = (global const half*)(kv + k_at) + kv_head * head_dim;
    global const half* v = k + (ulong)page_tokens * kv_dim;  // V rows follow the page's K rows
    float score = 0.0f;
    for (uint d = 0; d < head_dim; ++d) score += q[d] * vload_half(d, k);
    score *= scale;
    const float new_max = fmax(running_max, score);
    const float correction = exp(running_max - new_max);
    const float weight = exp(score - new_max);
    running_sum = running_sum * correction + weight;
    for (uint d = 0; d < head_dim; ++d) acc[d] = acc[d] * correction + weight * vload_half(d, v);
    running_max = new_max;
  }
  global float* out = (global float*)(arena + out_off) + (ulong)t * out_stride + h * head_dim;
  const float inv = 1.0f / running_sum;
  for (uint d = 0; d < head_dim; ++d) out[d] = acc[d] * inv;
}

#if defined(__clang__)
// attention_cpu (attention.cl) over half rows: the same chunks of 16 keys, vectors and order.
kernel void attention_cpu_f16(global const uchar* arena, ulong q_off, uint q_stride, ulong out_off,
                              uint out_stride, global const uchar* kv, ulong pages_offset,
                              ulong page_bytes, uint page_tokens, uint kv_dim, uint layer,
                              ulong tok_off, ulong pt_off, uint pt_stride, uint n_heads,
                              uint n_kv_heads, uint head_dim, float scale, uint t_begin) {
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
    global const half* k[ATTN_CHUNK];
    float16 d[ATTN_CHUNK];
#pragma unroll
    for (int j = 0; j < ATTN_CHUNK; ++j) {
      d[j] = (float16)(0.0f);
      k[j] = 0;
      if (j < n) {
        k[j] =
            (global const half*)(kv + kv_row_offset(page_table, pt_stride, seq, c + j, pages_offset,
                                                    page_bytes, page_tokens, kv_dim, layer, 0, 2)) +
            kv_head * head_dim;
        d[j] = qv[0] * vload_half16(0, k[j]);
#pragma unroll
        for (uint v = 1; v < ATTN_CPU_VECS; ++v)
          if (v < nv) d[j] = fma(qv[v], vload_half16(v, k[j]), d[j]);
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
          if (v < nv) acc[v] = fma((float16)(w[j]), vload_half16(v, k[j] + v_rows), acc[v]);
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
