// The reference ops against plain double-precision loops written from their definitions, and
// the properties backends rely on: results independent of thread count and of batching.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/base/error.h"
#include "core/base/fp16.h"
#include "core/model/ops.h"
#include "core/model/quant.h"

namespace duet {
namespace {

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

struct TestWeight {
  std::vector<uint8_t> bytes;
  ops::Matrix m;
  std::vector<float> dense;  // what the bytes dequantise to
};

TestWeight make_weight(DType type, int64_t rows, int64_t cols, uint32_t seed) {
  TestWeight w;
  const auto values = random_floats(static_cast<size_t>(rows * cols), seed);
  w.bytes.resize(dtype_row_bytes(type, cols) * rows);
  w.dense.resize(values.size());
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = w.bytes.data() + r * dtype_row_bytes(type, cols);
    quantize_row(type, values.data() + r * cols, row, cols);
    dequantize_row(type, row, w.dense.data() + r * cols, cols);
  }
  w.m = {type, rows, cols, w.bytes.data()};
  return w;
}

class MatmulTest : public ::testing::TestWithParam<DType> {};

TEST_P(MatmulTest, MatchesDoubleDotOfDequantisedWeights) {
  const int64_t rows = 37, cols = 96;
  const auto w = make_weight(GetParam(), rows, cols, 1);
  for (int n_tokens : {1, 3, 5, 17}) {
    const auto x = random_floats(static_cast<size_t>(n_tokens * cols), 2);
    std::vector<float> y(static_cast<size_t>(n_tokens * rows));
    ops::matmul(w.m, x.data(), n_tokens, y.data());
    for (int t = 0; t < n_tokens; ++t) {
      for (int64_t r = 0; r < rows; ++r) {
        double expect = 0;
        for (int64_t k = 0; k < cols; ++k)
          expect += double(w.dense[r * cols + k]) * x[t * cols + k];
        ASSERT_NEAR(y[t * rows + r], expect, 1e-4 * (1 + std::fabs(expect)))
            << "token " << t << " row " << r;
      }
    }
  }
}

TEST_P(MatmulTest, BatchedEqualsOneTokenAtATimeBitForBit) {
  const int64_t rows = 50, cols = 128;
  const int n_tokens = 9;
  const auto w = make_weight(GetParam(), rows, cols, 3);
  const auto x = random_floats(static_cast<size_t>(n_tokens * cols), 4);
  std::vector<float> batched(static_cast<size_t>(n_tokens * rows)), single(rows);
  ops::matmul(w.m, x.data(), n_tokens, batched.data());
  for (int t = 0; t < n_tokens; ++t) {
    ops::matmul(w.m, x.data() + t * cols, 1, single.data());
    for (int64_t r = 0; r < rows; ++r)
      ASSERT_EQ(batched[t * rows + r], single[r]) << "token " << t << " row " << r;
  }
}

TEST_P(MatmulTest, ThreadCountAndRowSplitDoNotChangeResults) {
  const int64_t rows = 70, cols = 64;
  const int n_tokens = 6;
  const auto w = make_weight(GetParam(), rows, cols, 5);
  const auto x = random_floats(static_cast<size_t>(n_tokens * cols), 6);
  std::vector<float> one(static_cast<size_t>(n_tokens * rows)), three(one.size(), NAN);
  const int saved = ops::num_threads();
  ops::set_num_threads(1);
  ops::matmul(w.m, x.data(), n_tokens, one.data());
  ops::set_num_threads(3);
  // Two "devices" each computing part of the rows into one output tensor.
  ops::matmul(w.m, x.data(), n_tokens, three.data(), 0, 29);
  ops::matmul(w.m, x.data(), n_tokens, three.data(), 29, -1);
  ops::set_num_threads(saved);
  EXPECT_EQ(one, three);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatmulTest,
                         ::testing::Values(DType::F32, DType::F16, DType::Q8_0, DType::Q4_0,
                                           DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Ops, MatmulHandlesRowsThatAreNotAMultipleOfEightLanes) {
  for (DType type : {DType::F32, DType::F16}) {
    const int64_t rows = 5, cols = 37;
    const auto w = make_weight(type, rows, cols, 14);
    const auto x = random_floats(static_cast<size_t>(6 * cols), 15);
    std::vector<float> y(6 * rows), single(rows);
    ops::matmul(w.m, x.data(), 6, y.data());
    for (int t = 0; t < 6; ++t) {
      ops::matmul(w.m, x.data() + t * cols, 1, single.data());
      for (int64_t r = 0; r < rows; ++r) {
        double expect = 0;
        for (int64_t k = 0; k < cols; ++k)
          expect += double(w.dense[r * cols + k]) * x[t * cols + k];
        EXPECT_NEAR(y[t * rows + r], expect, 1e-4);
        EXPECT_EQ(y[t * rows + r], single[r]);
      }
    }
  }
}

TEST(Ops, MatmulRejectsRowRangeOutsideWeight) {
  const auto w = make_weight(DType::F32, 4, 32, 7);
  std::vector<float> x(32), y(8);
  try {
    ops::matmul(w.m, x.data(), 1, y.data(), 2, 9);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("row range"), std::string::npos) << e.what();
  }
}

TEST(Ops, EmbedCopiesDequantisedRowsAndRejectsBadIds) {
  const auto table = make_weight(DType::Q8_0, 10, 64, 8);
  const int32_t ids[] = {7, 0, 7};
  std::vector<float> out(3 * 64);
  ops::embed(table.m, ids, 3, out.data());
  for (int t = 0; t < 3; ++t)
    for (int i = 0; i < 64; ++i) ASSERT_EQ(out[t * 64 + i], table.dense[ids[t] * 64 + i]);
  const int32_t bad[] = {10};
  EXPECT_THROW(ops::embed(table.m, bad, 1, out.data()), Error);
}

TEST(Ops, RmsnormScalesToUnitRmsTimesWeight) {
  const int dim = 48, n = 3;
  const auto x = random_floats(n * dim, 9, 3.0f);
  const auto w = random_floats(dim, 10);
  std::vector<float> out(x.size());
  ops::rmsnorm(x.data(), w.data(), n, dim, 1e-5f, out.data());
  for (int t = 0; t < n; ++t) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += double(x[t * dim + i]) * x[t * dim + i];
    const double inv = 1 / std::sqrt(ss / dim + 1e-5);
    for (int i = 0; i < dim; ++i) ASSERT_NEAR(out[t * dim + i], x[t * dim + i] * inv * w[i], 1e-5);
  }
  ops::rmsnorm(x.data(), w.data(), n, dim, 1e-5f,
               const_cast<float*>(x.data()));  // in place is allowed
  EXPECT_EQ(x, out);
}

TEST(Ops, RopeRotatesInterleavedPairsByPositionTimesFrequency) {
  const int head_dim = 8, n_heads = 2;
  std::vector<float> x(n_heads * head_dim);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 2 == 0) ? 1.0f : 0.0f;  // every pair is (1, 0)
  const int32_t pos[] = {3};
  ops::rope(x.data(), 1, n_heads, head_dim, pos, ops::RopeParams{10000.0f});
  for (int h = 0; h < n_heads; ++h) {
    for (int i = 0; i < head_dim / 2; ++i) {
      const double theta = 3 * std::pow(10000.0, -2.0 * i / head_dim);
      EXPECT_NEAR(x[h * head_dim + 2 * i], std::cos(theta), 1e-6);
      EXPECT_NEAR(x[h * head_dim + 2 * i + 1], std::sin(theta), 1e-6);
    }
  }
}

TEST(Ops, NeoxRopePairsValuesHalfAHeadApart) {
  const int head_dim = 8, half = head_dim / 2;
  std::vector<float> x(head_dim, 0.0f);
  for (int i = 0; i < half; ++i) x[i] = 1.0f;  // every neox pair (i, i + half) is (1, 0)
  const int32_t pos[] = {5};
  ops::RopeParams p;
  p.mode = ops::RopeMode::neox;
  ops::rope(x.data(), 1, 1, head_dim, pos, p);
  for (int i = 0; i < half; ++i) {
    const double theta = 5 * std::pow(10000.0, -2.0 * i / head_dim);
    EXPECT_NEAR(x[i], std::cos(theta), 1e-6);
    EXPECT_NEAR(x[i + half], std::sin(theta), 1e-6);
  }
}

TEST(Ops, RopeDividesEachAngleByItsFreqFactorAndScalesLinearly) {
  // ggml's rope: theta_i = pos * freq_scale * base^(-2i/d) / factor_i.
  const int head_dim = 8;
  const float factors[] = {1.0f, 2.0f, 8.0f, 32.0f};
  std::vector<float> x(head_dim);
  for (int i = 0; i < head_dim; ++i) x[i] = (i % 2 == 0) ? 1.0f : 0.0f;
  const int32_t pos[] = {1000};
  ops::RopeParams p{500000.0f, 0.25f, factors, ops::RopeMode::normal};
  ops::rope(x.data(), 1, 1, head_dim, pos, p);
  for (int i = 0; i < head_dim / 2; ++i) {
    const double theta = 1000 * 0.25 * std::pow(500000.0, -2.0 * i / head_dim) / factors[i];
    EXPECT_NEAR(x[2 * i], std::cos(theta), 1e-6) << i;
    EXPECT_NEAR(x[2 * i + 1], std::sin(theta), 1e-6) << i;
  }
}

TEST(Ops, AddBiasAddsTheVectorToEveryRow) {
  std::vector<float> x = {1, 2, 3, 4, 5, 6};
  const float bias[] = {10, 20, 30};
  ops::add_bias(x.data(), bias, 2, 3);
  EXPECT_EQ(x, (std::vector<float>{11, 22, 33, 14, 25, 36}));
}

TEST(Ops, AttentionIsCausalGqaSoftmaxOverTheCache) {
  const int n_heads = 4, n_kv = 2, hd = 16, n_ctx = 7, n_tokens = 3;
  const auto k = random_floats(n_ctx * n_kv * hd, 11), v = random_floats(n_ctx * n_kv * hd, 12);
  const auto q = random_floats(n_tokens * n_heads * hd, 13);
  const int32_t pos[] = {4, 5, 6};
  std::vector<float> out(q.size());
  ops::attention(q.data(), k.data(), v.data(), n_tokens, pos, n_heads, n_kv, hd, out.data());
  for (int t = 0; t < n_tokens; ++t) {
    for (int h = 0; h < n_heads; ++h) {
      const int kvh = h / (n_heads / n_kv);
      std::vector<double> p(pos[t] + 1);
      double mx = -1e300, sum = 0;
      for (int j = 0; j <= pos[t]; ++j) {
        double s = 0;
        for (int d = 0; d < hd; ++d)
          s += double(q[(t * n_heads + h) * hd + d]) * k[(j * n_kv + kvh) * hd + d];
        p[j] = s / std::sqrt(double(hd));
        mx = std::max(mx, p[j]);
      }
      for (auto& e : p) sum += (e = std::exp(e - mx));
      for (int d = 0; d < hd; ++d) {
        double o = 0;
        for (int j = 0; j <= pos[t]; ++j) o += p[j] / sum * v[(j * n_kv + kvh) * hd + d];
        ASSERT_NEAR(out[(t * n_heads + h) * hd + d], o, 1e-5);
      }
    }
  }
  EXPECT_THROW(ops::attention(q.data(), k.data(), v.data(), 1, pos, 3, 2, hd, out.data()), Error);
}

TEST(Ops, SwigluAndAdd) {
  const std::vector<float> gate = {-2.0f, 0.0f, 1.5f}, up = {3.0f, 4.0f, -2.0f};
  std::vector<float> out(3);
  ops::swiglu(gate.data(), up.data(), 3, out.data());
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(out[i], gate[i] / (1 + std::exp(-gate[i])) * up[i], 1e-6);
  ops::add(out.data(), up.data(), 3);
  EXPECT_NEAR(out[2], 1.5 / (1 + std::exp(-1.5)) * -2.0 - 2.0, 1e-6);
}

// Gemma's GeGLU: GELU's tanh approximation (ggml_gelu_f32's formula) of the gate times up; the
// approximation stays within 1e-3 of the exact (erf) GELU.
TEST(Ops, GegluIsGelusTanhApproximationTimesUp) {
  std::vector<float> gate, up;
  for (int i = -60; i <= 60; ++i) {
    gate.push_back(0.1f * static_cast<float>(i));
    up.push_back(1.0f + 0.01f * static_cast<float>(i));
  }
  const auto n = static_cast<int64_t>(gate.size());
  std::vector<float> out(gate.size());
  ops::geglu(gate.data(), up.data(), n, out.data());
  for (size_t i = 0; i < gate.size(); ++i) {
    const double g = gate[i];
    const double tanh_gelu =
        0.5 * g *
        (1 + std::tanh(std::sqrt(2 / 3.14159265358979323846) * (g + 0.044715 * g * g * g)));
    EXPECT_NEAR(out[i], tanh_gelu * up[i], 1e-5) << "g=" << g;
    EXPECT_NEAR(out[i], 0.5 * g * (1 + std::erf(g / std::sqrt(2.0))) * up[i], 1e-3) << "g=" << g;
  }
  EXPECT_EQ(out[60], 0.0f);  // gelu(0) = 0
  // In place on the gate, as the forward pass runs it; gated_ffn picks by activation.
  std::vector<float> in_place = gate, swiglu_out(gate.size());
  ops::gated_ffn(ops::FfnAct::gelu_tanh, in_place.data(), up.data(), n, in_place.data());
  EXPECT_EQ(in_place, out);
  ops::gated_ffn(ops::FfnAct::silu, gate.data(), up.data(), n, swiglu_out.data());
  ops::swiglu(gate.data(), up.data(), n, out.data());
  EXPECT_EQ(swiglu_out, out);
  EXPECT_THROW(ops::gated_ffn(static_cast<ops::FfnAct>(7), gate.data(), up.data(), n, out.data()),
               Error);
}

TEST(Ops, ScaleMultipliesInPlace) {
  std::vector<float> x = {1.0f, -2.0f, 0.5f};
  ops::scale(x.data(), std::sqrt(2048.0f), 3);
  EXPECT_EQ(x, (std::vector<float>{std::sqrt(2048.0f), -2.0f * std::sqrt(2048.0f),
                                   0.5f * std::sqrt(2048.0f)}));
}

}  // namespace
}  // namespace duet
