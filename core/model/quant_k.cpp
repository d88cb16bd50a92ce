// K-quant super-blocks: quantisers in the manner of llama.cpp's reference ones (layouts and the
// search are described in core/model/quant_k.h), and dequantisers.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/base/fp16.h"
#include "core/model/quant.h"

namespace duet {
namespace {

constexpr int kSub = 32;            // Q4_K/Q5_K sub-block
constexpr int kSub6 = 16;           // Q6_K sub-block
constexpr float kAllZero = 1e-15f;  // a sub-block this small quantises to zeros

// Round half to even under the default rounding mode, as ggml's nearest_int.
inline int nearest(float v) {
  return static_cast<int>(std::nearbyint(v));
}

// x ~= scale * L - min with L in 0..nmax, min >= 0, chosen to minimise sum w (scale*L - min - x)^2.
// Start from the plain split of [min(x, 0), max x] into nmax steps, then try nstep + 1 slightly
// different step counts (nmax + rmin + rdelta * i) over [offset, max x], where offset is the best
// fit's so far: for each, round x to levels and solve the weighted least-squares line through
// (L, x) for scale and offset; keep the best. The offset is capped at 0 (a positive offset would
// need a negative "min", which the format cannot store).
struct ScaleMin {
  float scale;
  float min;
};
ScaleMin fit_scale_min(const float* x, const float* w, int n, int nmax, uint8_t* L, float rmin,
                       float rdelta, int nstep) {
  float lo = x[0], hi = x[0], sum_w = 0, sum_x = 0;
  for (int i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  lo = std::min(lo, 0.0f);
  if (hi == lo) {
    std::fill(L, L + n, uint8_t{0});
    return {0.0f, -lo};
  }
  // Float expressions are ordered as llama.cpp's so the same input gives the same bytes.
  const float iscale0 = static_cast<float>(nmax) / (hi - lo);
  float scale = 1 / iscale0;
  float offset = lo;
  float best_err = 0;
  {
    const float iscale = iscale0;
    for (int i = 0; i < n; ++i) {
      L[i] = static_cast<uint8_t>(std::clamp(nearest(iscale * (x[i] - lo)), 0, nmax));
      const float diff = scale * L[i] + lo - x[i];
      best_err += w[i] * (diff * diff);
    }
  }
  uint8_t trial[kSub];
  for (int step = 0; step <= nstep; ++step) {
    const float iscale =
        (rmin + rdelta * static_cast<float>(step) + static_cast<float>(nmax)) / (hi - offset);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest(iscale * (x[i] - offset)), 0, nmax);
      trial[i] = static_cast<uint8_t>(l);
      sum_l += w[i] * static_cast<float>(l);
      sum_l2 += w[i] * static_cast<float>(l) * static_cast<float>(l);
      sum_xl += w[i] * static_cast<float>(l) * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (!(det > 0)) continue;
    float s = (sum_w * sum_xl - sum_x * sum_l) / det;
    float m = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (m > 0) {
      m = 0;
      s = sum_xl / sum_l2;
    }
    float err = 0;
    for (int i = 0; i < n; ++i) {
      const float diff = s * trial[i] + m - x[i];
      err += w[i] * (diff * diff);
    }
    if (err < best_err) {
      std::copy(trial, trial + n, L);
      best_err = err;
      scale = s;
      offset = m;
    }
  }
  return {scale, -offset};
}

// x ~= scale * (L - nmax) with L - nmax in [-nmax, nmax - 1], minimising sum x^2 (err)^2. The
// value of largest magnitude goes to the code -nmax (the asymmetric end, as Q4_0 does), then 18
// nearby step sizes (nmax +- 0.1 .. 0.9) are tried with the least-squares scale for each rounding.
float fit_symmetric(const float* x, int n, int nmax, uint8_t* L) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax < kAllZero) {  // level 0, as llama.cpp (its scale of 0 makes every level decode to 0)
    std::fill(L, L + n, uint8_t{0});
    return 0.0f;
  }
  float best_scale = 0, best = 0;
  for (int t = 0; t <= 18; ++t) {
    const int tweak = t == 0 ? 0 : t <= 9 ? t - 10 : t - 9;  // 0 first, then -9..-1, 1..9
    const float iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(tweak)) / max;
    float sum_lx = 0, sum_l2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest(iscale * x[i]), -nmax, nmax - 1);
      const float w = x[i] * x[i];
      sum_lx += w * x[i] * static_cast<float>(l);
      sum_l2 += w * static_cast<float>(l) * static_cast<float>(l);
    }
    // Keep the rounding whose least-squares fit explains the most: (sum_lx)^2 / sum_l2.
    const bool better = t == 0 ? true : sum_l2 > 0 && sum_lx * sum_lx > best * sum_l2;
    if (!better) continue;
    best_scale = sum_l2 > 0 ? sum_lx / sum_l2 : 0.0f;
    best = best_scale * sum_lx;
    for (int i = 0; i < n; ++i)
      L[i] = static_cast<uint8_t>(std::clamp(nearest(iscale * x[i]), -nmax, nmax - 1) + nmax);
  }
  return best_scale;
}

// Q4_K/Q5_K: per 32-weight sub-block a fitted (scale, min); both lists quantised to 6 bits
// against their maxima; then every weight re-rounded with the scales as stored. L gets levels.
template <int Bits>
void quantize_k_scales(const float* x, uint16_t* d, uint16_t* dmin, uint8_t* packed, uint8_t* L) {
  constexpr int kNMax = (1 << Bits) - 1;
  // llama.cpp's search ranges: Q4_K 21 steps from nmax - 1, Q5_K 16 steps from nmax - 0.5.
  constexpr float kRMin = Bits == 4 ? -1.0f : -0.5f;
  constexpr int kSteps = Bits == 4 ? 20 : 15;
  float scales[kQK_K / kSub], mins[kQK_K / kSub];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < kQK_K / kSub; ++j) {
    const float* xs = x + kSub * j;
    float sum_x2 = 0;
    for (int l = 0; l < kSub; ++l) sum_x2 += xs[l] * xs[l];
    // Weight errors by magnitude plus the sub-block's RMS: large weights matter more, small
    // ones are not ignored.
    const float rms = std::sqrt(sum_x2 / kSub);
    float w[kSub];
    for (int l = 0; l < kSub; ++l) w[l] = rms + std::fabs(xs[l]);
    const ScaleMin sm = fit_scale_min(xs, w, kSub, kNMax, L + kSub * j, kRMin, 0.1f, kSteps);
    scales[j] = sm.scale;
    mins[j] = sm.min;
    max_scale = std::max(max_scale, sm.scale);
    max_min = std::max(max_min, sm.min);
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  std::memset(packed, 0, kKScaleBytes);
  for (int j = 0; j < kQK_K / kSub; ++j) {
    const int ls = std::min(63, nearest(inv_scale * scales[j]));
    const int lm = std::min(63, nearest(inv_min * mins[j]));
    if (j < 4) {
      packed[j] = static_cast<uint8_t>(ls);
      packed[j + 4] = static_cast<uint8_t>(lm);
    } else {
      packed[j + 4] = static_cast<uint8_t>((ls & 15) | (lm & 15) << 4);
      packed[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      packed[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  *d = fp32_to_fp16(max_scale / 63.0f);
  *dmin = fp32_to_fp16(max_min / 63.0f);
  for (int j = 0; j < kQK_K / kSub; ++j) {
    uint8_t sc, mn;
    k_scale_min(j, packed, &sc, &mn);
    const float ds = fp16_to_fp32(*d) * sc;
    if (ds == 0.0f) continue;
    const float dm = fp16_to_fp32(*dmin) * mn;
    for (int l = 0; l < kSub; ++l)
      L[kSub * j + l] =
          static_cast<uint8_t>(std::clamp(nearest((x[kSub * j + l] + dm) / ds), 0, kNMax));
  }
}

}  // namespace

void quantize_row_q4_k(const float* x, BlockQ4_K* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    uint8_t L[kQK_K];
    quantize_k_scales<4>(x, &y[b].d, &y[b].dmin, y[b].scales, L);
    for (int g = 0; g < 4; ++g)
      for (int l = 0; l < 32; ++l)
        y[b].qs[32 * g + l] = static_cast<uint8_t>(L[64 * g + l] | L[64 * g + 32 + l] << 4);
  }
}

void quantize_row_q5_k(const float* x, BlockQ5_K* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    uint8_t L[kQK_K];
    quantize_k_scales<5>(x, &y[b].d, &y[b].dmin, y[b].scales, L);
    std::memset(y[b].qh, 0, sizeof y[b].qh);
    for (int g = 0; g < 4; ++g)
      for (int l = 0; l < 32; ++l) {
        const int lo = L[64 * g + l], hi = L[64 * g + 32 + l];
        y[b].qs[32 * g + l] = static_cast<uint8_t>((lo & 15) | (hi & 15) << 4);
        y[b].qh[l] |= static_cast<uint8_t>(((lo >> 4) << (2 * g)) | ((hi >> 4) << (2 * g + 1)));
      }
  }
}

void quantize_row_q6_k(const float* x, BlockQ6_K* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    uint8_t L[kQK_K];
    float scales[kQK_K / kSub6];
    float max_scale = 0, max_abs = 0;
    for (int j = 0; j < kQK_K / kSub6; ++j) {
      scales[j] = fit_symmetric(x + kSub6 * j, kSub6, 32, L + kSub6 * j);
      if (std::fabs(scales[j]) > max_abs) {
        max_abs = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    std::memset(&y[b], 0, sizeof y[b]);
    if (max_abs < kAllZero) continue;  // d = 0: every weight decodes to 0
    // The largest scale maps to -128 (int8's asymmetric end), the super-scale is its inverse.
    const float iscale = -128.0f / max_scale;
    y[b].d = fp32_to_fp16(1.0f / iscale);
    for (int j = 0; j < kQK_K / kSub6; ++j)
      y[b].scales[j] = static_cast<int8_t>(std::min(127, nearest(iscale * scales[j])));
    for (int j = 0; j < kQK_K / kSub6; ++j) {
      const float ds = fp16_to_fp32(y[b].d) * y[b].scales[j];
      if (ds == 0.0f) continue;
      for (int l = 0; l < kSub6; ++l)
        L[kSub6 * j + l] =
            static_cast<uint8_t>(std::clamp(nearest(x[kSub6 * j + l] / ds), -32, 31) + 32);
    }
    for (int h = 0; h < 2; ++h) {
      uint8_t* ql = y[b].ql + 64 * h;
      uint8_t* qh = y[b].qh + 32 * h;
      const uint8_t* Lh = L + 128 * h;
      for (int l = 0; l < 32; ++l) {
        ql[l] = static_cast<uint8_t>((Lh[l] & 15) | (Lh[l + 64] & 15) << 4);
        ql[l + 32] = static_cast<uint8_t>((Lh[l + 32] & 15) | (Lh[l + 96] & 15) << 4);
        qh[l] = static_cast<uint8_t>((Lh[l] >> 4) | (Lh[l + 32] >> 4) << 2 |
                                     (Lh[l + 64] >> 4) << 4 | (Lh[l + 96] >> 4) << 6);
      }
    }
  }
}

namespace {

// Q4_K and Q5_K: each super-block's eight sub-blocks of 32 values are d sc q - dmin mn, with the
// sub-block's 6-bit scale and min; group g holds sub-blocks 2g (the low nibbles of its 32 bytes)
// and 2g + 1 (the high nibbles). quant(block, g, l, high) is element l's 4- or 5-bit quant.
template <class Block, class Quant>
void dequantize_row_scale_min(const Block* x, float* y, int64_t n, Quant quant) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = fp16_to_fp32(x[b].d), dmin = fp16_to_fp32(x[b].dmin);
    for (int g = 0; g < 4; ++g) {
      uint8_t sc0, mn0, sc1, mn1;
      k_scale_min(2 * g, x[b].scales, &sc0, &mn0);
      k_scale_min(2 * g + 1, x[b].scales, &sc1, &mn1);
      const float d0 = d * sc0, m0 = dmin * mn0, d1 = d * sc1, m1 = dmin * mn1;
      for (int l = 0; l < 32; ++l) *y++ = d0 * static_cast<float>(quant(x[b], g, l, false)) - m0;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(quant(x[b], g, l, true)) - m1;
    }
  }
}

}  // namespace

void dequantize_row_q4_k(const BlockQ4_K* x, float* y, int64_t n) {
  dequantize_row_scale_min(x, y, n, [](const BlockQ4_K& b, int g, int l, bool high) {
    const uint8_t q = b.qs[32 * g + l];
    return high ? q >> 4 : q & 15;
  });
}

void dequantize_row_q5_k(const BlockQ5_K* x, float* y, int64_t n) {
  dequantize_row_scale_min(x, y, n, [](const BlockQ5_K& b, int g, int l, bool high) {
    const uint8_t q = b.qs[32 * g + l];
    return (high ? q >> 4 : q & 15) | ((b.qh[l] >> (2 * g + high)) & 1) << 4;
  });
}

void dequantize_row_q6_k(const BlockQ6_K* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = fp16_to_fp32(x[b].d);
    for (int h = 0; h < 2; ++h, y += 128) {
      const uint8_t* ql = x[b].ql + 64 * h;
      const uint8_t* qh = x[b].qh + 32 * h;
      const int8_t* sc = x[b].scales + 8 * h;
      for (int l = 0; l < 32; ++l) {
        const int s = l / 16;  // sub-blocks of 16: weight 128h + 32k + l is in 8h + 2k + l/16
        const int q0 = ((ql[l] & 15) | ((qh[l] >> 0) & 3) << 4) - 32;
        const int q1 = ((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4) - 32;
        const int q2 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
        const int q3 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
        y[l] = d * static_cast<float>(sc[s]) * static_cast<float>(q0);
        y[l + 32] = d * static_cast<float>(sc[s + 2]) * static_cast<float>(q1);
        y[l + 64] = d * static_cast<float>(sc[s + 4]) * static_cast<float>(q2);
        y[l + 96] = d * static_cast<float>(sc[s + 6]) * static_cast<float>(q3);
      }
    }
  }
}

}  // namespace duet
