#pragma once
// Quantised weight blocks, byte-for-byte llama.cpp's (ggml-common.h), because GGUF files store
// them this way. A row of n weights is n/32 consecutive blocks (n/256 super-blocks for the K
// types, core/model/quant_k.h); a block never spans two rows. All scales are IEEE fp16.
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
// Q4_1: 20 bytes per 32 weights. As Q4_0 with an offset instead of the -8:
//   d, m : fp16 scale and minimum
//   qs   : nibbles as Q4_0
//   weight[i] = d * nibble(i) + m
//
// Q5_0: 22 bytes per 32 weights. Q4_0's nibbles plus a fifth bit per weight:
//   d  : fp16 scale
//   qh : 4 bytes read as a little-endian uint32; bit i is weight i's bit 4
//   qs : nibbles as Q4_0 (bits 0..3)
//   weight[i] = d * ((nibble(i) | bit(qh, i) << 4) - 16)
//
// Q5_1: 24 bytes per 32 weights. Q5_0's 5-bit values with Q4_1's offset:
//   d, m : fp16 scale and minimum
//   qh, qs as Q5_0
//   weight[i] = d * (nibble(i) | bit(qh, i) << 4) + m
//
// BF16: the upper 16 bits of an fp32 (no block). Quantising rounds to nearest even; a NaN stays
//   a (quiet) NaN.
//
// E0M4: duet's FP4 type (128 weights per block), documented in core/quant_e0m4.h.
//
// Quantising (for mkmodel, `duet quantize` and tests), as llama.cpp's reference quantizers:
//   Q8_0: d = max|x| / 127, q = round(x / d)
//   Q4_0: take x_m with the largest |x| (sign kept), d = x_m / -8, q = min(15, (int)(x/d + 8.5))
//   Q5_0: likewise with d = x_m / -16, q = min(31, (int)(x/d + 16.5))
//   Q4_1: d = (max - min) / 15, m = min, q = min(15, (int)((x - min)/d + 0.5))
//   Q5_1: likewise with 31
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/model/dtype.h"

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

struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_1) == 20);

struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ5_0) == 22);

struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ5_1) == 24);

// Byte offsets of a block's fp16 scales (d, and m/dmin where the type has one) within the block
// (ggml-common.h); empty for F32/F16/BF16.
std::vector<size_t> block_scale_offsets(DType type);

// The first of n_blocks consecutive blocks of `type` with a scale (or min) that is not finite
// (NaN or Inf, which would poison every dot product with its row), or -1 when all are finite
// (always for F32/F16/BF16, which have none). LlamaModel::load checks every matrix with it.
int64_t first_nonfinite_scale(DType type, const void* blocks, int64_t n_blocks);

// Dequantise n elements (a multiple of the block size for Q types) of `type` to float.
void dequantize_row(DType type, const void* src, float* dst, int64_t n);
// Quantise n floats (n a multiple of the block size for Q types) into `type`'s layout. The K
// types search scales as llama.cpp's reference quantizers do (core/model/quant_k.h).
void quantize_row(DType type, const float* src, void* dst, int64_t n);

}  // namespace duet

#include "core/model/quant_e0m4.h"  // IWYU pragma: export
#include "core/model/quant_k.h"     // IWYU pragma: export
#include "core/model/quant_k.h"     // IWYU pragma: export
