// ops::matmul on every weight type duet reads, against a float64 dot product of the dequantised
// weights, on odd shapes: rows 1, 31, 33, 257 (tails of every row split) and token counts 1..20,
// 64 and 296 (decode's stored-row path below ops' unpack threshold, prefill's unpacked path above
// it). Every token's outputs must also equal that token alone, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/model/ops.h"
#include "core/model/quant.h"

namespace duet {
namespace {

std::vector<float> normal(size_t n, uint32_t seed, float stddev) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

class MatmulEveryType : public ::testing::TestWithParam<DType> {};

TEST_P(MatmulEveryType, EqualsFloat64DotOfDequantisedWeightsOnOddShapes) {
  const DType type = GetParam();
  const int64_t cols = 512;  // two K super-blocks, sixteen 32-blocks
  std::vector<int> token_counts;
  for (int t = 1; t <= 20; ++t) token_counts.push_back(t);
  token_counts.push_back(64);
  token_counts.push_back(296);
  const auto x = normal(static_cast<size_t>(296 * cols), 2, 1.0f);
  for (int64_t rows : {1, 31, 33, 257}) {
    const auto values = normal(static_cast<size_t>(rows * cols), 1, 0.05f);
    const size_t row_bytes = dtype_row_bytes(type, cols);
    std::vector<uint8_t> bytes(row_bytes * static_cast<size_t>(rows));
    std::vector<float> dense(values.size());
    for (int64_t r = 0; r < rows; ++r) {
      quantize_row(type, values.data() + r * cols, bytes.data() + r * row_bytes, cols);
      dequantize_row(type, bytes.data() + r * row_bytes, dense.data() + r * cols, cols);
    }
    const ops::Matrix w{type, rows, cols, bytes.data()};
    std::vector<float> alone(static_cast<size_t>(rows));
    for (int n_tokens : token_counts) {
      std::vector<float> y(static_cast<size_t>(n_tokens * rows));
      ops::matmul(w, x.data(), n_tokens, y.data());
      for (int t = 0; t < n_tokens; ++t) {
        if (n_tokens > 1 && t != n_tokens - 1 && t != 0) continue;  // ends of each batch
        ops::matmul(w, x.data() + t * cols, 1, alone.data());
        for (int64_t r = 0; r < rows; ++r) {
          double want = 0, mag = 0;
          for (int64_t k = 0; k < cols; ++k) {
            want += double(dense[r * cols + k]) * x[t * cols + k];
            mag += std::fabs(double(dense[r * cols + k]) * x[t * cols + k]);
          }
          const float got = y[static_cast<size_t>(t * rows + r)];
          ASSERT_NEAR(got, want, 1e-5 * mag + 1e-6)
              << dtype_name(type) << " rows " << rows << " tokens " << n_tokens << " token " << t
              << " row " << r;
          ASSERT_EQ(got, alone[static_cast<size_t>(r)])
              << dtype_name(type) << " rows " << rows << " tokens " << n_tokens << " token " << t
              << " row " << r << ": batched differs from alone";
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(NewTypes, MatmulEveryType,
                         ::testing::Values(DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q4_1,
                                           DType::Q5_0, DType::Q5_1, DType::BF16, DType::Q4_0,
                                           DType::Q8_0),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace duet
