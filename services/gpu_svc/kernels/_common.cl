// Shared by every kernel file (concatenated first). OpenCL C 1.2.
//
// Buffers are whole segments (weights, arena, KV pages) passed as byte pointers plus byte
// offsets, so one cl_mem per segment serves every tensor: no sub-buffer alignment rules.
// Activations are fp32 rows; a row stride is in elements. The token table is int32 [n][4]:
// token id, position, sequence index, logits row (or -1).
#define QK 32
#define TOK_ID 0
#define TOK_POS 1
#define TOK_SEQ 2
#define TOK_LOGITS 3

// A block of 32 weights as two float16 halves (elements 0..15 and 16..31), one reader per
// weight type. Quantised values are dequantised here, in registers: weights are never copied.
inline void load_block_q4_0(global const uchar* p, float16* lo, float16* hi) {
  const float d = vload_half(0, (global const half*)p);
  const uint16 q = convert_uint16(vload16(0, p + 2));
  // Int -> float by OR-ing the nibble into the mantissa of 2^23 (Transformer-Lite's trick):
  // exact, and cheaper than a conversion instruction on wide SIMD.
  *lo = (as_float16((q & 15u) | 0x4B000000u) - 8388616.0f) * d;
  *hi = (as_float16((q >> 4) | 0x4B000000u) - 8388616.0f) * d;
}
inline void load_block_q8_0(global const uchar* p, float16* lo, float16* hi) {
  const float d = vload_half(0, (global const half*)p);
  *lo = convert_float16(vload16(0, (global const char*)(p + 2))) * d;
  *hi = convert_float16(vload16(1, (global const char*)(p + 2))) * d;
}
inline void load_block_f16(global const uchar* p, float16* lo, float16* hi) {
  *lo = vload_half16(0, (global const half*)p);
  *hi = vload_half16(1, (global const half*)p);
}
inline void load_block_f32(global const uchar* p, float16* lo, float16* hi) {
  *lo = vload16(0, (global const float*)p);
  *hi = vload16(1, (global const float*)p);
}
#define BLOCK_BYTES_q4_0 18
#define BLOCK_BYTES_q8_0 34
#define BLOCK_BYTES_f16 64
#define BLOCK_BYTES_f32 128
// Block b (weights 32b .. 32b + 31) of the row at wr, as the generic kernels' macros read it:
// at b * BLOCK_BYTES for the types of 32-weight blocks; E0M4 (matmul_qx_e0m4.cl) keeps four
// such sub-blocks behind one group header and defines its own.
#define BLOCK_AT(NAME, wr, b) ((wr) + (ulong)(b) * BLOCK_BYTES_##NAME)
#define load_block_at_q4_0(wr, b, lo, hi) load_block_q4_0(BLOCK_AT(q4_0, wr, b), lo, hi)
#define load_block_at_q8_0(wr, b, lo, hi) load_block_q8_0(BLOCK_AT(q8_0, wr, b), lo, hi)
#define load_block_at_f16(wr, b, lo, hi) load_block_f16(BLOCK_AT(f16, wr, b), lo, hi)
#define load_block_at_f32(wr, b, lo, hi) load_block_f32(BLOCK_AT(f32, wr, b), lo, hi)

// A function that both its kernel and a step chain (step_chain_cpu.cl) call, as ONE compiled
// body: the work-group vectorizer cannot fold it into a loop across work-items with other
// arithmetic (vector exp, cos, ...), so a chained op has the bits of its kernel apart. On x86
// clang (PoCL) only; elsewhere an ordinary inline function.
#if defined(__x86_64__) && defined(__clang__)
#define CHAIN_SHARED __attribute__((noinline))
#else
#define CHAIN_SHARED inline
#endif

inline float sum16(float16 v) {
  const float8 a = v.lo + v.hi;
  const float4 b = a.lo + a.hi;
  const float2 c = b.lo + b.hi;
  return c.x + c.y;
}

// KV page layout: page p at pages_offset + p * page_bytes, [layer][k|v][page_tokens][kv_dim]
// values; a row is kv_dim units of value_bytes (4: f32, 2: f16) or, for q8_0, kv_dim / 32 units
// (blocks) of 34 bytes (kv_write.cl, attention.cl). Position p of sequence s is row
// p % page_tokens of page page_table[s][p / page_tokens].
inline ulong kv_row_offset(global const int* page_table, uint pt_stride, int seq, int pos, ulong pages_offset,
                           ulong page_bytes, uint page_tokens, uint kv_dim, uint layer, uint which,
                           uint value_bytes) {
  const int page = page_table[(ulong)seq * pt_stride + (uint)pos / page_tokens];
  const uint row = (uint)pos % page_tokens;
  return pages_offset + (ulong)page * page_bytes +
         (((ulong)layer * 2 + which) * page_tokens + row) * kv_dim * value_bytes;
}
// Token t's K and V rows (kv_row_offset at its sequence and position): where the KV writes put
// its values (kv_write_*_at).
inline void kv_token_rows(global const uchar* arena, ulong tok_off, ulong pt_off, uint pt_stride,
                          uint t, ulong pages_offset, ulong page_bytes, uint page_tokens,
                          uint kv_units, uint layer, uint unit_bytes, ulong* k_dst, ulong* v_dst) {
  global const int* tok = (global const int*)(arena + tok_off);
  global const int* page_table = (global const int*)(arena + pt_off);
  const int pos = tok[4 * t + TOK_POS];
  const int seq = tok[4 * t + TOK_SEQ];
  *k_dst = kv_row_offset(page_table, pt_stride, seq, pos, pages_offset, page_bytes, page_tokens,
                         kv_units, layer, 0, unit_bytes);
  *v_dst = kv_row_offset(page_table, pt_stride, seq, pos, pages_offset, page_bytes, page_tokens,
                         kv_units, layer, 1, unit_bytes);
}
