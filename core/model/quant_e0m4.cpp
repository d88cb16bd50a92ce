#include "core/model/quant_e0m4.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/base/fp16.h"

namespace duet {
namespace {

// fp16 2.0: sign 0, exponent 16 (biased), fraction 0. The code is the fraction's top 4 bits.
constexpr uint16_t kExpBits = 0x4000;
constexpr int kCodeShift = 6;  // 10 fraction bits - 4 code bits

// The paper's dequantisation: shift, OR, reinterpret.
float e0m4_w1(int code) {
  return fp16_to_fp32(static_cast<uint16_t>(kExpBits | code << kCodeShift));
}

// The paper's quantisation of one w1 in [2, 4): the fp32 fraction's top 4 bits (22..19), plus
// the next bit (18) to round, saturating at 15.
int e0m4_code_of(float w1) {
  w1 = std::clamp(w1, 2.0f, std::nextafter(4.0f, 0.0f));
  uint32_t bits;
  std::memcpy(&bits, &w1, sizeof bits);
  const int y1 = static_cast<int>((bits >> 19) & 15u);
  const int y2 = static_cast<int>((bits >> 18) & 1u);
  return std::min(y1 + y2, 15);
}

void quantize_group(const float* x, BlockE0M4* y) {
  float mn = x[0], mx = x[0];
  for (int64_t i = 1; i < kE0M4Group; ++i) {
    mn = std::min(mn, x[i]);
    mx = std::max(mx, x[i]);
  }
  std::memset(y->qs, 0, sizeof y->qs);
  y->d = fp32_to_fp16((mx - mn) / 1.875f);
  const float d = fp16_to_fp32(y->d);
  if (d == 0.0f) {  // constant (or near-constant) group: every weight is m
    y->m = fp32_to_fp16(0.5f * (mn + mx));
    return;
  }
  if (mn < 0.0f && mx > 0.0f) {
    // The bias (w1 of the weight 0) rounded to a code: zero's low fraction bits cleared.
    const float bias = 2.0f + static_cast<float>(e0m4_code_of(2.0f - mn / d)) / 8.0f;
    y->m = fp32_to_fp16(-bias * d);
  } else {
    y->m = fp32_to_fp16(mn - 2.0f * d);
  }
  const float m = fp16_to_fp32(y->m);
  for (int i = 0; i < kE0M4Group; ++i) {
    const int c = e0m4_code_of((x[i] - m) / d);
    const int s = i / 32, j = i % 32;
    y->qs[16 * s + j % 16] |= static_cast<uint8_t>(j < 16 ? c : c << 4);
  }
}

}  // namespace

void quantize_row_e0m4(const float* src, BlockE0M4* dst, int64_t n) {
  for (int64_t b = 0; b < n / kE0M4Group; ++b) quantize_group(src + b * kE0M4Group, dst + b);
}

void dequantize_row_e0m4(const BlockE0M4* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kE0M4Group; ++b) {
    const float d = fp16_to_fp32(src[b].d), m = fp16_to_fp32(src[b].m);
    for (int i = 0; i < kE0M4Group; ++i)
      dst[b * kE0M4Group + i] = std::fma(d, e0m4_w1(e0m4_code(src[b], i)), m);
  }
}

}  // namespace duet
