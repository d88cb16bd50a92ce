// K-quant (Q4_K, Q5_K, Q6_K) matmuls and embedding lookups of gpu_svc (issue 19):
// - the integer kernels of CPU devices (matmul_kq_cpu.cl) compute their documented algorithm
//   bit for bit (kquant_test_util.h's emulation) on odd shapes (rows 1, 31, 33, 257; 1 and 3
//   super-blocks; row ranges that start and end inside a 16-row item), for 1..20, 64 and 296
//   tokens at any place of a tile, with Logits rows from the token table, both ISAs, from the
//   file's layout and the tiled copy: so every token's output is that of the token alone (batch
//   invariance) and the layouts and ISAs agree bit for bit;
// - they stay close to the fp64 matmul of the dequantised weights (the reference);
// - the fp32 kernels (matmul_kq_gpu.cl: the GPU GEMV and GEMM, CPU devices with the integer
//   path off) and the embedding lookup agree with the dequantised weights to float rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "core/base/error.h"
#include "core/model/ops.h"
#include "core/model/quant.h"
#include "services/gpu_svc/gpu_kernels.h"
#include "services/gpu_svc/tiled_weights.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/kquant_test_util.h"

namespace duet::gpu {
namespace {

using testing::kq_dequantize;
using testing::kq_emulate;
using testing::random_kq_weights;
using Shape = testing::MatmulShape;

const Shape kShapes[] = {{1, 256, 0, 1}, {31, 768, 0, 31}, {33, 256, 0, 33}, {257, 512, 3, 250}};
std::vector<uint32_t> token_counts() {
  std::vector<uint32_t> n;
  for (uint32_t i = 1; i <= 20; ++i) n.push_back(i);
  n.push_back(64);
  n.push_back(296);
  return n;
}
constexpr uint32_t kBegin = 2;  // the launches' first token (a tile starts there)

// A weight tensor at a 2-byte offset (super-blocks at unaligned addresses), an arena with the
// token table (Logits rows: reversed, every third token none), kTable input rows and outputs.
struct Fixture {
  Fixture(ClDevice& dev, DType type, const Shape& s, uint32_t table)
      : wbytes(random_kq_weights(type, s.rows, s.cols, 7 + s.rows)),
        w(dev, 2 + wbytes.size()),
        x(random_floats(size_t{table} * s.cols, 5 + s.cols, 2.0f)),
        x_off(4096 + uint64_t{table} * 16),
        y_off(x_off + uint64_t{table} * s.cols * 4),
        arena(dev, y_off + uint64_t{table} * s.rows * 4) {
    std::memcpy(w.at(2), wbytes.data(), wbytes.size());
    w.upload();
    for (uint32_t i = 0; i < 32; ++i) x[size_t{kBegin + 1} * s.cols + 32 + i] = 0.0f;  // dx = 0
    std::memcpy(arena.at(x_off), x.data(), x.size() * 4);
    auto* tok = arena.at<int32_t>(0);
    for (uint32_t t = 0; t < table; ++t)
      tok[4 * t + 3] = t % 3 == 1 ? -1 : static_cast<int32_t>(table - 1 - t);
    arena.upload();
  }
  MatmulArgs args(DType type, const Shape& s, uint32_t t0, uint32_t t1, bool table) const {
    return MatmulArgs{type,   w.mem(),     2,         s.cols,   x_off, s.cols, y_off,
                      s.rows, s.row_begin, s.row_end, {t0, t1}, 0,     table};
  }
  int32_t logits_row(uint32_t t) { return arena.at<int32_t>(0)[4 * t + 3]; }
  std::vector<uint8_t> wbytes;
  HostBuffer w;
  std::vector<float> x;
  uint64_t x_off, y_off;
  HostBuffer arena;
};

using KQuantInt8Matmul = testing::Int8MatmulTest;

TEST_P(KQuantInt8Matmul, EveryLaunchComputesTheDocumentedAlgorithmBitForBit) {
  const std::vector<GpuKernels::Int8Isa> isas = integer_isas();
  const uint32_t table = kBegin + 296;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE("rows " + std::to_string(s.rows) + " cols " + std::to_string(s.cols));
    Fixture f(dev, type, s, table);
    const size_t row_bytes = f.wbytes.size() / s.rows;
    std::vector<float> want(size_t{table} * s.rows);
    for (uint32_t t = kBegin; t < table; ++t)
      for (uint32_t r = s.row_begin; r < s.row_end; ++r)
        want[size_t{t} * s.rows + r] = kq_emulate(type, f.wbytes.data() + r * row_bytes,
                                                  f.x.data() + size_t{t} * s.cols, s.cols, bits);
    const TiledTensor tiled(dev, type, s.rows, s.cols, f.wbytes.data());
    for (const GpuKernels::Int8Isa isa : isas)
      for (const bool tiled_layout : {false, true}) {
        kernels.set_int8_isa(isa);
        for (const uint32_t n : token_counts())
          for (const bool logits : {false, true}) {
            if (logits && n > 20 && s.rows != 33) continue;  // enough: the table's rows per shape
            SCOPED_TRACE(std::string(GpuKernels::int8_isa_name(isa)) +
                         (tiled_layout ? " tiled" : " file") + " n " + std::to_string(n) +
                         (logits ? " (Logits rows)" : ""));
            float* y = f.arena.at<float>(f.y_off);
            std::fill(y, y + size_t{table} * s.rows, -7.0f);
            f.arena.upload();
            MatmulArgs a = f.args(type, s, kBegin, kBegin + n, logits);
            if (tiled_layout) a.tiled = tiled.mem();
            run(kernels.matmul(f.arena.mem(), a));
            f.arena.download();
            std::vector<bool> written(size_t{table} * s.rows, false);
            for (uint32_t t = kBegin; t < kBegin + n; ++t) {
              const int32_t out = logits ? f.logits_row(t) : static_cast<int32_t>(t);
              if (out < 0) continue;
              for (uint32_t r = s.row_begin; r < s.row_end; ++r) {
                const size_t at = size_t(out) * s.rows + r;
                written[at] = true;
                ASSERT_EQ(want[size_t{t} * s.rows + r], y[at]) << "token " << t << " row " << r;
              }
            }
            for (size_t i = 0; i < written.size(); ++i) {
              if (!written[i]) {
                ASSERT_EQ(y[i], -7.0f) << "written outside its rows/tokens: " << i;
              }
            }
          }
      }
  }
}

// y against the fp64 matmul of the dequantised weights: 8-bit activations cost about 1/254 of
// a block's largest |x| per value, 16-bit 1/65024; relative to sum |w x|.
double worst_relative_error(const std::vector<uint8_t>& wbytes, DType type, const Shape& s,
                            const std::vector<float>& x, uint32_t t_begin, uint32_t n,
                            const float* y) {
  std::vector<float> dense(size_t{s.rows} * s.cols);
  const size_t row_bytes = wbytes.size() / s.rows;
  for (uint32_t r = 0; r < s.rows; ++r)
    kq_dequantize(type, wbytes.data() + r * row_bytes, dense.data() + size_t{r} * s.cols, s.cols);
  return testing::worst_relative_error(dense, s, x, t_begin, n, y);
}

// A width that is not whole super-blocks is refused with the width named, and the host copy
// it had allocated goes with the error (gpu_tiled_copy_leak_test runs it under LeakSanitizer).
TEST_P(KQuantInt8Matmul, ATiledCopyOfAWidthThatIsNotWholeSuperBlocksIsRefused) {
  const std::vector<uint8_t> bytes(4 * 512, 0);
  try {
    const TiledTensor tiled(dev, type, 4, 300, bytes.data());
    FAIL() << "a width of 300 was tiled";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("width 300"), std::string::npos) << e.what();
  }
}

TEST_P(KQuantInt8Matmul, StaysCloseToTheFp64MatmulOfTheDequantisedWeights) {
  const Shape s{96, 1024, 0, 96};
  const uint32_t table = kBegin + 9;
  Fixture f(dev, type, s, table);
  for (const uint32_t n : {1u, 9u}) {
    run(kernels.matmul(f.arena.mem(), f.args(type, s, kBegin, kBegin + n, false)));
    f.arena.download();
    const double worst =
        worst_relative_error(f.wbytes, type, s, f.x, kBegin, n, f.arena.at<float>(f.y_off));
    std::printf("%s, %d-bit activations, %u tokens: worst error %.3g of sum |w x|\n",
                std::string(dtype_name(type)).c_str(), bits, n, worst);
    EXPECT_LT(worst, bits == 16 ? 5e-5 : 5e-3) << n << " tokens";
    EXPECT_GT(worst, 0.0) << "bit-equal to fp64: the integer path did not run";
  }
}

// And against core's reference op (ops::matmul, kq19's), on the same inputs.
TEST_P(KQuantInt8Matmul, StaysCloseToTheReferenceOp) {
  const Shape s{40, 512, 0, 40};
  const uint32_t n = 7;
  Fixture f(dev, type, s, kBegin + n);
  run(kernels.matmul(f.arena.mem(), f.args(type, s, kBegin, kBegin + n, false)));
  f.arena.download();
  std::vector<float> want(size_t{n} * s.rows);
  ops::matmul(ops::Matrix{type, s.rows, s.cols, f.wbytes.data()},
              f.x.data() + size_t{kBegin} * s.cols, n, want.data());
  for (uint32_t t = 0; t < n; ++t)
    for (uint32_t r = 0; r < s.rows; ++r) {
      double magnitude = 0;
      std::vector<float> row(s.cols);
      kq_dequantize(type, f.wbytes.data() + r * (f.wbytes.size() / s.rows), row.data(), s.cols);
      for (uint32_t i = 0; i < s.cols; ++i)
        magnitude += std::fabs(double{row[i]} * f.x[size_t{kBegin + t} * s.cols + i]);
      EXPECT_NEAR(f.arena.at<float>(f.y_off)[size_t{kBegin + t} * s.rows + r],
                  want[size_t{t} * s.rows + r], (bits == 16 ? 5e-5 : 5e-3) * magnitude)
          << "token " << t << " row " << r;
    }
}

INSTANTIATE_TEST_SUITE_P(Types, KQuantInt8Matmul,
                         ::testing::Combine(::testing::Values(DType::Q4_K, DType::Q5_K,
                                                              DType::Q6_K),
                                            ::testing::Values(8, 16)),
                         testing::int8_case_name);

// The fp32 kernels: the GEMV (coop, forced on CPU devices too) for 1..4 tokens, the 8-token
// GEMM for more, against the fp64 matmul (float rounding only: 1e-5 of sum |w x|).
using KQuantFloatMatmul = testing::WeightTypeTest;

TEST_P(KQuantFloatMatmul, GemvAndGemmAgreeWithTheFp64Matmul) {
  if (kernels.int8_matmul()) kernels.set_int8_matmul(false);
  const uint32_t table = kBegin + 64;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE("rows " + std::to_string(s.rows) + " cols " + std::to_string(s.cols));
    Fixture f(dev, type, s, table);
    for (const bool coop : {true, false}) {
      kernels.set_coop_gemv(coop);
      for (const uint32_t n : {1u, 2u, 4u, 5u, 17u, 64u}) {
        SCOPED_TRACE(std::to_string(n) + " tokens" + (coop ? ", coop GEMV" : ""));
        run(kernels.matmul(f.arena.mem(), f.args(type, s, kBegin, kBegin + n, false)));
        f.arena.download();
        EXPECT_LT(
            worst_relative_error(f.wbytes, type, s, f.x, kBegin, n, f.arena.at<float>(f.y_off)),
            1e-5);
      }
    }
  }
}

// Embedding rows of a K-quant table (Q4_K_M files store token_embd as Q4_K or Q6_K) equal the
// dequantised rows to float rounding (ggml: d sc q - dmin m, the kernel may fuse it).
TEST_P(KQuantFloatMatmul, EmbedLooksUpDequantisedRows) {
  const uint32_t rows = 33, cols = 512, n = 5;
  const auto wbytes = random_kq_weights(type, rows, cols, 12);
  HostBuffer w(dev, wbytes);
  HostBuffer arena(dev, 4096 + uint64_t{n} * cols * 4);
  const int32_t ids[n] = {0, 32, 7, 7, 19};
  for (uint32_t t = 0; t < n; ++t) arena.at<int32_t>(0)[4 * t] = ids[t];
  arena.upload();
  run(kernels.embed(arena.mem(), type, w.mem(), 0, cols, 0, 4096, cols, {0, n}));
  arena.download();
  std::vector<float> row(cols);
  for (uint32_t t = 0; t < n; ++t) {
    kq_dequantize(type, wbytes.data() + size_t(ids[t]) * (wbytes.size() / rows), row.data(), cols);
    for (uint32_t i = 0; i < cols; ++i)
      ASSERT_NEAR(arena.at<float>(4096)[size_t{t} * cols + i], row[i],
                  1e-6f * (1.0f + std::fabs(row[i])))
          << "token " << t << " col " << i;
  }
}

// The tests' own dequantiser (written from ggml's) gives core's dequantize_row bits: the
// kernels' layout reading and the reference agree on every scale and quant bit.
TEST_P(KQuantFloatMatmul, TheTestsDequantiserEqualsCores) {
  const uint32_t rows = 16, cols = 1024;
  const auto wbytes = random_kq_weights(type, rows, cols, 99);
  std::vector<float> mine(size_t{rows} * cols), core(size_t{rows} * cols);
  for (uint32_t r = 0; r < rows; ++r)
    kq_dequantize(type, wbytes.data() + r * (wbytes.size() / rows), mine.data() + r * cols, cols);
  dequantize_row(type, wbytes.data(), core.data(), int64_t{rows} * cols);
  for (size_t i = 0; i < mine.size(); ++i) ASSERT_EQ(mine[i], core[i]) << "weight " << i;
}

INSTANTIATE_TEST_SUITE_P(Types, KQuantFloatMatmul,
                         ::testing::Values(DType::Q4_K, DType::Q5_K, DType::Q6_K),
                         testing::dtype_case_name);

// Q4_1, Q5_0, Q5_1 (the mixes' fallbacks; fp32 kernels on every device, matmul_qx.cl): the GEMV
// (coop and per-row), the GEMMs and the embedding lookup against core's quantiser and
// dequantiser, on odd shapes.
using LegacyQuantMatmul = testing::WeightTypeTest;

TEST_P(LegacyQuantMatmul, GemvGemmAndEmbedAgreeWithTheDequantisedWeights) {
  for (const Shape& s : {Shape{1, 32, 0, 1}, Shape{31, 96, 0, 31}, Shape{257, 160, 3, 250}}) {
    SCOPED_TRACE("rows " + std::to_string(s.rows) + " cols " + std::to_string(s.cols));
    testing::expect_dequantised_matmuls_and_embed(dev, kernels, type, s, /*embed_exact=*/false);
  }
}

INSTANTIATE_TEST_SUITE_P(Types, LegacyQuantMatmul,
                         ::testing::Values(DType::Q4_1, DType::Q5_0, DType::Q5_1),
                         testing::dtype_case_name);

}  // namespace
}  // namespace duet::gpu
