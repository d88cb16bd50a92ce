// Per-token ops: embedding lookup, RMSNorm, RoPE, SwiGLU, residual add, KV write.
// NDRange dim 1 is the token (offset by t_begin), dim 0 the element/block/pair.

// out[t] = table row tok[t].id, one 32-element block per work-item.
#define DEFINE_EMBED(NAME)                                                                    \
  kernel void embed_##NAME(global const uchar* w, ulong w_off, uint cols, ulong tok_off, \
                           global uchar* arena, ulong out_off, uint out_stride, uint t_begin) {  \
    const uint b = get_global_id(0);                                                          \
    const uint t = t_begin + get_global_id(1);                                                \
    global const int* tok = (global const int*)(arena + tok_off);                             \
    const ulong row_bytes = (ulong)(cols / QK) * BLOCK_BYTES_##NAME;                           \
    const int id = tok[4 * t + TOK_ID];                                                       \
    float16 lo, hi;                                                                           \
    load_block_at_##NAME(w + w_off + (ulong)id * row_bytes, b, &lo, &hi);                      \
    global float* out = (global float*)(arena + out_off) + (ulong)t * out_stride + b * QK;    \
    vstore16(lo, 0, out);                                                                     \
    vstore16(hi, 1, out);                                                                     \
  }
DEFINE_EMBED(q4_0)
DEFINE_EMBED(q8_0)
DEFINE_EMBED(f16)
DEFINE_EMBED(f32)

// The work-group's sum of every work-item's s, a tree in `partial` (one float a work-item, the
// local size a power of two): every work-item gets it. rmsnorm's and add_rmsnorm's, so the two
// give the same bits.
inline float group_sum(local float* partial, float s) {
  const uint lid = get_local_id(0);
  partial[lid] = s;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (uint half_n = get_local_size(0) / 2; half_n > 0; half_n /= 2) {
    if (lid < half_n) partial[lid] += partial[lid + half_n];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  return partial[0];
}

// One work-group per token: sum of squares reduced in local memory, then scaled by weight.
// out may alias x: every work-item reads its elements before the barrier and writes after.
kernel void rmsnorm(global uchar* arena, ulong x_off, uint x_stride, ulong out_off, uint out_stride,
                    global const uchar* w, ulong w_off, uint dim, float eps, uint t_begin,
                    local float* partial) {
  const uint lid = get_local_id(0);
  const uint lsz = get_local_size(0);
  const uint t = t_begin + get_group_id(1);
  global const float* x = (global const float*)(arena + x_off) + (ulong)t * x_stride;
  float s = 0.0f;
  for (uint i = lid; i < dim; i += lsz) s += x[i] * x[i];
  const float scale = rsqrt(group_sum(partial, s) / (float)dim + eps);
  global const float* wt = (global const float*)(w + w_off);
  global float* out = (global float*)(arena + out_off) + (ulong)t * out_stride;
  for (uint i = lid; i < dim; i += lsz) out[i] = x[i] * scale * wt[i];
}

// The residual add x = a + b (x may be a or b), then rmsnorm of x, in one launch (GPUs: the
// runner's op_fusion.h). A work-group per token, as rmsnorm's: each work-item adds the columns it
// then sums the squares of (the add kernel's a + b, rmsnorm's sum), so with rmsnorm's group size
// the same bits as add then rmsnorm. out may be a or b row for row (a token's reads of them come
// before its barrier, its writes after), but no other rows of theirs (the host checks).
kernel void add_rmsnorm(global uchar* arena, ulong a_off, uint a_stride, ulong b_off, uint b_stride,
                        ulong x_off, uint x_stride, ulong out_off, uint out_stride,
                        global const uchar* w, ulong w_off, uint dim, float eps, uint t_begin,
                        local float* partial) {
  const uint lid = get_local_id(0);
  const uint lsz = get_local_size(0);
  const uint t = t_begin + get_group_id(1);
  global const float* a = (global const float*)(arena + a_off) + (ulong)t * a_stride;
  global const float* b = (global const float*)(arena + b_off) + (ulong)t * b_stride;
  global float* x = (global float*)(arena + x_off) + (ulong)t * x_stride;
  float s = 0.0f;
  for (uint i = lid; i < dim; i += lsz) {
    const float v = a[i] + b[i];
    x[i] = v;
    s += v * v;
  }
  const float scale = rsqrt(group_sum(partial, s) / (float)dim + eps);
  global const float* wt = (global const float*)(w + w_off);
  global float* out = (global float*)(arena + out_off) + (ulong)t * out_stride;
  for (uint i = lid; i < dim; i += lsz) out[i] = x[i] * scale * wt[i];  // x[i]: its own write
}

// In place on interleaved pairs; the angle is computed in double where the device has it
// (long positions lose digits in float), as the reference does.
#ifdef cl_khr_fp64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#define ROPE_REAL double
#else
#define ROPE_REAL float
#endif
// The angle step of pair i (ggml's rope without YaRN extrapolation): freq_scale * base^(-2i/d)
// divided by the pair's freq factor (Llama 3's rope_freqs, when has_ff). The same expression in
// rope and rope_heads, so both give the same bits.
ROPE_REAL rope_freq(uint i, uint head_dim, float freq_base, float freq_scale,
                    global const uchar* w, ulong ff_off, uint has_ff) {
  ROPE_REAL f = (ROPE_REAL)freq_scale *
                pow((ROPE_REAL)freq_base, (ROPE_REAL)(-2.0) * (ROPE_REAL)i / (ROPE_REAL)head_dim);
  if (has_ff) f = f / (ROPE_REAL)((global const float*)(w + ff_off))[i];
  return f;
}

// Pair i of head h of token t, in place: mode 0 (normal) rotates values (2i, 2i+1) of the head,
// mode 2 (neox) values (i, i + head_dim/2). rope and rope_pair share it, so they give the same
// bits.
inline void rope_rotate_pair(global uchar* arena, ulong x_off, uint x_stride, uint head_dim,
                             float freq_base, ulong tok_off, float freq_scale, uint mode,
                             global const uchar* w, ulong ff_off, uint has_ff, uint i, uint h,
                             uint t) {
  global const int* tok = (global const int*)(arena + tok_off);
  const int pos = tok[4 * t + TOK_POS];
  const ROPE_REAL theta =
      (ROPE_REAL)pos * rope_freq(i, head_dim, freq_base, freq_scale, w, ff_off, has_ff);
  const float c = (float)cos(theta);
  const float s = (float)sin(theta);
  const uint first = mode == 2 ? i : 2 * i;
  const uint partner = mode == 2 ? head_dim / 2 : 1;
  global float* pair = (global float*)(arena + x_off) + (ulong)t * x_stride + h * head_dim + first;
  const float a = pair[0], b = pair[partner];
  pair[0] = a * c - b * s;
  pair[partner] = a * s + b * c;
}

// A work-item per pair, head and token.
kernel void rope(global uchar* arena, ulong x_off, uint x_stride, uint head_dim, float freq_base,
                 ulong tok_off, uint t_begin, float freq_scale, uint mode,
                 global const uchar* w, ulong ff_off, uint has_ff) {
  rope_rotate_pair(arena, x_off, x_stride, head_dim, freq_base, tok_off, freq_scale, mode, w,
                   ff_off, has_ff, get_global_id(0), get_global_id(1), t_begin + get_global_id(2));
}

// rope of two tensors of the same tokens in one launch (a layer's Q and K on GPUs: the runner's
// op_fusion.h): heads [0, x_heads) are x's, the rest y's; each work-item does what rope's would,
// so the same bits as two rope launches, one launch fewer per layer.
kernel void rope_pair(global uchar* arena, ulong x_off, uint x_stride, uint x_heads, ulong y_off,
                      uint y_stride, uint head_dim, float freq_base, ulong tok_off, uint t_begin,
                      float freq_scale, uint mode, global const uchar* w, ulong ff_off,
                      uint has_ff) {
  const uint h = get_global_id(1);
  const bool in_y = h >= x_heads;
  rope_rotate_pair(arena, in_y ? y_off : x_off, in_y ? y_stride : x_stride, head_dim, freq_base,
                   tok_off, freq_scale, mode, w, ff_off, has_ff, get_global_id(0),
                   in_y ? h - x_heads : h, t_begin + get_global_id(2));
}

// x[t][i] += bias[i]: a biased projection's output, in place.
kernel void add_bias(global uchar* arena, ulong x_off, uint x_stride, global const uchar* w,
                     ulong b_off, uint t_begin) {
  const uint i = get_global_id(0);
  const uint t = t_begin + get_global_id(1);
  ((global float*)(arena + x_off))[(ulong)t * x_stride + i] +=
      ((global const float*)(w + b_off))[i];
}

kernel void swiglu(global uchar* arena, ulong g_off, uint g_stride, ulong u_off, uint u_stride,
                   ulong out_off, uint out_stride, uint t_begin) {
  const uint i = get_global_id(0);
  const uint t = t_begin + get_global_id(1);
  const float g = ((global const float*)(arena + g_off))[(ulong)t * g_stride + i];
  const float u = ((global const float*)(arena + u_off))[(ulong)t * u_stride + i];
  ((global float*)(arena + out_off))[(ulong)t * out_stride + i] = g / (1.0f + exp(-g)) * u;
}

// GeGLU (Gemma): gelu(g) * u with GELU's tanh approximation, ggml_gelu_f32's formula.
kernel void geglu(global uchar* arena, ulong g_off, uint g_stride, ulong u_off, uint u_stride,
                  ulong out_off, uint out_stride, uint t_begin) {
  const uint i = get_global_id(0);
  const uint t = t_begin + get_global_id(1);
  const float g = ((global const float*)(arena + g_off))[(ulong)t * g_stride + i];
  const float u = ((global const float*)(arena + u_off))[(ulong)t * u_stride + i];
  const float inner = 0.79788456080286535588f * g * (1.0f + 0.044715f * g * g);
  ((global float*)(arena + out_off))[(ulong)t * out_stride + i] = 0.5f * g * (1.0f + tanh(inner)) * u;
}

// x[t][i] *= s in place (Gemma's embedding scale, after the lookup).
kernel void scale_rows(global uchar* arena, ulong x_off, uint x_stride, float s, uint t_begin) {
  const uint i = get_global_id(0);
  const uint t = t_begin + get_global_id(1);
  ((global float*)(arena + x_off))[(ulong)t * x_stride + i] *= s;
}

kernel void add(global uchar* arena, ulong a_off, uint a_stride, ulong b_off, uint b_stride,
                ulong out_off, uint out_stride, uint t_begin) {
  const uint i = get_global_id(0);
  const uint t = t_begin + get_global_id(1);
  const float a = ((global const float*)(arena + a_off))[(ulong)t * a_stride + i];
  const float b = ((global const float*)(arena + b_off))[(ulong)t * b_stride + i];
  ((global float*)(arena + out_off))[(ulong)t * out_stride + i] = a + b;
}

// Value i of token t's K and V rows into its KV row (copies: exact, so the step chains'
// kv_write stage calls this inline and gets the same bits).
inline void kv_write_f32_at(global const uchar* arena, ulong k_off, uint k_stride, ulong v_off,
                            uint v_stride, global uchar* kv, ulong pages_offset, ulong page_bytes,
                            uint page_tokens, uint kv_dim, uint layer, ulong tok_off, ulong pt_off,
                            uint pt_stride, uint i, uint t) {
  ulong k_dst, v_dst;
  kv_token_rows(arena, tok_off, pt_off, pt_stride, t, pages_offset, page_bytes, page_tokens,
                kv_dim, layer, 4, &k_dst, &v_dst);
  ((global float*)(kv + k_dst))[i] = ((global const float*)(arena + k_off))[(ulong)t * k_stride + i];
  ((global float*)(kv + v_dst))[i] = ((global const float*)(arena + v_off))[(ulong)t * v_stride + i];
}
kernel void kv_write(global const uchar* arena, ulong k_off, uint k_stride, ulong v_off,
                     uint v_stride, global uchar* kv, ulong pages_offset, ulong page_bytes,
                     uint page_tokens, uint kv_dim, uint layer, ulong tok_off, ulong pt_off,
                     uint pt_stride, uint t_begin) {
  kv_write_f32_at(arena, k_off, k_stride, v_off, v_stride, kv, pages_offset, page_bytes,
                  page_tokens, kv_dim, layer, tok_off, pt_off, pt_stride, get_global_id(0),
                  t_begin + get_global_id(1));
}

// A plain copy, 16 floats per work-item: the bandwidth yardstick of bench/gpu.
kernel void copy_f32(global const float* src, global float* dst) {
  const size_t i = get_global_id(0);
  vstore16(vload16(i, src), i, dst);
}

// rope for CPU devices: one work-item per pair and ROPE_TOKENS tokens computes the pair's
// frequency once (double pow, cos and sin are long scalar library calls on PoCL), then each
// token's angle, and rotates that pair in every head; the same arithmetic per element as rope
// above, so the same bits.
#define ROPE_TOKENS 8
kernel void rope_heads(global uchar* arena, ulong x_off, uint x_stride, uint head_dim,
                       float freq_base, ulong tok_off, uint t_begin, uint n_heads, uint t_count,
                       float freq_scale, uint mode, global const uchar* w, ulong ff_off,
                       uint has_ff) {
  const uint i = get_global_id(0);
  const uint t0 = get_global_id(1) * ROPE_TOKENS;
  global const int* tok = (global const int*)(arena + tok_off);
  const ROPE_REAL freq = rope_freq(i, head_dim, freq_base, freq_scale, w, ff_off, has_ff);
  const uint first = mode == 2 ? i : 2 * i;
  const uint partner = mode == 2 ? head_dim / 2 : 1;
  for (uint k = 0; k < ROPE_TOKENS && t0 + k < t_count; ++k) {
    const uint t = t_begin + t0 + k;
    const ROPE_REAL theta = (ROPE_REAL)tok[4 * t + TOK_POS] * freq;
    const float c = (float)cos(theta);
    const float s = (float)sin(theta);
    global float* row = (global float*)(arena + x_off) + (ulong)t * x_stride + first;
    for (uint h = 0; h < n_heads; ++h) {
      global float* pair = row + h * head_dim;
      const float a = pair[0], b = pair[partner];
      pair[0] = a * c - b * s;
      pair[partner] = a * s + b * c;
    }
  }
}

// rope_heads of two tensors of the same tokens in one launch (a layer's Q and K: the runner's
// op_fusion.h): the same angle per pair and token, the same arithmetic per element, so the same
// bits as two rope_heads launches; one kernel fewer per layer.
CHAIN_SHARED void rope_heads_pair_at(global uchar* arena, ulong x_off, uint x_stride,
                                     uint x_heads, ulong y_off, uint y_stride, uint y_heads,
                                     uint head_dim, float freq_base, ulong tok_off, uint t_begin,
                                     uint t_count, float freq_scale, uint mode,
                                     global const uchar* w, ulong ff_off, uint has_ff, uint i,
                                     uint t0) {
  global const int* tok = (global const int*)(arena + tok_off);
  const ROPE_REAL freq = rope_freq(i, head_dim, freq_base, freq_scale, w, ff_off, has_ff);
  const uint first = mode == 2 ? i : 2 * i;
  const uint partner = mode == 2 ? head_dim / 2 : 1;
  for (uint k = 0; k < ROPE_TOKENS && t0 + k < t_count; ++k) {
    const uint t = t_begin + t0 + k;
    const ROPE_REAL theta = (ROPE_REAL)tok[4 * t + TOK_POS] * freq;
    const float c = (float)cos(theta);
    const float s = (float)sin(theta);
    for (uint which = 0; which < 2; ++which) {
      global float* row = (global float*)(arena + (which ? y_off : x_off)) +
                          (ulong)t * (which ? y_stride : x_stride) + first;
      const uint heads = which ? y_heads : x_heads;
      for (uint h = 0; h < heads; ++h) {
        global float* pair = row + h * head_dim;
        const float a = pair[0], b = pair[partner];
        pair[0] = a * c - b * s;
        pair[partner] = a * s + b * c;
      }
    }
  }
}
kernel void rope_heads_pair(global uchar* arena, ulong x_off, uint x_stride, uint x_heads,
                            ulong y_off, uint y_stride, uint y_heads, uint head_dim,
                            float freq_base, ulong tok_off, uint t_begin, uint t_count,
                            float freq_scale, uint mode, global const uchar* w, ulong ff_off,
                            uint has_ff) {
  rope_heads_pair_at(arena, x_off, x_stride, x_heads, y_off, y_stride, y_heads, head_dim,
                     freq_base, tok_off, t_begin, t_count, freq_scale, mode, w, ff_off, has_ff,
                     get_global_id(0), get_global_id(1) * ROPE_TOKENS);
}
