// Each format's dequantiser against the format written as a plain per-weight formula (the
// ggml-common.h layout, weight index -> bytes), on blocks whose every byte is random: a layout
// mistake in either direction shows up as a mismatch.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/base/error.h"
#include "core/base/fp16.h"
#include "core/model/quant.h"

namespace duet {
namespace {

template <class Block>
Block random_block(uint32_t seed) {
  std::mt19937 rng(seed);
  Block b;
  auto* bytes = reinterpret_cast<uint8_t*>(&b);
  for (size_t i = 0; i < sizeof b; ++i) bytes[i] = static_cast<uint8_t>(rng());
  return b;
}

// A small positive fp16 scale (random bits could be NaN or huge).
uint16_t scale_bits(std::mt19937& rng) {
  return fp32_to_fp16(0.001f * static_cast<float>(1 + rng() % 1000));
}

std::vector<float> dequantized(DType t, const void* block, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  dequantize_row(t, block, out.data(), n);
  return out;
}

TEST(QuantFormats, SizesMatchGgml) {
  EXPECT_EQ(dtype_block_bytes(DType::Q4_1), 20u);
  EXPECT_EQ(dtype_block_bytes(DType::Q5_0), 22u);
  EXPECT_EQ(dtype_block_bytes(DType::Q5_1), 24u);
  EXPECT_EQ(dtype_block_bytes(DType::Q4_K), 144u);
  EXPECT_EQ(dtype_block_bytes(DType::Q5_K), 176u);
  EXPECT_EQ(dtype_block_bytes(DType::Q6_K), 210u);
  EXPECT_EQ(dtype_block_bytes(DType::BF16), 2u);
  EXPECT_EQ(dtype_block_elems(DType::Q6_K), 256);
  EXPECT_EQ(dtype_row_bytes(DType::Q4_K, 512), 288u);
  EXPECT_THROW(dtype_row_bytes(DType::Q4_K, 384), Error);  // not a whole super-block
  EXPECT_EQ(dtype_name(DType::Q5_K), "Q5_K");
  for (uint32_t raw : {3u, 6u, 7u, 12u, 13u, 14u, 30u}) EXPECT_TRUE(dtype_known(raw)) << raw;
}

TEST(QuantFormats, Q4_1IsScaleTimesNibblePlusMin) {
  std::mt19937 rng(1);
  auto b = random_block<BlockQ4_1>(2);
  b.d = scale_bits(rng);
  b.m = fp32_to_fp16(-0.75f);
  const auto out = dequantized(DType::Q4_1, &b, 32);
  for (int i = 0; i < 32; ++i) {
    const int q = i < 16 ? b.qs[i] & 15 : b.qs[i - 16] >> 4;
    EXPECT_EQ(out[i], fp16_to_fp32(b.d) * static_cast<float>(q) - 0.75f) << i;
  }
}

TEST(QuantFormats, Q5_0TakesBitFourFromQh) {
  std::mt19937 rng(3);
  auto b = random_block<BlockQ5_0>(4);
  b.d = scale_bits(rng);
  const auto out = dequantized(DType::Q5_0, &b, 32);
  const uint32_t qh = b.qh[0] | b.qh[1] << 8 | b.qh[2] << 16 | static_cast<uint32_t>(b.qh[3]) << 24;
  for (int i = 0; i < 32; ++i) {
    const int q = (i < 16 ? b.qs[i] & 15 : b.qs[i - 16] >> 4) | ((qh >> i) & 1) << 4;
    EXPECT_EQ(out[i], fp16_to_fp32(b.d) * static_cast<float>(q - 16)) << i;
  }
}

TEST(QuantFormats, Q5_1IsQ5_0WithAMin) {
  std::mt19937 rng(5);
  auto b = random_block<BlockQ5_1>(6);
  b.d = scale_bits(rng);
  b.m = fp32_to_fp16(0.25f);
  const auto out = dequantized(DType::Q5_1, &b, 32);
  const uint32_t qh = b.qh[0] | b.qh[1] << 8 | b.qh[2] << 16 | static_cast<uint32_t>(b.qh[3]) << 24;
  for (int i = 0; i < 32; ++i) {
    const int q = (i < 16 ? b.qs[i] & 15 : b.qs[i - 16] >> 4) | ((qh >> i) & 1) << 4;
    EXPECT_EQ(out[i], fp16_to_fp32(b.d) * static_cast<float>(q) + 0.25f) << i;
  }
}

// Packs eight 6-bit scales and mins as ggml's Q4_K/Q5_K scales[12] (core/model/quant_k.h).
void pack_scales(const int sc[8], const int mn[8], uint8_t out[12]) {
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>((sc[j] & 63) | (sc[j + 4] >> 4) << 6);
    out[j + 4] = static_cast<uint8_t>((mn[j] & 63) | (mn[j + 4] >> 4) << 6);
    out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
  }
}

// A Q4_K / Q5_K super-block's eight 6-bit sub-block scales and mins.
struct ScalesMins {
  int sc[8], mn[8];
};

ScalesMins random_scales_mins(std::mt19937& rng) {
  ScalesMins s;
  for (int j = 0; j < 8; ++j) {
    s.sc[j] = static_cast<int>(rng() % 64);
    s.mn[j] = static_cast<int>(rng() % 64);
  }
  return s;
}

// Packs `s` into the block and draws its d and dmin.
template <class Block>
void set_scales_and_mins(Block& b, const ScalesMins& s, std::mt19937& rng) {
  pack_scales(s.sc, s.mn, b.scales);
  b.d = scale_bits(rng);
  b.dmin = scale_bits(rng);
}

// Quant q of sub-block j: d sc[j] q - dmin mn[j], in ggml's order of operations.
template <class Block>
float scaled_value(const Block& b, const ScalesMins& s, int j, int q) {
  return fp16_to_fp32(b.d) * static_cast<float>(s.sc[j]) * static_cast<float>(q) -
         fp16_to_fp32(b.dmin) * static_cast<float>(s.mn[j]);
}

TEST(QuantFormats, Q4_KIsSubBlockScaleTimesNibbleMinusSubBlockMin) {
  std::mt19937 rng(7);
  auto b = random_block<BlockQ4_K>(8);
  ScalesMins s = random_scales_mins(rng);
  s.sc[5] = 63;  // both high bits set somewhere
  s.mn[6] = 48;
  set_scales_and_mins(b, s, rng);
  const auto out = dequantized(DType::Q4_K, &b, 256);
  for (int i = 0; i < 256; ++i) {
    const int g = i / 64, l = i % 32, j = i / 32;
    const int q = i % 64 < 32 ? b.qs[32 * g + l] & 15 : b.qs[32 * g + l] >> 4;
    EXPECT_EQ(out[i], scaled_value(b, s, j, q)) << i;
  }
}

TEST(QuantFormats, Q5_KAddsBitFourFromQhPairs) {
  std::mt19937 rng(9);
  auto b = random_block<BlockQ5_K>(10);
  const ScalesMins s = random_scales_mins(rng);
  set_scales_and_mins(b, s, rng);
  const auto out = dequantized(DType::Q5_K, &b, 256);
  for (int i = 0; i < 256; ++i) {
    const int g = i / 64, l = i % 32, j = i / 32, upper = i % 64 >= 32;
    const int nib = upper ? b.qs[32 * g + l] >> 4 : b.qs[32 * g + l] & 15;
    const int q = nib | ((b.qh[l] >> (2 * g + upper)) & 1) << 4;
    EXPECT_EQ(out[i], scaled_value(b, s, j, q)) << i;
  }
}

TEST(QuantFormats, Q6_KIsSignedScaleTimesSixBitsMinus32) {
  std::mt19937 rng(11);
  auto b = random_block<BlockQ6_K>(12);
  b.d = scale_bits(rng);
  b.scales[3] = -128;
  const auto out = dequantized(DType::Q6_K, &b, 256);
  for (int i = 0; i < 256; ++i) {
    const int h = i / 128, k = (i % 128) / 32, l = i % 32;
    const uint8_t lbyte = b.ql[64 * h + l + 32 * (k & 1)];
    const int lo = k < 2 ? lbyte & 15 : lbyte >> 4;
    const int hi = (b.qh[32 * h + l] >> (2 * k)) & 3;
    const float want = fp16_to_fp32(b.d) * static_cast<float>(b.scales[i / 16]) *
                       static_cast<float>((lo | hi << 4) - 32);
    EXPECT_EQ(out[i], want) << i;
  }
}

TEST(QuantFormats, Bf16IsTheUpperHalfOfAnFp32) {
  const float x[4] = {1.0f, -2.5f, 3.14159274f, 1e-40f};
  uint16_t h[4];
  quantize_row(DType::BF16, x, h, 4);
  EXPECT_EQ(h[0], 0x3f80);
  EXPECT_EQ(h[1], 0xc020);
  EXPECT_EQ(h[2], 0x4049);  // 0x40490fdb rounds down
  float back[4];
  dequantize_row(DType::BF16, h, back, 4);
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], -2.5f);
  EXPECT_NEAR(back[2], 3.140625f, 0.0f);
  const float nan = std::nanf("");
  quantize_row(DType::BF16, &nan, h, 1);
  dequantize_row(DType::BF16, h, back, 1);
  EXPECT_TRUE(std::isnan(back[0]));
}

// Every quantiser writes a block its dequantiser reads back near the input (the K types' error
// bounds against round-to-nearest are in test_quant_k.cpp).
TEST(QuantFormats, EveryTypeRoundTripsWithinItsStep) {
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> x(512);
  for (float& v : x) v = normal(rng);
  const struct {
    DType type;
    float max_err;  // relative to max |x| (about 0.08)
  } cases[] = {{DType::Q4_1, 0.08f / 15 * 0.51f}, {DType::Q5_0, 0.08f / 16 * 0.51f},
               {DType::Q5_1, 0.08f / 31 * 0.51f}, {DType::Q4_K, 0.08f / 15},
               {DType::Q5_K, 0.08f / 31},         {DType::Q6_K, 0.08f / 32},
               {DType::BF16, 0.08f / 256}};
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  for (const auto& c : cases) {
    std::vector<uint8_t> q(dtype_row_bytes(c.type, 512));
    quantize_row(c.type, x.data(), q.data(), 512);
    std::vector<float> back(512);
    dequantize_row(c.type, q.data(), back.data(), 512);
    for (int i = 0; i < 512; ++i)
      ASSERT_LE(std::fabs(back[i] - x[i]), c.max_err * amax / 0.08f * 2)
          << dtype_name(c.type) << " weight " << i;
  }
}

}  // namespace
}  // namespace duet
