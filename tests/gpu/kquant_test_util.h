#pragma once
// K-quant test helpers: random super-blocks (every scale bit pattern, finite fp16 d/dmin), a
// dequantiser written from ggml's dequantize_row_q*_K independently of core's (the tests
// compare both), and the integer algorithm of matmul_kq_cpu.cl emulated on the host.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/base/fp16.h"
#include "core/model/dtype.h"

namespace duet::gpu::testing {

inline size_t kq_block_bytes(DType t) {
  return t == DType::Q4_K ? 144 : t == DType::Q5_K ? 176 : 210;
}

// rows x cols (a multiple of 256) random K-quant weights: random quant and scale bytes, d and
// dmin random fp16 in [0.002, 0.02) (about the size of a real model's).
inline std::vector<uint8_t> random_kq_weights(DType t, uint32_t rows, uint32_t cols,
                                              uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.002f, 0.02f);
  const size_t bb = kq_block_bytes(t), blocks = size_t{rows} * (cols / 256);
  std::vector<uint8_t> w(blocks * bb);
  for (auto& b : w) b = static_cast<uint8_t>(byte(rng));
  for (size_t i = 0; i < blocks; ++i) {
    uint8_t* p = w.data() + i * bb;
    const uint16_t d = fp32_to_fp16(scale(rng)), dmin = fp32_to_fp16(scale(rng));
    if (t == DType::Q6_K) {
      std::memcpy(p + 208, &d, 2);
    } else {
      std::memcpy(p, &d, 2);
      std::memcpy(p + 2, &dmin, 2);
    }
  }
  return w;
}

inline float kq_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_fp32(h);
}
// ggml's get_scale_min_k4.
inline void kq_scale_min(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}
// The unsigned quant (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63) of weight e (0..255) of a super-block.
inline int kq_quant(DType t, const uint8_t* p, int e) {
  const int j = e / 32, l = e % 32;
  if (t == DType::Q4_K) return (p[16 + 32 * (j / 2) + l] >> (4 * (j & 1))) & 15;
  if (t == DType::Q5_K)
    return ((p[48 + 32 * (j / 2) + l] >> (4 * (j & 1))) & 15) | (((p[16 + l] >> j) & 1) << 4);
  const int h = e / 128, c = (e % 128) / 32;  // Q6_K
  const uint8_t* ql = p + 64 * h + 32 * (c & 1);
  const uint8_t* qh = p + 128 + 32 * h;
  return ((ql[l] >> (4 * (c >> 1))) & 15) | (((qh[l] >> (2 * c)) & 3) << 4);
}
// One row of n weights as ggml dequantises it (d * sc as float, then * q - dmin * m).
inline void kq_dequantize(DType t, const uint8_t* row, float* out, uint32_t n) {
  const size_t bb = kq_block_bytes(t);
  for (uint32_t sb = 0; sb < n / 256; ++sb) {
    const uint8_t* p = row + sb * bb;
    for (int e = 0; e < 256; ++e) {
      const int q = kq_quant(t, p, e);
      if (t == DType::Q6_K) {
        const float d = kq_half(p + 208) * static_cast<int8_t>(p[192 + e / 16]);
        out[sb * 256 + e] = d * static_cast<float>(q - 32);
      } else {
        int sc, m;
        kq_scale_min(e / 32, p + 4, &sc, &m);
        const float d = kq_half(p) * static_cast<float>(sc),
                    mn = kq_half(p + 2) * static_cast<float>(m);
        out[sb * 256 + e] = d * static_cast<float>(q) - mn;
      }
    }
  }
}

// matmul_kq_cpu.cl's documented algorithm for one row and one token: activations quantised per
// 32 values (8 bits: d = amax / 127; 16: amax / 32512; q = round-half-even(x / d)), exact int
// dots per sub-block (Q6_K: per 16 values, minus 32 times the quant sum), one fma per term in
// sub-block order.
inline float kq_emulate(DType t, const uint8_t* row, const float* x, uint32_t k, int bits) {
  const size_t bb = kq_block_bytes(t);
  float acc = 0.0f;
  for (uint32_t sb = 0; sb < k / 256; ++sb) {
    const uint8_t* p = row + sb * bb;
    for (int j = 0; j < 8; ++j) {
      const float* xb = x + sb * 256 + 32 * j;
      float amax = 0.0f;
      for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
      const float dx = amax / (bits == 16 ? 32512.0f : 127.0f);
      const float id = dx != 0.0f ? 1.0f / dx : 0.0f;
      int32_t dot[2] = {0, 0}, sum[2] = {0, 0};
      for (int i = 0; i < 32; ++i) {
        const auto q = static_cast<int32_t>(std::nearbyint(xb[i] * id));
        dot[i / 16] += kq_quant(t, p, 32 * j + i) * q;
        sum[i / 16] += q;
      }
      if (t == DType::Q6_K) {
        const float d = kq_half(p + 208);
        for (int e = 0; e < 2; ++e) {
          const float s = d * static_cast<float>(static_cast<int8_t>(p[192 + 2 * j + e]));
          acc = std::fma(static_cast<float>(dot[e] - 32 * sum[e]), s * dx, acc);
        }
      } else {
        int sc, m;
        kq_scale_min(j, p + 4, &sc, &m);
        const float ws = kq_half(p) * static_cast<float>(sc),
                    wm = kq_half(p + 2) * static_cast<float>(m);
        acc = std::fma(static_cast<float>(dot[0] + dot[1]), ws * dx, acc);
        acc = std::fma(static_cast<float>(-(sum[0] + sum[1])), wm * dx, acc);
      }
    }
  }
  return acc;
}

}  // namespace duet::gpu::testing
