#pragma once
// Quantised weight blocks, byte-for-byte llama.cpp's (ggml-common.h), because GGUF files store
// them this way. A row of n weights is n/32 consecutive blocks; a block never spans two rows.
//
// Q8_0: 34 bytes per 32 weights.
//   d  : fp16 scale
//   qs : 32 x int8
//   weight[i] = d * qs[i]
//
// Q4_0: 18 bytes per 32 weights.
//   d  : fp16 scale
//   qs : 16 bytes; byte j holds weight j in its low nibble and weight j+16 in its high nibble
//   weight[i] = d * (nibble(i) - 8)
//
// Quantising (for mkmodel and tests), as llama.cpp's reference quantizers:
//   Q8_0: d = max|x| / 127, q = round(x / d)
//   Q4_0: take x_m with the largest |x| (sign kept), d = x_m / -8, q = min(15, (int)(x/d + 8.5))
#include <cstdint>

#include "core/dtype.h"

namespace duet {

struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
static_assert(sizeof(BlockQ8_0) == 34);

struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);

// Dequantise n elements (a multiple of the block size for Q types) of `type` to float.
void dequantize_row(DType type, const void* src, float* dst, int64_t n);
// Quantise n floats (n a multiple of 32 for Q types) into `type`'s layout.
void quantize_row(DType type, const float* src, void* dst, int64_t n);

}  // namespace duet
