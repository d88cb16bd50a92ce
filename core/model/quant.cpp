#include "core/model/quant.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>

#include "core/base/error.h"
#include "core/base/fp16.h"

namespace duet {
namespace {

void check_blocks(DType type, int64_t n) {
  if (n < 0 || n % dtype_block_elems(type) != 0) {
    throw Error(Errc::invalid_argument, std::string(dtype_name(type)) + " row of " +
                                            std::to_string(n) +
                                            " elements is not a whole number of blocks");
  }
}

// The weight with the largest magnitude, sign kept (Q4_0/Q5_0 put it at the most negative code,
// which uses the asymmetric range [-8, 7] / [-16, 15] fully).
float signed_absmax(const float* x) {
  float amax = 0.0f;
  float max = 0.0f;
  for (int i = 0; i < kQK; ++i) {
    if (amax < std::fabs(x[i])) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  return max;
}

void quantize_q8_0(const float* src, BlockQ8_0* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* x = src + b * kQK;
    float amax = 0.0f;
    for (int i = 0; i < kQK; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    dst[b].d = fp32_to_fp16(d);
    for (int i = 0; i < kQK; ++i) dst[b].qs[i] = static_cast<int8_t>(std::roundf(x[i] * id));
  }
}

// Q4_0 (bits 4, offset 8) and Q5_0 (bits 5, offset 16): symmetric, scale from the signed max.
template <int Bits>
void quantize_symmetric(const float* x, uint16_t* d_out, uint8_t* qs, uint8_t* qh_out) {
  constexpr int kOffset = 1 << (Bits - 1);
  constexpr int kMax = (1 << Bits) - 1;
  const float d = signed_absmax(x) / -static_cast<float>(kOffset);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  *d_out = fp32_to_fp16(d);
  uint32_t qh = 0;
  for (int j = 0; j < kQK / 2; ++j) {
    const int q0 = std::min(kMax, static_cast<int>(x[j] * id + (kOffset + 0.5f)));
    const int q1 = std::min(kMax, static_cast<int>(x[j + kQK / 2] * id + (kOffset + 0.5f)));
    qs[j] = static_cast<uint8_t>((q0 & 15) | (q1 & 15) << 4);
    qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
    qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + kQK / 2);
  }
  if (qh_out) std::memcpy(qh_out, &qh, sizeof qh);
}

// Q4_1 (bits 4) and Q5_1 (bits 5): the block's range [min, max] in 2^bits - 1 steps.
template <int Bits>
void quantize_affine(const float* x, uint16_t* d_out, uint16_t* m_out, uint8_t* qs,
                     uint8_t* qh_out) {
  constexpr int kMax = (1 << Bits) - 1;
  float min = FLT_MAX;
  float max = -FLT_MAX;
  for (int i = 0; i < kQK; ++i) {
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
  }
  const float d = (max - min) / kMax;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  *d_out = fp32_to_fp16(d);
  *m_out = fp32_to_fp16(min);
  uint32_t qh = 0;
  for (int j = 0; j < kQK / 2; ++j) {
    const int q0 = std::min(kMax, static_cast<int>((x[j] - min) * id + 0.5f));
    const int q1 = std::min(kMax, static_cast<int>((x[j + kQK / 2] - min) * id + 0.5f));
    qs[j] = static_cast<uint8_t>((q0 & 15) | (q1 & 15) << 4);
    qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
    qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + kQK / 2);
  }
  if (qh_out) std::memcpy(qh_out, &qh, sizeof qh);
}

// Weight j (0..31) of a 32-block: its nibble, plus bit 4 from qh when the type has one.
inline int nibble(const uint8_t* qs, int j) {
  return j < kQK / 2 ? qs[j] & 15 : qs[j - kQK / 2] >> 4;
}
inline int high_bit(const uint8_t* qh, int j) {
  uint32_t bits;
  std::memcpy(&bits, qh, sizeof bits);
  return static_cast<int>((bits >> j) & 1u) << 4;
}

template <class Block, class Decode>
void dequantize_blocks(const void* src, float* dst, int64_t n, Decode decode) {
  const auto* blocks = static_cast<const Block*>(src);
  for (int64_t b = 0; b < n / kQK; ++b)
    for (int j = 0; j < kQK; ++j) dst[b * kQK + j] = decode(blocks[b], j);
}

}  // namespace

std::vector<size_t> block_scale_offsets(DType type) {
  switch (type) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
      return {};
    case DType::Q4_0:
    case DType::Q5_0:
    case DType::Q8_0:
      return {0};
    case DType::Q4_1:
    case DType::Q5_1:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::E0M4:
      return {0, 2};
    case DType::Q6_K:
      return {offsetof(BlockQ6_K, d)};
  }
  throw Error(Errc::unsupported, "block_scale_offsets: unknown dtype");
}

int64_t first_nonfinite_scale(DType type, const void* blocks, int64_t n_blocks) {
  const std::vector<size_t> offsets = block_scale_offsets(type);
  if (offsets.empty()) return -1;
  const size_t block_bytes = dtype_block_bytes(type);
  const auto* base = static_cast<const uint8_t*>(blocks);
  for (int64_t b = 0; b < n_blocks; ++b)
    for (size_t off : offsets) {
      uint16_t h;
      std::memcpy(&h, base + static_cast<size_t>(b) * block_bytes + off, sizeof h);
      if ((h & 0x7c00u) == 0x7c00u) return b;  // exponent all ones: Inf or NaN
    }
  return -1;
}

void dequantize_row(DType type, const void* src, float* dst, int64_t n) {
  check_blocks(type, n);
  switch (type) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::F16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
      return;
    }
    case DType::BF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(h[i]);
      return;
    }
    case DType::Q8_0:
      return dequantize_blocks<BlockQ8_0>(src, dst, n, [](const BlockQ8_0& b, int j) {
        return fp16_to_fp32(b.d) * static_cast<float>(b.qs[j]);
      });
    case DType::Q4_0:
      return dequantize_blocks<BlockQ4_0>(src, dst, n, [](const BlockQ4_0& b, int j) {
        return fp16_to_fp32(b.d) * static_cast<float>(nibble(b.qs, j) - 8);
      });
    case DType::Q4_1:
      return dequantize_blocks<BlockQ4_1>(src, dst, n, [](const BlockQ4_1& b, int j) {
        return fp16_to_fp32(b.d) * static_cast<float>(nibble(b.qs, j)) + fp16_to_fp32(b.m);
      });
    case DType::Q5_0:
      return dequantize_blocks<BlockQ5_0>(src, dst, n, [](const BlockQ5_0& b, int j) {
        return fp16_to_fp32(b.d) * static_cast<float>((nibble(b.qs, j) | high_bit(b.qh, j)) - 16);
      });
    case DType::Q5_1:
      return dequantize_blocks<BlockQ5_1>(src, dst, n, [](const BlockQ5_1& b, int j) {
        return fp16_to_fp32(b.d) * static_cast<float>(nibble(b.qs, j) | high_bit(b.qh, j)) +
               fp16_to_fp32(b.m);
      });
    case DType::Q4_K:
      return dequantize_row_q4_k(static_cast<const BlockQ4_K*>(src), dst, n);
    case DType::Q5_K:
      return dequantize_row_q5_k(static_cast<const BlockQ5_K*>(src), dst, n);
    case DType::Q6_K:
      return dequantize_row_q6_k(static_cast<const BlockQ6_K*>(src), dst, n);
    case DType::E0M4:
      return dequantize_row_e0m4(static_cast<const BlockE0M4*>(src), dst, n);
  }
  throw Error(Errc::unsupported, "dequantize_row: unknown dtype");
}

void quantize_row(DType type, const float* src, void* dst, int64_t n) {
  check_blocks(type, n);
  switch (type) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::F16: {
      auto* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_fp16(src[i]);
      return;
    }
    case DType::BF16: {
      auto* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_bf16(src[i]);
      return;
    }
    case DType::Q8_0:
      return quantize_q8_0(src, static_cast<BlockQ8_0*>(dst), n);
    case DType::Q4_0:
      for (int64_t b = 0; b < n / kQK; ++b) {
        auto& y = static_cast<BlockQ4_0*>(dst)[b];
        quantize_symmetric<4>(src + b * kQK, &y.d, y.qs, nullptr);
      }
      return;
    case DType::Q5_0:
      for (int64_t b = 0; b < n / kQK; ++b) {
        auto& y = static_cast<BlockQ5_0*>(dst)[b];
        quantize_symmetric<5>(src + b * kQK, &y.d, y.qs, y.qh);
      }
      return;
    case DType::Q4_1:
      for (int64_t b = 0; b < n / kQK; ++b) {
        auto& y = static_cast<BlockQ4_1*>(dst)[b];
        quantize_affine<4>(src + b * kQK, &y.d, &y.m, y.qs, nullptr);
      }
      return;
    case DType::Q5_1:
      for (int64_t b = 0; b < n / kQK; ++b) {
        auto& y = static_cast<BlockQ5_1*>(dst)[b];
        quantize_affine<5>(src + b * kQK, &y.d, &y.m, y.qs, y.qh);
      }
      return;
    case DType::Q4_K:
      return quantize_row_q4_k(src, static_cast<BlockQ4_K*>(dst), n);
    case DType::Q5_K:
      return quantize_row_q5_k(src, static_cast<BlockQ5_K*>(dst), n);
    case DType::Q6_K:
      return quantize_row_q6_k(src, static_cast<BlockQ6_K*>(dst), n);
    case DType::E0M4:
      return quantize_row_e0m4(src, static_cast<BlockE0M4*>(dst), n);
  }
  throw Error(Errc::unsupported, "quantize_row: unknown dtype");
}

}  // namespace duet
