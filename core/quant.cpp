#include "core/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/fp16.h"

namespace duet {
namespace {

void check_blocks(DType type, int64_t n) {
  if (n < 0 || n % dtype_block_elems(type) != 0) {
    throw Error(Errc::invalid_argument, std::string(dtype_name(type)) + " row of " +
                                            std::to_string(n) +
                                            " elements is not a whole number of blocks");
  }
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

void quantize_q4_0(const float* src, BlockQ4_0* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* x = src + b * kQK;
    float amax = 0.0f;
    float max = 0.0f;
    for (int i = 0; i < kQK; ++i) {
      if (amax < std::fabs(x[i])) {
        amax = std::fabs(x[i]);
        max = x[i];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    dst[b].d = fp32_to_fp16(d);
    for (int j = 0; j < kQK / 2; ++j) {
      const float x0 = x[j] * id;
      const float x1 = x[j + kQK / 2] * id;
      const uint8_t q0 = static_cast<uint8_t>(std::min(15, static_cast<int>(x0 + 8.5f)));
      const uint8_t q1 = static_cast<uint8_t>(std::min(15, static_cast<int>(x1 + 8.5f)));
      dst[b].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

}  // namespace

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
    case DType::Q8_0: {
      const auto* blocks = static_cast<const BlockQ8_0*>(src);
      for (int64_t b = 0; b < n / kQK; ++b) {
        const float d = fp16_to_fp32(blocks[b].d);
        for (int i = 0; i < kQK; ++i) dst[b * kQK + i] = d * static_cast<float>(blocks[b].qs[i]);
      }
      return;
    }
    case DType::Q4_0: {
      const auto* blocks = static_cast<const BlockQ4_0*>(src);
      for (int64_t b = 0; b < n / kQK; ++b) {
        const float d = fp16_to_fp32(blocks[b].d);
        for (int j = 0; j < kQK / 2; ++j) {
          dst[b * kQK + j] = d * static_cast<float>((blocks[b].qs[j] & 0x0f) - 8);
          dst[b * kQK + j + kQK / 2] = d * static_cast<float>((blocks[b].qs[j] >> 4) - 8);
        }
      }
      return;
    }
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
    case DType::Q8_0:
      quantize_q8_0(src, static_cast<BlockQ8_0*>(dst), n);
      return;
    case DType::Q4_0:
      quantize_q4_0(src, static_cast<BlockQ4_0*>(dst), n);
      return;
  }
  throw Error(Errc::unsupported, "quantize_row: unknown dtype");
}

}  // namespace duet
