// The K quantisers' error against plain round-to-nearest (RTN) in the same format: the scale
// search (core/model/quant_k.h) must never lose to the obvious quantiser on the same weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "core/base/fp16.h"
#include "core/model/quant.h"

namespace duet {
namespace {

// Weight-like rows: mostly N(0, 0.02) with a 2% tail of 5x larger values (the outliers that make
// a max-based scale waste levels), 64 rows of 2048.
std::vector<float> weights(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> body(0.0f, 0.02f), tail(0.0f, 0.1f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> x(64 * 2048);
  for (float& v : x) v = u(rng) < 0.02f ? tail(rng) : body(rng);
  return x;
}

double rmse(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(s / static_cast<double>(a.size()));
}

int nearest(float v) {
  return static_cast<int>(std::nearbyint(v));
}

// 6-bit scales and mins packed as the format stores them (core/model/quant_k.h).
void pack_scales(const int sc[8], const int mn[8], uint8_t out[12]) {
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>((sc[j] & 63) | (sc[j + 4] >> 4) << 6);
    out[j + 4] = static_cast<uint8_t>((mn[j] & 63) | (mn[j + 4] >> 4) << 6);
    out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
  }
}

// RTN for Q4_K/Q5_K: each 32-weight sub-block's range [min(x, 0), max x] in nmax equal steps,
// the scales and mins rounded to 6 bits against their largest, then the weights rounded with
// the stored scales. Writes levels L (0..nmax) and the block's header.
void rtn_k(const float* x, int nmax, uint16_t* d, uint16_t* dmin, uint8_t scales[12],
           uint8_t L[256]) {
  float sc[8], mn[8], max_sc = 0, max_mn = 0;
  for (int j = 0; j < 8; ++j) {
    float lo = 0, hi = x[32 * j];
    for (int l = 0; l < 32; ++l) {
      lo = std::min(lo, x[32 * j + l]);
      hi = std::max(hi, x[32 * j + l]);
    }
    sc[j] = (hi - lo) / static_cast<float>(nmax);
    mn[j] = -lo;
    max_sc = std::max(max_sc, sc[j]);
    max_mn = std::max(max_mn, mn[j]);
  }
  int isc[8], imn[8];
  for (int j = 0; j < 8; ++j) {
    isc[j] = max_sc > 0 ? std::min(63, nearest(63 * sc[j] / max_sc)) : 0;
    imn[j] = max_mn > 0 ? std::min(63, nearest(63 * mn[j] / max_mn)) : 0;
  }
  pack_scales(isc, imn, scales);
  *d = fp32_to_fp16(max_sc / 63);
  *dmin = fp32_to_fp16(max_mn / 63);
  for (int j = 0; j < 8; ++j) {
    const float ds = fp16_to_fp32(*d) * static_cast<float>(isc[j]);
    const float dm = fp16_to_fp32(*dmin) * static_cast<float>(imn[j]);
    for (int l = 0; l < 32; ++l)
      L[32 * j + l] = static_cast<uint8_t>(
          ds > 0 ? std::clamp(nearest((x[32 * j + l] + dm) / ds), 0, nmax) : 0);
  }
}

void rtn_q4_k(const float* x, BlockQ4_K* y) {
  uint8_t L[256];
  rtn_k(x, 15, &y->d, &y->dmin, y->scales, L);
  for (int g = 0; g < 4; ++g)
    for (int l = 0; l < 32; ++l)
      y->qs[32 * g + l] = static_cast<uint8_t>(L[64 * g + l] | L[64 * g + 32 + l] << 4);
}

void rtn_q5_k(const float* x, BlockQ5_K* y) {
  uint8_t L[256];
  rtn_k(x, 31, &y->d, &y->dmin, y->scales, L);
  for (int l = 0; l < 32; ++l) y->qh[l] = 0;
  for (int g = 0; g < 4; ++g)
    for (int l = 0; l < 32; ++l) {
      const int lo = L[64 * g + l], hi = L[64 * g + 32 + l];
      y->qs[32 * g + l] = static_cast<uint8_t>((lo & 15) | (hi & 15) << 4);
      y->qh[l] |= static_cast<uint8_t>((lo >> 4) << (2 * g) | (hi >> 4) << (2 * g + 1));
    }
}

// RTN for Q6_K: each 16-weight sub-block symmetric, scale max|x| / 31 (levels -31..31), the
// scales rounded to int8 against their largest (d = max / 127).
void rtn_q6_k(const float* x, BlockQ6_K* y) {
  float sc[16], max_sc = 0;
  for (int j = 0; j < 16; ++j) {
    float amax = 0;
    for (int l = 0; l < 16; ++l) amax = std::max(amax, std::fabs(x[16 * j + l]));
    sc[j] = amax / 31;
    max_sc = std::max(max_sc, sc[j]);
  }
  y->d = fp32_to_fp16(max_sc / 127);
  uint8_t L[256];
  for (int j = 0; j < 16; ++j) {
    y->scales[j] = static_cast<int8_t>(max_sc > 0 ? nearest(127 * sc[j] / max_sc) : 0);
    const float ds = fp16_to_fp32(y->d) * y->scales[j];
    for (int l = 0; l < 16; ++l)
      L[16 * j + l] = static_cast<uint8_t>(
          (ds > 0 ? std::clamp(nearest(x[16 * j + l] / ds), -32, 31) : 0) + 32);
  }
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 32; ++l) {
      const uint8_t* Lh = L + 128 * h;
      y->ql[64 * h + l] = static_cast<uint8_t>((Lh[l] & 15) | (Lh[l + 64] & 15) << 4);
      y->ql[64 * h + l + 32] = static_cast<uint8_t>((Lh[l + 32] & 15) | (Lh[l + 96] & 15) << 4);
      y->qh[32 * h + l] = static_cast<uint8_t>((Lh[l] >> 4) | (Lh[l + 32] >> 4) << 2 |
                                               (Lh[l + 64] >> 4) << 4 | (Lh[l + 96] >> 4) << 6);
    }
}

template <class Block, class Rtn>
void expect_no_worse_than_rtn(DType type, Rtn rtn) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    const std::vector<float> x = weights(seed);
    const int64_t n = static_cast<int64_t>(x.size());
    std::vector<Block> ours(static_cast<size_t>(n / 256)), plain(ours.size());
    quantize_row(type, x.data(), ours.data(), n);
    for (size_t b = 0; b < plain.size(); ++b) rtn(x.data() + 256 * b, &plain[b]);
    std::vector<float> back_ours(x.size()), back_plain(x.size());
    dequantize_row(type, ours.data(), back_ours.data(), n);
    dequantize_row(type, plain.data(), back_plain.data(), n);
    const double e_ours = rmse(x, back_ours), e_rtn = rmse(x, back_plain);
    std::printf("%s seed %u: RMSE %.4g (RTN %.4g, %.1f%% lower)\n",
                std::string(dtype_name(type)).c_str(), seed, e_ours, e_rtn,
                100.0 * (1.0 - e_ours / e_rtn));
    EXPECT_LE(e_ours, e_rtn) << dtype_name(type) << " seed " << seed;
  }
}

TEST(QuantK, Q4_KSearchIsNoWorseThanRoundToNearest) {
  expect_no_worse_than_rtn<BlockQ4_K>(DType::Q4_K, rtn_q4_k);
}
TEST(QuantK, Q5_KSearchIsNoWorseThanRoundToNearest) {
  expect_no_worse_than_rtn<BlockQ5_K>(DType::Q5_K, rtn_q5_k);
}
TEST(QuantK, Q6_KSearchIsNoWorseThanRoundToNearest) {
  expect_no_worse_than_rtn<BlockQ6_K>(DType::Q6_K, rtn_q6_k);
}

TEST(QuantK, AllZeroSuperBlocksDecodeToZero) {
  const std::vector<float> x(256, 0.0f);
  for (DType type : {DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    std::vector<uint8_t> q(dtype_block_bytes(type));
    quantize_row(type, x.data(), q.data(), 256);
    std::vector<float> back(256, 1.0f);
    dequantize_row(type, q.data(), back.data(), 256);
    EXPECT_EQ(back, x) << dtype_name(type);
    EXPECT_EQ(first_nonfinite_scale(type, q.data(), 1), -1);
  }
}

}  // namespace
}  // namespace duet
