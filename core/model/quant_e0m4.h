#pragma once
// E0M4: Transformer-Lite's FP4 weights (§2.3 of ../shared/seeds/transformer-lite.txt). duet's own
// tensor type, not ggml's: its GGUF type id (DType::E0M4 = 1024) is far outside ggml's range, so
// a reader that does not know it (llama.cpp) refuses the file ("invalid ggml type") instead of
// misreading it. `duet quantize --type e0m4` is the only writer.
//
// A group of kE0M4Group = 128 weights w0 is mapped affinely onto w1 in [2, 4): every w1 then has
// fp16 2.0's sign and exponent (0x4000), and only the fraction differs. A weight's 4-bit code is
// the top 4 of w1's 10 fraction bits, rounded by the next bit: y1 = min(y1 + y2, 15). So the
// code c dequantises by a shift and an OR, with no int -> float conversion:
//   w1 = as_half(0x4000 | c << 6)            (= 2 + c/8)
// and the weight by one multiply-add with the group's two fp16 coefficients:
//   w0 = d * w1 + m
//
// BlockE0M4, 68 bytes per 128 weights (4.25 bits a weight):
//   d  : fp16, weight units per unit of w1 (the inverse of the paper's scale)
//   m  : fp16, the weight at w1 = 0 (-bias * d, the paper's bias in weight units)
//   qs : 64 bytes, four sub-blocks of 32 weights in Q4_0's order: byte 16s + j holds weight
//        32s + j in its low nibble and weight 32s + j + 16 in its high nibble
// d * w1 is exact in fp32 (11 x 5 significant bits), so every implementation that computes
// d * w1 + m in fp32, fused or not, gets the same bits.
//
// Quantising a group (quantize_row), with mn, mx its smallest and largest weight:
//   d = fp16((mx - mn) / 1.875): the range spans the 16 codes [2, 3.875] (the paper's
//     [2^n, 2^(n+1) - eps] with n = 1 and eps one code step, so mx lands on code 15);
//   when mn < 0 < mx, the bias b = 2 - mn / d (w1 of the weight 0) has its fraction bits below
//     the code's zeroed (rounded to a code, as the paper says) so that 0 is a code exactly, and
//     m = fp16(-b * d); otherwise m = fp16(mn - 2 d);
//   each weight's w1 = (w0 - m) / d is clamped into [2, 4) (bias rounding moves the ends by at
//     most half a step) and its fp32 fraction bits 22..19 (y1) and 18 (y2) give the code.
//   A constant group (d rounds to 0) stores m = the weight and codes 0.
#include <cstdint>

namespace duet {

constexpr int64_t kE0M4Group = 128;

struct BlockE0M4 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kE0M4Group / 2];
};
static_assert(sizeof(BlockE0M4) == 68);

// n (a multiple of 128) weights to n / 128 blocks, and back.
void quantize_row_e0m4(const float* src, BlockE0M4* dst, int64_t n);
void dequantize_row_e0m4(const BlockE0M4* src, float* dst, int64_t n);

// The 4-bit code of weight i (0..127) of a block.
inline int e0m4_code(const BlockE0M4& b, int i) {
  const int s = i / 32, j = i % 32;
  const uint8_t byte = b.qs[16 * s + (j % 16)];
  return j < 16 ? byte & 0x0f : byte >> 4;
}

}  // namespace duet
