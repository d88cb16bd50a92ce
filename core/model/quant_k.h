#pragma once
// K-quant super-blocks, byte-for-byte llama.cpp's (ggml-common.h). A super-block covers
// kQK_K = 256 weights of one row, so a K-quant row's length must be a multiple of 256.
//
// Q4_K: 144 bytes per 256 weights (4.5 bits per weight). Eight sub-blocks of 32 weights, each
// with a 6-bit scale sc[j] and a 6-bit minimum mn[j], themselves scaled by two fp16 values:
//   d, dmin : fp16 super-scales
//   scales  : 12 bytes holding sc[0..7] and mn[0..7], 6 bits each (see below)
//   qs      : 128 bytes; 64-weight group g (g = 0..3) uses qs[32g .. 32g+31]: weight 64g + l is
//             the low nibble of qs[32g + l] (sub-block 2g), weight 64g + 32 + l the high nibble
//             (sub-block 2g + 1), l = 0..31
//   weight  = d * sc[j] * q - dmin * mn[j]        (j = the weight's sub-block, q in 0..15)
// The 6-bit packing of scales[12] (ggml's get_scale_min_k4):
//   j < 4 : sc[j] = scales[j] & 63                mn[j] = scales[j + 4] & 63
//   j >= 4: sc[j] = (scales[j + 4] & 15) | (scales[j - 4] >> 6) << 4
//           mn[j] = (scales[j + 4] >> 4) | (scales[j] >> 6) << 4
// i.e. bytes 0..3 hold sc[0..3] in their low 6 bits, bytes 4..7 mn[0..3]; bytes 8..11 hold the
// low 4 bits of sc[4..7] (low nibble) and mn[4..7] (high nibble), whose top 2 bits sit in the
// top 2 bits of bytes 0..3 (sc) and 4..7 (mn).
//
// Q5_K: 176 bytes per 256 weights (5.5 bits per weight). Q4_K plus a fifth bit per weight:
//   d, dmin, scales : as Q4_K
//   qh      : 32 bytes; weight 64g + l has its bit 4 in bit 2g of qh[l], weight 64g + 32 + l in
//             bit 2g + 1 of qh[l] (g = 0..3, l = 0..31)
//   qs      : low 4 bits, laid out as Q4_K's
//   weight  = d * sc[j] * q - dmin * mn[j]        (q in 0..31)
//
// Q6_K: 210 bytes per 256 weights (6.5625 bits per weight). Sixteen sub-blocks of 16 weights
// with signed 8-bit scales and no minimum:
//   ql      : 128 bytes, low 4 bits
//   qh      : 64 bytes, high 2 bits
//   scales  : 16 x int8, sub-block j covers weights 16j .. 16j+15
//   d       : fp16 super-scale (last, unlike the other types)
//   Each 128-weight half h (h = 0, 1) uses ql[64h ..], qh[32h ..]; for l = 0..31 with
//   L = ql + 64h, H = qh + 32h, the weights 128h + l + 32k (k = 0..3) are
//     k = 0: (L[l]      & 15) | ((H[l] >> 0) & 3) << 4
//     k = 1: (L[l + 32] & 15) | ((H[l] >> 2) & 3) << 4
//     k = 2: (L[l]      >> 4) | ((H[l] >> 4) & 3) << 4
//     k = 3: (L[l + 32] >> 4) | ((H[l] >> 6) & 3) << 4
//   weight  = d * scales[j] * (q - 32)            (q in 0..63)
//
// Quantising reproduces llama.cpp's reference quantizers (quantize_row_q*_K_ref, what
// llama-quantize runs without an importance matrix) byte for byte (tests/core/
// test_quant_ggml.cpp, against ggml itself): per sub-block a
// scale/min search minimising the squared error (Q4_K/Q5_K: a weighted least-squares fit over a
// sweep of candidate scales, as make_qkx2_quants; Q6_K: an RMS-weighted search around max/-32,
// as make_qx_quants), then the sub-block scales are themselves quantised to 6 (Q4_K/Q5_K) or 8
// (Q6_K) bits against the super-scale, and the weights re-rounded with the final scales.
#include <cstdint>

#include "core/model/dtype.h"

namespace duet {

constexpr int kKScaleBytes = 12;

struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ4_K) == 144);

struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ5_K) == 176);

struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210);

// Sub-block j's (0..7) 6-bit scale and minimum from a Q4_K/Q5_K scales[12].
inline void k_scale_min(int j, const uint8_t* scales, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *mn = scales[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((scales[j + 4] & 15) | ((scales[j - 4] >> 6) << 4));
    *mn = static_cast<uint8_t>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

// Quantise one row into K super-blocks (n a multiple of 256). Called by quantize_row.
void quantize_row_q4_k(const float* x, BlockQ4_K* y, int64_t n);
void quantize_row_q5_k(const float* x, BlockQ5_K* y, int64_t n);
void quantize_row_q6_k(const float* x, BlockQ6_K* y, int64_t n);
void dequantize_row_q4_k(const BlockQ4_K* x, float* y, int64_t n);
void dequantize_row_q5_k(const BlockQ5_K* x, float* y, int64_t n);
void dequantize_row_q6_k(const BlockQ6_K* x, float* y, int64_t n);

}  // namespace duet
