// Quantised blocks are llama.cpp's byte layouts; these pin the layouts and the quantisers.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/base/error.h"
#include "core/base/fp16.h"
#include "core/model/quant.h"

namespace duet {
namespace {

TEST(Dtype, SizesMatchGgml) {
  EXPECT_EQ(dtype_block_bytes(DType::Q4_0), 18u);
  EXPECT_EQ(dtype_block_bytes(DType::Q8_0), 34u);
  EXPECT_EQ(dtype_row_bytes(DType::Q4_0, 4096), 4096u / 32 * 18);
  EXPECT_EQ(dtype_row_bytes(DType::F16, 5), 10u);
  EXPECT_TRUE(dtype_known(8));
  EXPECT_TRUE(dtype_known(3));    // Q4_1
  EXPECT_FALSE(dtype_known(10));  // Q2_K is a GGML type duet does not read
  EXPECT_THROW(dtype_row_bytes(DType::Q8_0, 33), Error);
}

TEST(Quant, Q4_0LowNibblesAreTheFirstHalfOfTheBlock) {
  BlockQ4_0 block{};
  block.d = fp32_to_fp16(0.5f);
  for (int j = 0; j < 16; ++j) block.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float out[32];
  dequantize_row(DType::Q4_0, &block, out, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 0.5f * (j - 8));
    EXPECT_EQ(out[j + 16], 0.5f * (7 - j));
  }
}

TEST(Quant, Q4_0QuantiserMapsTheLargestMagnitudeToMinusEight) {
  std::vector<float> x(32, 0.0f);
  x[5] = -4.0f;  // largest |x|, so d = -4 / -8 = 0.5 and x[5] -> q 0
  x[20] = 1.0f;  // 1 / 0.5 + 8.5 -> q 10
  BlockQ4_0 block;
  quantize_row(DType::Q4_0, x.data(), &block, 32);
  EXPECT_EQ(fp16_to_fp32(block.d), 0.5f);
  EXPECT_EQ(block.qs[5] & 0x0f, 0);
  EXPECT_EQ(block.qs[4] >> 4, 10);
  EXPECT_EQ(block.qs[0] & 0x0f, 8);
}

TEST(Quant, Q8_0RoundTripErrorIsAtMostHalfAStep) {
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[i] = std::sin(i * 0.7f) * (i < 32 ? 1.0f : 100.0f);
  std::vector<BlockQ8_0> blocks(2);
  quantize_row(DType::Q8_0, x.data(), blocks.data(), 64);
  std::vector<float> back(64);
  dequantize_row(DType::Q8_0, blocks.data(), back.data(), 64);
  for (int b = 0; b < 2; ++b) {
    const float d = fp16_to_fp32(blocks[b].d);
    for (int i = 0; i < 32; ++i)
      EXPECT_LE(std::fabs(back[b * 32 + i] - x[b * 32 + i]), d * 0.51f + 1e-6f);
  }
}

TEST(Quant, F16RoundTripIsExactForHalfValues) {
  const std::vector<float> x = {0.0f, -1.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f};
  std::vector<uint16_t> h(x.size());
  std::vector<float> back(x.size());
  quantize_row(DType::F16, x.data(), h.data(), static_cast<int64_t>(x.size()));
  dequantize_row(DType::F16, h.data(), back.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(back, x);
}

}  // namespace
}  // namespace duet
