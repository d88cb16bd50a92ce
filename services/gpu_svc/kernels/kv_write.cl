// KV writes of the value types other than F32 (kv_write in elementwise.cl). Every computation
// is in float, like the reference interpreter (core/program_interpreter.cpp); the runner passes
// each layer's own region (pages_offset, page_bytes, layer 0). Rows are addressed in units
// (kv_row_offset): a value for F16, a 32-value block for Q8_0.

// F16 (issue 20: half the bytes of F32, as llama.cpp stores its cache): vstore_half_rte is core
// OpenCL, no cl_khr_fp16 needed. One work-item per value of a token's K and V rows.
inline void kv_write_f16_at(global const uchar* arena, ulong k_off, uint k_stride, ulong v_off,
                            uint v_stride, global uchar* kv, ulong pages_offset, ulong page_bytes,
                            uint page_tokens, uint kv_dim, uint layer, ulong tok_off, ulong pt_off,
                            uint pt_stride, uint i, uint t) {
  ulong k_dst, v_dst;
  kv_token_rows(arena, tok_off, pt_off, pt_stride, t, pages_offset, page_bytes, page_tokens,
                kv_dim, layer, 2, &k_dst, &v_dst);
  vstore_half_rte(((global const float*)(arena + k_off))[(ulong)t * k_stride + i], i,
                  (global half*)(kv + k_dst));
  vstore_half_rte(((global const float*)(arena + v_off))[(ulong)t * v_stride + i], i,
                  (global half*)(kv + v_dst));
}
kernel void kv_write_f16(global const uchar* arena, ulong k_off, uint k_stride, ulong v_off,
                         uint v_stride, global uchar* kv, ulong pages_offset, ulong page_bytes,
                         uint page_tokens, uint kv_dim, uint layer, ulong tok_off, ulong pt_off,
                         uint pt_stride, uint t_begin) {
  kv_write_f16_at(arena, k_off, k_stride, v_off, v_stride, kv, pages_offset, page_bytes,
                  page_tokens, kv_dim, layer, tok_off, pt_off, pt_stride, get_global_id(0),
                  t_begin + get_global_id(1));
}

// One 32-value block as ggml's quantize_row_q8_0_ref makes it: d = amax / 127 stored as f16
// (round to nearest even), then 32 int8 values round(x / d) (half away from zero, C's roundf).
// The two divisions must be exact, as C's are; OpenCL lets a float division be 2.5 ulp off
// (NVIDIA's is: a value on a rounding edge then lands one code away), so they run in double
// where the device has it: a double quotient of floats rounded to float is the exact float one.
// The quotient goes through a volatile: else the compiler folds fptrunc(double a / double b)
// back into the inexact float division (it is exact in theory, so the fold is legal), and on
// an H200 83 of 134M codes still differed from the host's; with it, none (bench/gpu/RESULTS.md).
#ifdef cl_khr_fp64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
inline float q8_div(float a, float b) {
  volatile double q = (double)a / (double)b;
  return (float)q;
}
#else
inline float q8_div(float a, float b) { return a / b; }
#endif
inline void store_block_q8_0(global const float* x, global uchar* dst) {
  float amax = 0.0f;
  for (uint j = 0; j < QK; ++j) amax = fmax(amax, fabs(x[j]));
  const float d = q8_div(amax, 127.0f);
  const float id = d != 0.0f ? q8_div(1.0f, d) : 0.0f;
  vstore_half_rte(d, 0, (global half*)dst);
  global char* q = (global char*)(dst + 2);
  for (uint j = 0; j < QK; ++j) q[j] = (char)round(x[j] * id);
}

// Q8_0 (`--kv-type q8_0`, llama.cpp's cache type of that name): rows of kv_dim / 32 blocks of 34
// bytes along the head dimension (head_dim is a multiple of 32, so no block spans two heads).
// One work-item per block of a token's K and V rows; kv_blocks = kv_dim / 32.
inline void kv_write_q8_0_at(global const uchar* arena, ulong k_off, uint k_stride, ulong v_off,
                             uint v_stride, global uchar* kv, ulong pages_offset,
                             ulong page_bytes, uint page_tokens, uint kv_blocks, uint layer,
                             ulong tok_off, ulong pt_off, uint pt_stride, uint b, uint t) {
  ulong k_dst, v_dst;
  kv_token_rows(arena, tok_off, pt_off, pt_stride, t, pages_offset, page_bytes, page_tokens,
                kv_blocks, layer, BLOCK_BYTES_q8_0, &k_dst, &v_dst);
  store_block_q8_0((global const float*)(arena + k_off) + (ulong)t * k_stride + b * QK,
                   kv + k_dst + (ulong)b * BLOCK_BYTES_q8_0);
  store_block_q8_0((global const float*)(arena + v_off) + (ulong)t * v_stride + b * QK,
                   kv + v_dst + (ulong)b * BLOCK_BYTES_q8_0);
}
kernel void kv_write_q8_0(global const uchar* arena, ulong k_off, uint k_stride, ulong v_off,
                          uint v_stride, global uchar* kv, ulong pages_offset, ulong page_bytes,
                          uint page_tokens, uint kv_blocks, uint layer, ulong tok_off,
                          ulong pt_off, uint pt_stride, uint t_begin) {
  kv_write_q8_0_at(arena, k_off, k_stride, v_off, v_stride, kv, pages_offset, page_bytes,
                   page_tokens, kv_blocks, layer, tok_off, pt_off, pt_stride, get_global_id(0),
                   t_begin + get_global_id(1));
}
