// The emulator's matmul equals the reference ops::matmul within fp16 tolerance for every weight
// type the NPU runs, at odd sizes, over row ranges and token ranges, with NPU numerics.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/base/error.h"
#include "core/base/fp16.h"
#include "core/model/ops.h"
#include "core/model/quant.h"
#include "services/npu_svc/npu_gemm.h"

namespace duet {
namespace {

struct Weights {
  DType type;
  int64_t rows, cols;
  std::vector<uint8_t> bytes;
  std::vector<float> dequantised;  // what the weights are, for the error bound
  ops::Matrix matrix() const { return ops::Matrix{type, rows, cols, bytes.data()}; }
};

Weights make_weights(DType type, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.5f);
  Weights w{type, rows, cols, std::vector<uint8_t>(rows * dtype_row_bytes(type, cols)),
            std::vector<float>(rows * cols)};
  std::vector<float> row(cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : row) v = dist(rng);
    quantize_row(type, row.data(), w.bytes.data() + r * dtype_row_bytes(type, cols), cols);
    dequantize_row(type, w.bytes.data() + r * dtype_row_bytes(type, cols),
                   w.dequantised.data() + r * cols, cols);
  }
  return w;
}

std::vector<float> make_activations(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> x(n * k);
  for (float& v : x) v = dist(rng);
  return x;
}

bool is_fp16(float v) {
  return fp16_to_fp32(fp32_to_fp16(v)) == v;
}

// fp16 rounding of each activation (2^-11 relative) and of the output bounds the difference.
void expect_close(const Weights& w, const std::vector<float>& x, int64_t n,
                  const std::vector<float>& got, const std::vector<float>& want, int64_t row_begin,
                  int64_t row_end) {
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t r = row_begin; r < row_end; ++r) {
      double magnitude = 0;
      for (int64_t i = 0; i < w.cols; ++i)
        magnitude += std::fabs(w.dequantised[r * w.cols + i] * x[t * w.cols + i]);
      const float g = got[t * w.rows + r], e = want[t * w.rows + r];
      ASSERT_NEAR(g, e, 1e-3 * (magnitude + std::fabs(e)) + 1e-6)
          << dtype_name(w.type) << " [" << w.rows << "x" << w.cols << "] n=" << n << " t=" << t
          << " r=" << r;
      ASSERT_TRUE(is_fp16(g)) << "outputs leave the NPU as fp16";
    }
  }
}

TEST(NpuGemm, MatchesReferenceMatmulForEveryWeightTypeAtOddSizes) {
  npu::NpuGemm gemm(2);
  uint32_t seed = 1;
  for (DType type : {DType::Q4_0, DType::Q8_0, DType::F16, DType::F32}) {
    for (int64_t m : {1, 31, 33, 257}) {
      for (int64_t k : {32, 96, 288}) {
        const Weights w = make_weights(type, m, k, seed++);
        for (int64_t n : {1, 31, 33}) {
          const std::vector<float> x = make_activations(n, k, seed++);
          std::vector<float> want(n * m), got(n * m);
          ops::matmul(w.matrix(), x.data(), static_cast<int>(n), want.data());
          gemm.matmul(w.matrix(), x.data(), k, n, got.data(), m);
          expect_close(w, x, n, got, want, 0, m);
        }
      }
    }
  }
}

// W4A16 and friends: the K types (256-weight super-blocks), the legacy 32-blocks with offsets,
// BF16 and E0M4 (128-weight groups, the shift-and-OR dequantisation in lanes), dequantised on the
// fly, equal to the reference op at odd sizes; a token's outputs the same bits alone or batched
// (decode reads stored rows, prefill dequantised tiles).
TEST(NpuGemm, EveryNewWeightTypeMatchesTheReferenceAndIsBatchInvariant) {
  npu::NpuGemm gemm(2);
  uint32_t seed = 300;
  for (DType type : {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                     DType::BF16, DType::E0M4}) {
    for (int64_t m : {1, 31, 33, 257}) {
      for (int64_t k : {256, 768}) {
        const Weights w = make_weights(type, m, k, seed++);
        for (int64_t n : {1, 3, 20, 33}) {
          const std::vector<float> x = make_activations(n, k, seed++);
          std::vector<float> want(n * m), got(n * m);
          ops::matmul(w.matrix(), x.data(), static_cast<int>(n), want.data());
          gemm.matmul(w.matrix(), x.data(), k, n, got.data(), m);
          expect_close(w, x, n, got, want, 0, m);
          std::vector<float> alone(m);
          for (int64_t t : {int64_t{0}, n - 1}) {
            gemm.matmul(w.matrix(), x.data() + t * k, k, 1, alone.data(), m);
            for (int64_t r = 0; r < m; ++r)
              ASSERT_EQ(got[t * m + r], alone[r])
                  << dtype_name(type) << " m=" << m << " k=" << k << " n=" << n << " t=" << t;
          }
        }
      }
    }
  }
}

TEST(NpuGemm, LargeShapesSpanSeveralTilesAndThreads) {
  npu::NpuGemm gemm(3);
  const Weights w = make_weights(DType::Q4_0, 600, 2048, 7);  // several 128-row tiles
  ASSERT_LT(npu::NpuGemm::tile_rows(2048), 600);
  const std::vector<float> x = make_activations(40, 2048, 8);
  std::vector<float> want(40 * 600), got(40 * 600);
  ops::matmul(w.matrix(), x.data(), 40, want.data());
  gemm.matmul(w.matrix(), x.data(), 2048, 40, got.data(), 600);
  expect_close(w, x, 40, got, want, 0, 600);
}

// Batch invariance: a token's outputs are the same bits whether it is alone in the call (the
// decode path, rows read in their stored type), one of a few, or one of many (the prefill path,
// dequantised tiles), at any position. Without it a request's greedy tokens change with what the
// serving loop batches it with (near ties flip).
TEST(NpuGemm, ATokensOutputsDoNotDependOnTheOtherTokensInTheCall) {
  npu::NpuGemm gemm(2);
  uint32_t seed = 100;
  for (DType type : {DType::Q4_0, DType::Q8_0, DType::F16, DType::F32}) {
    // 2100 columns: several K blocks; F16/F32 also get a tail that is not a whole lane group.
    const int64_t m = 37, k = type == DType::F16 || type == DType::F32 ? 2100 : 2112;
    const Weights w = make_weights(type, m, k, seed++);
    const std::vector<float> x = make_activations(70, k, seed++);
    std::vector<float> alone(70 * m);
    for (int64_t t = 0; t < 70; ++t)
      gemm.matmul(w.matrix(), x.data() + t * k, k, 1, alone.data() + t * m, m);
    for (int64_t n : {2, 3, 4, 5, 7, 17, 25, 49, 70}) {
      std::vector<float> batched(n * m);
      gemm.matmul(w.matrix(), x.data(), k, n, batched.data(), m);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t r = 0; r < m; ++r)
          ASSERT_EQ(batched[t * m + r], alone[t * m + r])
              << dtype_name(type) << " n=" << n << " t=" << t << " r=" << r;
    }
  }
}

// Weight-centric split: a device computes output rows [begin, end) into the full-width output
// and leaves the other rows alone. Activation-centric: token rows via pointers and strides.
TEST(NpuGemm, RowRangesAndTokenRangesWriteOnlyTheirPart) {
  npu::NpuGemm gemm(2);
  const int64_t m = 257, k = 96, n = 33;
  const Weights w = make_weights(DType::Q8_0, m, k, 11);
  const std::vector<float> x = make_activations(n, k, 12);
  std::vector<float> want(n * m);
  ops::matmul(w.matrix(), x.data(), static_cast<int>(n), want.data());

  constexpr float kUntouched = 12345.0f;
  std::vector<float> got(n * m, kUntouched);
  gemm.matmul(w.matrix(), x.data(), k, n, got.data(), m, 100, 200);
  expect_close(w, x, n, got, want, 100, 200);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < m; ++r)
      if (r < 100 || r >= 200) {
        ASSERT_EQ(got[t * m + r], kUntouched) << t << "," << r;
      }

  // Tokens [10, 20) only: offset the pointers, keep the strides.
  std::vector<float> part(n * m, kUntouched);
  gemm.matmul(w.matrix(), x.data() + 10 * k, k, 10, part.data() + 10 * m, m);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < m; ++r) {
      if (t >= 10 && t < 20) {
        ASSERT_NEAR(part[t * m + r], want[t * m + r], 0.05f);
      } else {
        ASSERT_EQ(part[t * m + r], kUntouched);
      }
    }
}

TEST(NpuGemm, ActivationsAreRoundedToFp16OnTheWayIn) {
  npu::NpuGemm gemm(1);
  // One weight of 1.0: the output is the activation as the NPU saw it.
  std::vector<float> one(32, 0.0f);
  one[0] = 1.0f;
  Weights w{DType::F32, 1, 32, std::vector<uint8_t>(32 * 4), one};
  std::memcpy(w.bytes.data(), one.data(), 32 * 4);
  std::vector<float> x(32, 0.0f);
  x[0] = 1.0f + 1.0f / 4096;  // not representable in fp16: rounds to 1.0
  float y = 0;
  gemm.matmul(w.matrix(), x.data(), 32, 1, &y, 1);
  EXPECT_EQ(y, 1.0f);
}

TEST(NpuGemm, RejectsBadShapes) {
  npu::NpuGemm gemm(1);
  const Weights w = make_weights(DType::Q4_0, 8, 64, 3);
  std::vector<float> x(64), y(8);
  auto code = [&](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return e.code();
    }
    return Errc::ok;
  };
  EXPECT_EQ(code([&] { gemm.matmul(w.matrix(), x.data(), 64, 1, y.data(), 8, 4, 9); }),
            Errc::invalid_argument);
  EXPECT_EQ(code([&] { gemm.matmul(w.matrix(), x.data(), 32, 1, y.data(), 8); }),
            Errc::invalid_argument);
  EXPECT_EQ(code([&] { gemm.matmul(w.matrix(), x.data(), 64, 1, y.data(), 4); }),
            Errc::invalid_argument);
  ops::Matrix odd{DType::Q4_0, 8, 40, w.bytes.data()};
  EXPECT_EQ(code([&] { gemm.matmul(odd, x.data(), 64, 1, y.data(), 8); }), Errc::invalid_argument);
}

}  // namespace
}  // namespace duet
