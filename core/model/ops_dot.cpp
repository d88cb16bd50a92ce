#include "core/model/ops_dot.h"

#include <cmath>
#include <cstring>

#include "core/base/fp16.h"
#include "core/base/stream_dispatch.h"
#include "core/model/quant.h"
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define DUET_DOT_AVX2 1
#endif

// Every kernel accumulates in 8 lanes in the same order and reduces them the same way, so the
// AVX2 and portable paths differ only in speed. Quantised rows: per block, the 32 products of
// unscaled values are summed into the lanes, then the lanes are scaled by the block's d and added.
// Each kernel runs N independent streams (row s with activations x[s]) in one loop.
namespace duet::ops {
static_assert(kMaxStreams == kMaxDotStreams);
namespace {

#if DUET_DOT_AVX2
using Lanes = __m256;
inline Lanes zero() {
  return _mm256_setzero_ps();
}
inline Lanes load(const float* p) {
  return _mm256_loadu_ps(p);
}
inline Lanes load_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline Lanes load_bf16(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
inline Lanes load_i8(const int8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline Lanes mul(Lanes a, Lanes b) {
  return _mm256_mul_ps(a, b);
}
inline Lanes fma(Lanes a, Lanes b, Lanes c) {
  return _mm256_fmadd_ps(a, b, c);
}
inline Lanes splat(float v) {
  return _mm256_set1_ps(v);
}
inline float hsum(Lanes v) {
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
// The 32 weights of a Q4_0 block as 4 lane groups of unscaled values (nibble - 8).
inline void load_q4_0(const BlockQ4_0& b, Lanes q[4]) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
  const __m128i mask = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
  const __m128i lo = _mm_sub_epi8(_mm_and_si128(packed, mask), eight);  // weights 0..15
  const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(packed, 4), mask), eight);  // 16..31
  q[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
  q[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
  q[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
  q[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
}
#else
struct Lanes {
  float v[8];
};
inline Lanes zero() {
  return Lanes{};
}
inline Lanes load(const float* p) {
  Lanes r;
  std::memcpy(r.v, p, sizeof r.v);
  return r;
}
inline Lanes load_f16(const uint16_t* p) {
  Lanes r;
  for (int l = 0; l < 8; ++l) r.v[l] = fp16_to_fp32(p[l]);
  return r;
}
inline Lanes load_bf16(const uint16_t* p) {
  Lanes r;
  for (int l = 0; l < 8; ++l) r.v[l] = bf16_to_fp32(p[l]);
  return r;
}
inline Lanes load_i8(const int8_t* p) {
  Lanes r;
  for (int l = 0; l < 8; ++l) r.v[l] = static_cast<float>(p[l]);
  return r;
}
inline Lanes mul(Lanes a, Lanes b) {
  for (int l = 0; l < 8; ++l) a.v[l] *= b.v[l];
  return a;
}
inline Lanes fma(Lanes a, Lanes b, Lanes c) {
  for (int l = 0; l < 8; ++l) c.v[l] = std::fma(a.v[l], b.v[l], c.v[l]);
  return c;
}
inline Lanes splat(float v) {
  Lanes r;
  for (float& x : r.v) x = v;
  return r;
}
inline float hsum(const Lanes& a) {
  float s4[4], s2[2];
  for (int i = 0; i < 4; ++i) s4[i] = a.v[i] + a.v[i + 4];
  for (int i = 0; i < 2; ++i) s2[i] = s4[i] + s4[i + 2];
  return s2[0] + s2[1];
}
inline void load_q4_0(const BlockQ4_0& b, Lanes q[4]) {
  for (int j = 0; j < 16; ++j) {
    q[j / 8].v[j % 8] = static_cast<float>((b.qs[j] & 0x0f) - 8);
    q[2 + j / 8].v[j % 8] = static_cast<float>((b.qs[j] >> 4) - 8);
  }
}
#endif

// Plain rows (F32, or F16 converted on load); a tail shorter than 8 is added in order.
template <int N, class Elem, class Load, class ToFloat>
void dot_plain(const void* const* rows, const float* const* x, int64_t n, float* out,
               Load load_lanes, ToFloat to_float) {
  Lanes acc[N];
  for (int s = 0; s < N; ++s) acc[s] = zero();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int s = 0; s < N; ++s)
      acc[s] = fma(load_lanes(static_cast<const Elem*>(rows[s]) + i), load(x[s] + i), acc[s]);
  for (int s = 0; s < N; ++s) {
    float sum = hsum(acc[s]);
    for (int64_t k = i; k < n; ++k)
      sum = std::fma(to_float(static_cast<const Elem*>(rows[s])[k]), x[s][k], sum);
    out[s] = sum;
  }
}

template <int N>
void dot_q8_0(const void* const* rows, const float* const* x, int64_t n, float* out) {
  Lanes acc[N];
  for (int s = 0; s < N; ++s) acc[s] = zero();
  for (int64_t b = 0; b < n / kQK; ++b) {
    for (int s = 0; s < N; ++s) {
      const BlockQ8_0& blk = static_cast<const BlockQ8_0*>(rows[s])[b];
      const float* xb = x[s] + b * kQK;
      Lanes bs = mul(load_i8(blk.qs), load(xb));
      for (int g = 1; g < 4; ++g) bs = fma(load_i8(blk.qs + 8 * g), load(xb + 8 * g), bs);
      acc[s] = fma(splat(fp16_to_fp32(blk.d)), bs, acc[s]);
    }
  }
  for (int s = 0; s < N; ++s) out[s] = hsum(acc[s]);
}

template <int N>
void dot_q4_0(const void* const* rows, const float* const* x, int64_t n, float* out) {
  Lanes acc[N];
  for (int s = 0; s < N; ++s) acc[s] = zero();
  for (int64_t b = 0; b < n / kQK; ++b) {
    for (int s = 0; s < N; ++s) {
      const BlockQ4_0& blk = static_cast<const BlockQ4_0*>(rows[s])[b];
      const float* xb = x[s] + b * kQK;
      Lanes q[4];
      load_q4_0(blk, q);
      Lanes bs = mul(q[0], load(xb));
      for (int g = 1; g < 4; ++g) bs = fma(q[g], load(xb + 8 * g), bs);
      acc[s] = fma(splat(fp16_to_fp32(blk.d)), bs, acc[s]);
    }
  }
  for (int s = 0; s < N; ++s) out[s] = hsum(acc[s]);
}

// Rows of the types with offsets or sub-block scales (Q4_1, Q5_0, Q5_1, the K types): each block
// is dequantised to floats (core/model/quant.h's values exactly) and dotted as a plain row, so the
// result is bit-identical to dot_plain over the dequantised row (their unpacked form).
template <int N>
void dot_dequantised(DType type, const void* const* rows, const float* const* x, int64_t n,
                     float* out) {
  const int64_t block = dtype_block_elems(type);
  const size_t block_bytes = dtype_block_bytes(type);
  Lanes acc[N];
  for (int s = 0; s < N; ++s) acc[s] = zero();
  alignas(32) float w[kQK_K];
  for (int64_t b = 0; b < n / block; ++b) {
    for (int s = 0; s < N; ++s) {
      dequantize_row(type, static_cast<const uint8_t*>(rows[s]) + b * block_bytes, w, block);
      const float* xb = x[s] + b * block;
      for (int64_t i = 0; i < block; i += 8) acc[s] = fma(load(w + i), load(xb + i), acc[s]);
    }
  }
  for (int s = 0; s < N; ++s) out[s] = hsum(acc[s]);
}

// An unpacked quantised row: unscaled values in q, one scale per block.
template <int N>
void dot_blocks(const float* q, const float* scales, const float* const* x, int64_t n, float* out) {
  Lanes acc[N];
  for (int s = 0; s < N; ++s) acc[s] = zero();
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* qb = q + b * kQK;
    const Lanes d = splat(scales[b]);
    for (int s = 0; s < N; ++s) {
      const float* xb = x[s] + b * kQK;
      Lanes bs = mul(load(qb), load(xb));
      for (int g = 1; g < 4; ++g) bs = fma(load(qb + 8 * g), load(xb + 8 * g), bs);
      acc[s] = fma(d, bs, acc[s]);
    }
  }
  for (int s = 0; s < N; ++s) out[s] = hsum(acc[s]);
}

template <int N>
void dot_rows_n(DType type, const void* const* rows, const float* const* xs, int64_t n,
                float* out) {
  switch (type) {
    case DType::F32:
      return dot_plain<N, float>(
          rows, xs, n, out, [](const float* p) { return load(p); }, [](float v) { return v; });
    case DType::F16:
      return dot_plain<N, uint16_t>(
          rows, xs, n, out, [](const uint16_t* p) { return load_f16(p); },
          [](uint16_t h) { return fp16_to_fp32(h); });
    case DType::Q8_0:
      return dot_q8_0<N>(rows, xs, n, out);
    case DType::Q4_0:
      return dot_q4_0<N>(rows, xs, n, out);
    case DType::BF16:
      return dot_plain<N, uint16_t>(
          rows, xs, n, out, [](const uint16_t* p) { return load_bf16(p); },
          [](uint16_t h) { return bf16_to_fp32(h); });
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::E0M4:
      return dot_dequantised<N>(type, rows, xs, n, out);
  }
}

template <int N>
void dot_unpacked_n(DType type, const float* q, const float* scales, const float* const* xs,
                    int64_t n, float* out) {
  if (type == DType::Q8_0 || type == DType::Q4_0) return dot_blocks<N>(q, scales, xs, n, out);
  const void* rows[N];
  for (int s = 0; s < N; ++s) rows[s] = q;
  dot_plain<N, float>(
      rows, xs, n, out, [](const float* p) { return load(p); }, [](float v) { return v; });
}

}  // namespace

void dot_rows(DType type, const void* const* rows, const float* const* xs, int count, int64_t n,
              float* out) {
  with_stream_count(
      count, [&](auto streams) { dot_rows_n<decltype(streams)::value>(type, rows, xs, n, out); });
}

float dot_row(DType type, const void* row, const float* x, int64_t n) {
  float out = 0;
  dot_rows_n<1>(type, &row, &x, n, &out);
  return out;
}

void unpack_row(DType type, const void* row, float* q, float* scales, int64_t n) {
  switch (type) {
    case DType::F32:
      std::memcpy(q, row, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::F16: {
      const auto* h = static_cast<const uint16_t*>(row);
      for (int64_t i = 0; i < n; ++i) q[i] = fp16_to_fp32(h[i]);
      return;
    }
    case DType::Q8_0: {
      const auto* blocks = static_cast<const BlockQ8_0*>(row);
      for (int64_t b = 0; b < n / kQK; ++b) {
        scales[b] = fp16_to_fp32(blocks[b].d);
        for (int i = 0; i < kQK; ++i) q[b * kQK + i] = static_cast<float>(blocks[b].qs[i]);
      }
      return;
    }
    case DType::Q4_0: {
      const auto* blocks = static_cast<const BlockQ4_0*>(row);
      for (int64_t b = 0; b < n / kQK; ++b) {
        scales[b] = fp16_to_fp32(blocks[b].d);
        for (int j = 0; j < kQK / 2; ++j) {
          q[b * kQK + j] = static_cast<float>((blocks[b].qs[j] & 0x0f) - 8);
          q[b * kQK + j + kQK / 2] = static_cast<float>((blocks[b].qs[j] >> 4) - 8);
        }
      }
      return;
    }
    case DType::BF16:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::E0M4:
    case DType::Q6_K:  // the dequantised row, dotted as F32 (see dot_dequantised)
      dequantize_row(type, row, q, n);
      return;
  }
}

void dot_unpacked(DType type, const float* q, const float* scales, const float* const* xs,
                  int count, int64_t n, float* out) {
  with_stream_count(count, [&](auto streams) {
    dot_unpacked_n<decltype(streams)::value>(type, q, scales, xs, n, out);
  });
}

}  // namespace duet::ops
