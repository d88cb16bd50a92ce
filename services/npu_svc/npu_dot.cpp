// GCC 12 reports its own AVX-512 intrinsics' _mm512_undefined_* arguments as "maybe
// uninitialized" (or, depending on inlining, "uninitialized") once they are inlined (GCC bug
// 105593); the pragmas must precede the header.
#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "services/npu_svc/npu_dot.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "core/base/fp16.h"
#include "core/base/stream_dispatch.h"
#include "core/model/quant.h"
#if defined(__AVX512F__)
#include <immintrin.h>
#define DUET_NPU_DOT_AVX512 1
#endif

// The AVX-512 and portable paths do the same operations in the same order (fma per lane, the
// same reduction tree), so they differ only in speed.
namespace duet::npu {
static_assert(kDotStreams == kMaxDotStreams);
namespace {

constexpr int kLanes = 16;

#if DUET_NPU_DOT_AVX512
using Lanes = __m512;
inline Lanes zero() {
  return _mm512_setzero_ps();
}
inline Lanes load(const float* p) {
  return _mm512_loadu_ps(p);
}
inline void store(float* p, Lanes v) {
  _mm512_storeu_ps(p, v);
}
inline Lanes fma(Lanes a, Lanes b, Lanes c) {
  return _mm512_fmadd_ps(a, b, c);
}
inline Lanes scaled(Lanes a, float d) {  // exact: small integers times an fp16 scale
  return _mm512_mul_ps(a, _mm512_set1_ps(d));
}
inline Lanes load_f16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline Lanes load_i8(const int8_t* p) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
// A Q4_0 block's 16 bytes: low nibbles are weights 0..15, high nibbles 16..31 (minus 8).
inline void load_q4_0(const uint8_t* qs, Lanes* lo, Lanes* hi) {
  const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  const __m512i mask = _mm512_set1_epi32(15), eight = _mm512_set1_epi32(8);
  *lo = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(bytes, mask), eight));
  *hi = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(bytes, 4), eight));
}
// E0M4 (core/quant_e0m4.h): 16 bytes of a group's sub-block, codes shifted into the fraction of
// 2.0 and OR-ed with its exponent (Transformer-Lite's dequantisation: no int -> float
// conversion), then d * w1 + m (d * w1 exact, so core's values bit for bit).
inline void load_e0m4(const uint8_t* qs, float d, float m, Lanes* lo, Lanes* hi) {
  const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  const __m512i exp = _mm512_set1_epi32(0x40000000), mask = _mm512_set1_epi32(15);
  const __m512 vd = _mm512_set1_ps(d), vm = _mm512_set1_ps(m);
  const __m512i c_lo = _mm512_and_si512(bytes, mask), c_hi = _mm512_srli_epi32(bytes, 4);
  *lo = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_or_si512(_mm512_slli_epi32(c_lo, 19), exp)), vd,
                        vm);
  *hi = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_or_si512(_mm512_slli_epi32(c_hi, 19), exp)), vd,
                        vm);
}
inline float hsum(Lanes v) {
  const __m256 hi8 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), hi8);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
#else
struct Lanes {
  float v[kLanes];
};
inline Lanes zero() {
  return Lanes{};
}
inline Lanes load(const float* p) {
  Lanes r;
  std::memcpy(r.v, p, sizeof r.v);
  return r;
}
inline void store(float* p, const Lanes& v) {
  std::memcpy(p, v.v, sizeof v.v);
}
inline Lanes fma(const Lanes& a, const Lanes& b, Lanes c) {
  for (int l = 0; l < kLanes; ++l) c.v[l] = std::fma(a.v[l], b.v[l], c.v[l]);
  return c;
}
inline Lanes scaled(Lanes a, float d) {
  for (float& x : a.v) x *= d;
  return a;
}
inline Lanes load_f16(const uint16_t* p) {
  Lanes r;
  for (int l = 0; l < kLanes; ++l) r.v[l] = fp16_to_fp32(p[l]);
  return r;
}
inline Lanes load_i8(const int8_t* p) {
  Lanes r;
  for (int l = 0; l < kLanes; ++l) r.v[l] = static_cast<float>(p[l]);
  return r;
}
inline void load_q4_0(const uint8_t* qs, Lanes* lo, Lanes* hi) {
  for (int l = 0; l < kLanes; ++l) {
    lo->v[l] = static_cast<float>((qs[l] & 0x0f) - 8);
    hi->v[l] = static_cast<float>((qs[l] >> 4) - 8);
  }
}
inline void load_e0m4(const uint8_t* qs, float d, float m, Lanes* lo, Lanes* hi) {
  for (int l = 0; l < kLanes; ++l) {
    const uint32_t bits_lo = 0x40000000u | static_cast<uint32_t>(qs[l] & 0x0f) << 19;
    const uint32_t bits_hi = 0x40000000u | static_cast<uint32_t>(qs[l] >> 4) << 19;
    float w_lo, w_hi;
    std::memcpy(&w_lo, &bits_lo, sizeof w_lo);
    std::memcpy(&w_hi, &bits_hi, sizeof w_hi);
    lo->v[l] = std::fma(w_lo, d, m);
    hi->v[l] = std::fma(w_hi, d, m);
  }
}
inline float hsum(const Lanes& a) {
  float s8[8], s4[4], s2[2];
  for (int i = 0; i < 8; ++i) s8[i] = a.v[i] + a.v[i + 8];
  for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
  for (int i = 0; i < 2; ++i) s2[i] = s4[i] + s4[i + 2];
  return s2[0] + s2[1];
}
#endif

// ---- rows in their stored type (decode) ----

// acc[s] += row s . x over the first n_whole weights, for the types stored_rows_n dequantises a
// block at a time (every block size is a multiple of kLanes; BF16 goes kLanes at a time).
template <int N>
void stored_blocks(DType type, const void* const* rows, const float* x, int64_t n_whole,
                   Lanes* acc) {
  const int64_t block = type == DType::BF16 ? kLanes : dtype_block_elems(type);
  const size_t block_bytes =
      static_cast<size_t>(block / dtype_block_elems(type)) * dtype_block_bytes(type);
  alignas(64) float w[kQK_K];
  for (int64_t b = 0; b < n_whole / block; ++b)
    for (int s = 0; s < N; ++s) {
      dequantize_row(type, static_cast<const uint8_t*>(rows[s]) + b * block_bytes, w, block);
      for (int64_t i = 0; i < block; i += kLanes)
        acc[s] = fma(load(w + i), load(x + b * block + i), acc[s]);
    }
}

template <int N>
void stored_rows_n(DType type, const void* const* rows, const float* x, int64_t n, float* out) {
  Lanes acc[N];
  for (int s = 0; s < N; ++s) acc[s] = zero();
  const int64_t n_lanes = n - n % kLanes;
  switch (type) {
    case DType::Q4_0:
      for (int64_t b = 0; b < n / kQK; ++b)
        for (int s = 0; s < N; ++s) {
          const BlockQ4_0& blk = static_cast<const BlockQ4_0*>(rows[s])[b];
          const float d = fp16_to_fp32(blk.d);
          Lanes lo, hi;
          load_q4_0(blk.qs, &lo, &hi);
          acc[s] = fma(scaled(lo, d), load(x + b * kQK), acc[s]);
          acc[s] = fma(scaled(hi, d), load(x + b * kQK + kLanes), acc[s]);
        }
      break;
    case DType::Q8_0:
      for (int64_t b = 0; b < n / kQK; ++b)
        for (int s = 0; s < N; ++s) {
          const BlockQ8_0& blk = static_cast<const BlockQ8_0*>(rows[s])[b];
          const float d = fp16_to_fp32(blk.d);
          acc[s] = fma(scaled(load_i8(blk.qs), d), load(x + b * kQK), acc[s]);
          acc[s] = fma(scaled(load_i8(blk.qs + kLanes), d), load(x + b * kQK + kLanes), acc[s]);
        }
      break;
    case DType::F16:
      for (int64_t i = 0; i < n_lanes; i += kLanes)
        for (int s = 0; s < N; ++s)
          acc[s] = fma(load_f16(static_cast<const uint16_t*>(rows[s]) + i), load(x + i), acc[s]);
      break;
    case DType::F32:
      for (int64_t i = 0; i < n_lanes; i += kLanes)
        for (int s = 0; s < N; ++s)
          acc[s] = fma(load(static_cast<const float*>(rows[s]) + i), load(x + i), acc[s]);
      break;
    case DType::E0M4:
      // W4A16 with the paper's dequantisation in lanes (load_e0m4), a group's sub-blocks in
      // order: the same FMAs as a block-at-a-time dequantise-and-dot, faster.
      for (int64_t g = 0; g < n / kE0M4Group; ++g)
        for (int s = 0; s < N; ++s) {
          const BlockE0M4& blk = static_cast<const BlockE0M4*>(rows[s])[g];
          const float d = fp16_to_fp32(blk.d), m = fp16_to_fp32(blk.m);
          for (int sub = 0; sub < 4; ++sub) {
            Lanes lo, hi;
            load_e0m4(blk.qs + 16 * sub, d, m, &lo, &hi);
            const float* xb = x + g * kE0M4Group + sub * kQK;
            acc[s] = fma(lo, load(xb), acc[s]);
            acc[s] = fma(hi, load(xb + kLanes), acc[s]);
          }
        }
      break;
    case DType::BF16:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      // W4A16 on the fly: one block (32 weights, a 256-weight super-block for the K types) at a
      // time is dequantised into registers' worth of floats with core's dequantize_row, so the
      // values are exactly those the prefill path dequantises per tile.
      stored_blocks<N>(type, rows, x, n_lanes, acc);
      break;
  }
  for (int s = 0; s < N; ++s) {
    float sum = hsum(acc[s]);
    for (int64_t k = n_lanes; k < n; ++k) {  // only F16/F32/BF16 rows have a tail
      float w;
      if (type == DType::F16)
        w = fp16_to_fp32(static_cast<const uint16_t*>(rows[s])[k]);
      else if (type == DType::BF16)
        w = bf16_to_fp32(static_cast<const uint16_t*>(rows[s])[k]);
      else
        w = static_cast<const float*>(rows[s])[k];
      sum = std::fma(w, x[k], sum);
    }
    out[s] = sum;
  }
}

// ---- dequantised rows (prefill) ----

constexpr int kMicroRows = 4;      // a micro tile: 4 x 6 lane accumulators, 24 of AVX-512's
constexpr int kMicroTokens = 6;    // 32 registers, each loaded x serving 4 rows
constexpr int64_t kBlockK = 1024;  // floats of a row per pass: rows and tokens stay in L2
constexpr int64_t kBlockTokens = 4 * kMicroTokens;
constexpr int64_t kSlot = kMicroRows * kMicroTokens * kLanes;  // one micro tile's parked lanes

// acc[r][t] += w[r][k0:k1] . x[t][k0:k1] per lane; the lanes live in `parked` between passes.
template <int R, int T>
void micro_tile(const float* w, int64_t w_stride, const float* x, int64_t x_stride, int64_t k0,
                int64_t k1, float* parked) {
  Lanes acc[R][T];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[r][t] = load(parked + (r * T + t) * kLanes);
  for (int64_t i = k0; i < k1; i += kLanes) {
    Lanes xi[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) xi[t] = load(x + t * x_stride + i);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const Lanes wr = load(w + r * w_stride + i);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) acc[r][t] = fma(wr, xi[t], acc[r][t]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) store(parked + (r * T + t) * kLanes, acc[r][t]);
}

using MicroTile = void (*)(const float*, int64_t, const float*, int64_t, int64_t, int64_t, float*);
template <int R, int... T>
constexpr std::array<MicroTile, kMicroTokens> micro_row(std::integer_sequence<int, T...>) {
  return {&micro_tile<R, T + 1>...};
}
template <int... R>
constexpr std::array<std::array<MicroTile, kMicroTokens>, kMicroRows> micro_table(
    std::integer_sequence<int, R...>) {
  return {micro_row<R + 1>(std::make_integer_sequence<int, kMicroTokens>{})...};
}
// kMicro[R - 1][T - 1]: the R x T tile (edges of a block use the smaller ones).
constexpr auto kMicro = micro_table(std::make_integer_sequence<int, kMicroRows>{});

}  // namespace

void dot_stored_rows(DType type, const void* const* rows, int count, const float* x, int64_t n,
                     float* out) {
  with_stream_count(
      count, [&](auto streams) { stored_rows_n<decltype(streams)::value>(type, rows, x, n, out); });
}

void dot_dequantised(const float* w, int64_t w_stride, int64_t n_rows, const float* x,
                     int64_t x_stride, int64_t n_tokens, int64_t n, float* out,
                     int64_t out_stride) {
  const int64_t n_lanes = n - n % kLanes;
  const int64_t row_tiles = (n_rows + kMicroRows - 1) / kMicroRows;
  thread_local std::vector<float> parked;
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kBlockTokens) {
    const int64_t t_end = std::min(t0 + kBlockTokens, n_tokens);
    const int64_t token_tiles = (t_end - t0 + kMicroTokens - 1) / kMicroTokens;
    parked.assign(static_cast<size_t>(row_tiles * token_tiles * kSlot), 0.0f);
    for (int64_t k0 = 0; k0 < n_lanes; k0 += kBlockK) {
      const int64_t k1 = std::min(k0 + kBlockK, n_lanes);
      for (int64_t rt = 0; rt < row_tiles; ++rt) {
        const int64_t r = rt * kMicroRows;
        const int rows = static_cast<int>(std::min<int64_t>(kMicroRows, n_rows - r));
        for (int64_t tt = 0; tt < token_tiles; ++tt) {
          const int64_t t = t0 + tt * kMicroTokens;
          const int tokens = static_cast<int>(std::min<int64_t>(kMicroTokens, t_end - t));
          kMicro[rows - 1][tokens - 1](w + r * w_stride, w_stride, x + t * x_stride, x_stride, k0,
                                       k1, parked.data() + (rt * token_tiles + tt) * kSlot);
        }
      }
    }
    for (int64_t rt = 0; rt < row_tiles; ++rt) {
      const int64_t r0 = rt * kMicroRows;
      const int rows = static_cast<int>(std::min<int64_t>(kMicroRows, n_rows - r0));
      for (int64_t tt = 0; tt < token_tiles; ++tt) {
        const int64_t tok0 = t0 + tt * kMicroTokens;
        const int tokens = static_cast<int>(std::min<int64_t>(kMicroTokens, t_end - tok0));
        const float* slot = parked.data() + (rt * token_tiles + tt) * kSlot;
        for (int r = 0; r < rows; ++r)
          for (int t = 0; t < tokens; ++t) {
            float sum = hsum(load(slot + (r * tokens + t) * kLanes));
            const float* wr = w + (r0 + r) * w_stride;
            const float* xt = x + (tok0 + t) * x_stride;
            for (int64_t k = n_lanes; k < n; ++k) sum = std::fma(wr[k], xt[k], sum);
            out[(tok0 + t) * out_stride + r0 + r] = sum;
          }
      }
    }
  }
}

}  // namespace duet::npu
