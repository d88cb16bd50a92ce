// The 8-bit activation matmul of CPU devices (matmul_int8.cl, issue 7):
// - batch invariance: every token's output row of a launch of n tokens (1..20, any place in a
//   tile, Logits rows from the token table too) has the bits of that token computed alone;
// - the tiled weight layout (tiled_weights.h: what the runner uses) gives the file layout's bits,
//   for row ranges that start and end inside a 16-row group too;
// - the VNNI and the portable kernels give the same bits;
// - the bits are those of the documented algorithm, emulated here on the host (8-bit blocks,
//   exact int32 block dots, one fma per block in block order);
// - and the result stays close to the fp32 matmul of the unquantised input;
// - F16/F32 weights (fp32 kernels): batch invariance too;
// - the activation bits per matmul role, and the reuse of a quantised input (gpu_kernels.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/base/error.h"
#include "core/base/fp16.h"
#include "core/model/ops.h"
#include "core/model/quant.h"
#include "services/gpu_svc/gpu_kernels.h"
#include "services/gpu_svc/tiled_weights.h"
#include "tests/gpu/gpu_test_util.h"

namespace duet::gpu {
namespace {

using testing::int8_path_available;
using Shape = testing::MatmulShape;

// The documented algorithm on the host: quantise each 32-value block of x (d = amax / 127 for
// 8 bits, amax / (127 * 256) for 16; q = round-half-even(x / d)), exact integer block dots,
// acc = fma((float)dot, d_w * d_x, acc).
float emulate(DType type, const uint8_t* wrow, const float* x, uint32_t k, int bits) {
  float acc = 0.0f;
  const size_t bb = type == DType::Q4_0 ? sizeof(BlockQ4_0) : sizeof(BlockQ8_0);
  for (uint32_t b = 0; b < k / kQK; ++b) {
    const float* xb = x + b * kQK;
    float amax = 0.0f;
    for (uint32_t i = 0; i < kQK; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
    const float d = amax / (bits == 16 ? 32512.0f : 127.0f);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint8_t* p = wrow + b * bb;
    uint16_t dh;
    std::memcpy(&dh, p, 2);
    int32_t dot = 0;
    for (uint32_t i = 0; i < kQK; ++i) {
      const auto q = static_cast<int32_t>(std::nearbyint(xb[i] * id));
      const int32_t wq = type == DType::Q4_0 ? ((i < 16 ? p[2 + i] & 15 : p[2 + i - 16] >> 4) - 8)
                                             : static_cast<int8_t>(p[2 + i]);
      dot += wq * q;
    }
    acc = std::fma(static_cast<float>(dot), fp16_to_fp32(dh) * d, acc);
  }
  return acc;
}

// The arena of a matmul of n tokens: x's n rows (cols floats each) at x_off, uploaded; the n
// output rows (`rows` floats each) at y_off; then `extra` bytes.
class MatmulArena : public HostBuffer {
 public:
  MatmulArena(ClDevice& dev, const std::vector<float>& x, uint32_t n, uint32_t cols, uint32_t rows,
              uint64_t extra = 0)
      : HostBuffer(dev, 4096 + uint64_t{n} * (cols + rows) * 4 + extra),
        x_off(4096),
        y_off(x_off + uint64_t{n} * cols * 4) {
    std::memcpy(at(x_off), x.data(), x.size() * 4);
    upload();
  }
  const uint64_t x_off, y_off;
};

using Int8Matmul = testing::Int8MatmulTest;

// n tokens in [1, 20] at t_begin 3 of a table of 23; each launch's rows against the one-token
// launches of the same tokens, for both ISAs, and the one-token outputs against the emulation.
TEST_P(Int8Matmul, EveryTokenOfABatchMatchesItselfAloneBitForBit) {
  const std::vector<GpuKernels::Int8Isa> isas = integer_isas();
  // 45 rows from 3: two full 16-row items and a partial one; 7 blocks a row (odd).
  for (const Shape s : {Shape{48, 224, 3, 48}, Shape{40, 64, 0, 40}, Shape{17, 32, 1, 17}}) {
    SCOPED_TRACE("rows " + std::to_string(s.rows) + " cols " + std::to_string(s.cols));
    const auto wbytes = random_weights(type, s.rows, s.cols, 11);
    HostBuffer w(dev, 2 + wbytes.size());  // 2-byte offset: blocks at unaligned addresses
    std::memcpy(w.at(2), wbytes.data(), wbytes.size());
    w.upload();
    const TiledTensor tiled(dev, type, s.rows, s.cols, wbytes.data());
    constexpr uint32_t kTable = 23, kBegin = 3;
    auto x = random_floats(size_t{kTable} * s.cols, 5, 2.0f);
    x[size_t{kBegin} * s.cols + 5] = 0.0f;  // a block of zeros: scale 0
    for (uint32_t i = 0; i < kQK; ++i) x[size_t{kBegin + 1} * s.cols + i] = 0.0f;
    const uint64_t tok_off = 0, x_off = 4096, y_off = x_off + uint64_t{kTable} * s.cols * 4;
    const uint64_t alone_off = y_off + uint64_t{kTable} * s.rows * 4;
    HostBuffer arena(dev,
                     alone_off + uint64_t{kTable} * s.rows * 4 * isas.size());  // a table per ISA
    std::memcpy(arena.at(x_off), x.data(), x.size() * 4);
    auto* tok = arena.at<int32_t>(tok_off);
    for (uint32_t t = 0; t < kTable; ++t)  // Logits rows: reversed, every third token none
      tok[4 * t + 3] = t % 3 == 1 ? -1 : static_cast<int32_t>(kTable - 1 - t);
    arena.upload();
    auto args = [&](uint32_t t0, uint32_t t1, uint64_t out, bool table, bool tiled_layout = false) {
      MatmulArgs a{type,   w.mem(),     2,         s.cols,   x_off,   s.cols, out,
                   s.rows, s.row_begin, s.row_end, {t0, t1}, tok_off, table};
      if (tiled_layout) a.tiled = tiled.mem();
      return a;
    };
    std::vector<std::vector<float>> alone(isas.size());
    for (size_t v = 0; v < isas.size(); ++v) {
      kernels.set_int8_isa(isas[v]);
      for (uint32_t t = kBegin; t < kTable; ++t)
        run(kernels.matmul(arena.mem(),
                           args(t, t + 1, alone_off + v * kTable * s.rows * 4, false)));
      arena.download();
      const float* a = arena.at<float>(alone_off + v * kTable * s.rows * 4);
      alone[v].assign(a, a + size_t{kTable} * s.rows);
    }
    // The ISAs agree, and the one-token kernel computes the documented algorithm.
    for (size_t v = 1; v < isas.size(); ++v)
      ASSERT_EQ(0, std::memcmp(alone[0].data(), alone[v].data(), alone[0].size() * 4))
          << GpuKernels::int8_isa_name(isas[v]) << " and portable kernels differ";
    const size_t row_bytes = wbytes.size() / s.rows;
    for (uint32_t t = kBegin; t < kTable; ++t)
      for (uint32_t r = s.row_begin; r < s.row_end; ++r) {
        const float want = emulate(type, wbytes.data() + r * row_bytes,
                                   x.data() + size_t{t} * s.cols, s.cols, bits);
        ASSERT_EQ(want, alone[0][size_t{t} * s.rows + r]) << "token " << t << " row " << r;
      }
    for (size_t v = 0; v < isas.size() * 2; ++v) {
      const bool tiled_layout = v >= isas.size();
      kernels.set_int8_isa(isas[v % isas.size()]);
      SCOPED_TRACE(std::string(GpuKernels::int8_isa_name(isas[v % isas.size()])) +
                   (tiled_layout ? ", tiled weights" : ""));
      for (uint32_t n = 1; n <= kTable - kBegin; ++n)
        for (const bool table : {false, true}) {
          std::fill(arena.at<float>(y_off), arena.at<float>(y_off) + size_t{kTable} * s.rows,
                    -7.0f);
          arena.upload();
          run(kernels.matmul(arena.mem(), args(kBegin, kBegin + n, y_off, table, tiled_layout)));
          arena.download();
          for (uint32_t t = kBegin; t < kBegin + n; ++t) {
            const int32_t out = table ? tok[4 * t + 3] : static_cast<int32_t>(t);
            if (out < 0) continue;
            for (uint32_t r = s.row_begin; r < s.row_end; ++r) {
              const float got = arena.at<float>(y_off)[size_t(out) * s.rows + r];
              const float want = alone[v % isas.size()][size_t{t} * s.rows + r];
              ASSERT_EQ(0, std::memcmp(&got, &want, 4))
                  << "n " << n << " token " << t << " row " << r << (table ? " (table)" : "")
                  << ": " << got << " vs alone " << want;
            }
          }
          // Rows outside [row_begin, row_end) and tokens without a logits row stay untouched.
          for (uint32_t t = 0; t < kTable; ++t)
            for (uint32_t r = 0; r < s.rows; ++r) {
              bool written = false;
              for (uint32_t u = kBegin; u < kBegin + n; ++u) {
                const int32_t out = table ? tok[4 * u + 3] : static_cast<int32_t>(u);
                written |= out == static_cast<int32_t>(t) && r >= s.row_begin && r < s.row_end;
              }
              if (!written) {
                ASSERT_EQ(arena.at<float>(y_off)[size_t{t} * s.rows + r], -7.0f);
              }
            }
        }
    }
  }
}

// F16/F32 weights (the fp32 kernels of matmul.cl): the GEMV keeps the GEMM tile's order, so a
// token's row has the same bits alone and in any launch of 1..20 tokens.
TEST(FloatMatmul, EveryTokenOfABatchMatchesItselfAloneBitForBit) {
  ClDevice& dev = shared_device();
  GpuKernels kernels(dev);
  for (const DType type : {DType::F16, DType::F32}) {
    SCOPED_TRACE(dtype_name(type));
    const uint32_t rows = 37, cols = 160, table = 21;
    const auto wbytes = random_weights(type, rows, cols, 4);
    HostBuffer w(dev, wbytes);
    const auto x = random_floats(size_t{table} * cols, 8, 2.0f);
    MatmulArena arena(dev, x, table, cols, rows, uint64_t{table} * rows * 4);
    const uint64_t alone_off = arena.y_off + uint64_t{table} * rows * 4;
    auto args = [&](uint32_t t0, uint32_t t1, uint64_t out) {
      return MatmulArgs{type, w.mem(), 0,    cols,     arena.x_off, cols, out,
                        rows, 1,       rows, {t0, t1}, 0,           false};
    };
    for (uint32_t t = 1; t < table; ++t)
      run(kernels.matmul(arena.mem(), args(t, t + 1, alone_off)));
    for (uint32_t n = 2; n < table; ++n) {
      run(kernels.matmul(arena.mem(), args(1, 1 + n, arena.y_off)));
      arena.download();
      for (uint32_t t = 1; t < 1 + n; ++t)
        ASSERT_EQ(0, std::memcmp(arena.at<float>(arena.y_off) + size_t{t} * rows + 1,
                                 arena.at<float>(alone_off) + size_t{t} * rows + 1, (rows - 1) * 4))
            << "n " << n << " token " << t;
    }
  }
}

// Against the fp32 matmul of the unquantised input: 8-bit activations cost about 1/254 of a
// block's largest |x| per value; the error stays well under 1% of sum |w x|.
TEST_P(Int8Matmul, StaysCloseToTheFp32Matmul) {
  const uint32_t rows = 96, cols = 512, n = 9;
  const auto wbytes = random_weights(type, rows, cols, 3);
  HostBuffer w(dev, wbytes);
  const auto x = random_floats(size_t{n} * cols, 9, 1.5f);
  MatmulArena arena(dev, x, n, cols, rows);
  run(kernels.matmul(arena.mem(), testing::matmul_args(type, w.mem(), 0, rows, cols, arena.x_off,
                                                       arena.y_off, {0, n})));
  arena.download();
  std::vector<float> want(size_t{n} * rows), dense(size_t{rows} * cols);
  ops::matmul(ops::Matrix{type, rows, cols, wbytes.data()}, x.data(), n, want.data());
  dequantize_row(type, wbytes.data(), dense.data(), int64_t{rows} * cols);
  double worst = 0;
  for (uint32_t t = 0; t < n; ++t)
    for (uint32_t r = 0; r < rows; ++r) {
      double magnitude = 0;
      for (uint32_t i = 0; i < cols; ++i)
        magnitude += std::fabs(double{dense[size_t{r} * cols + i]} * x[size_t{t} * cols + i]);
      const double err = std::fabs(double{arena.at<float>(arena.y_off)[size_t{t} * rows + r]} -
                                   want[t * rows + r]);
      worst = std::max(worst, err / magnitude);
    }
  EXPECT_LT(worst, bits == 16 ? 5e-5 : 5e-3);
  EXPECT_GT(worst, 0.0) << "bit-equal to fp32: the 8-bit path did not run";
}

// The activation bits follow the matmul's role (16 for all by default; DUET_GPU_INT8_ACT_BITS
// or set_int8_act_bits(spec) set them): each role's output has the bits of the documented
// algorithm at that role's width, a matmul without a role the widest.
TEST(Int8MatmulRoles, ActivationBitsFollowTheRole) {
  ClDevice& dev = shared_device();
  GpuKernels kernels(dev);
  if (!int8_path_available(kernels)) GTEST_SKIP() << "no 8-bit path on " << dev.info().name;
  const std::vector<std::pair<MatmulRole, int>> rule = {
      {MatmulRole::q, 16},   {MatmulRole::k, 16}, {MatmulRole::v, 16},    {MatmulRole::o, 8},
      {MatmulRole::gate, 8}, {MatmulRole::up, 8}, {MatmulRole::down, 16}, {MatmulRole::logits, 8}};
  for (const auto& [role, bits] : rule) EXPECT_EQ(kernels.int8_act_bits(role), 16);
  kernels.set_int8_act_bits(std::string("16,o=8,gate=8,up=8,logits=8"));
  for (const auto& [role, bits] : rule) EXPECT_EQ(kernels.int8_act_bits(role), bits);
  EXPECT_EQ(kernels.int8_act_bits(), 16);
  const uint32_t rows = 40, cols = 256, n = 5;
  const auto wbytes = random_weights(DType::Q4_0, rows, cols, 21);
  HostBuffer w(dev, wbytes);
  const auto x = random_floats(size_t{n} * cols, 22, 3.0f);
  MatmulArena arena(dev, x, n, cols, rows);
  const size_t row_bytes = wbytes.size() / rows;
  auto check = [&](std::optional<MatmulRole> role, int bits) {
    MatmulArgs a =
        testing::matmul_args(DType::Q4_0, w.mem(), 0, rows, cols, arena.x_off, arena.y_off, {0, n});
    a.role = role;
    run(kernels.matmul(arena.mem(), a));
    arena.download();
    for (uint32_t t = 0; t < n; ++t)
      for (uint32_t r = 0; r < rows; ++r)
        ASSERT_EQ(emulate(DType::Q4_0, wbytes.data() + r * row_bytes, x.data() + size_t{t} * cols,
                          cols, bits),
                  arena.at<float>(arena.y_off)[size_t{t} * rows + r])
            << "role " << (role ? std::string(matmul_role_name(*role)) : "none") << " token " << t
            << " row " << r;
  };
  for (const auto& [role, bits] : rule) check(role, bits);
  check(std::nullopt, 16);
  kernels.set_int8_act_bits(std::string("down=8,o=16"));
  check(MatmulRole::down, 8);
  check(MatmulRole::o, 16);
  check(MatmulRole::gate, 8);  // unnamed roles keep theirs
  kernels.set_int8_act_bits(std::string("16"));
  check(MatmulRole::gate, 16);
  kernels.set_int8_act_bits(std::string("8,up=16"));  // in order: every role, then up
  check(MatmulRole::gate, 8);
  check(MatmulRole::up, 16);
  kernels.set_int8_act_bits(std::string("16"));
  for (const char* bad : {"12", "down=4", "fc1=8", "down", "", "q=8,,k=8"}) try {
      kernels.set_int8_act_bits(std::string(bad));
      ADD_FAILURE() << "spec '" << bad << "' accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument) << bad;
    }
  check(MatmulRole::gate, 16);  // a rejected spec changes nothing
}

// reuse_quantized_inputs(): consecutive matmuls of the same input rows quantise them once, and
// a matmul that writes over its input (or any other op) makes the next one quantise again.
TEST(Int8MatmulRoles, AQuantisedInputIsReusedOnlyWhileItIsCurrent) {
  ClDevice& dev = shared_device();
  GpuKernels kernels(dev);
  if (!int8_path_available(kernels)) GTEST_SKIP() << "no 8-bit path on " << dev.info().name;
  const uint32_t dim = 128, n = 6;
  const auto w1 = random_weights(DType::Q4_0, dim, dim, 31),
             w2 = random_weights(DType::Q8_0, dim, dim, 32);
  HostBuffer w(dev, w1.size() + w2.size());
  std::memcpy(w.at(0), w1.data(), w1.size());
  std::memcpy(w.at(w1.size()), w2.data(), w2.size());
  w.upload();
  auto x = random_floats(size_t{n} * dim, 33, 2.0f);
  MatmulArena arena(dev, x, n, dim, dim);
  kernels.reuse_quantized_inputs();
  // y = W x for weights (type, offset) from input rows at `in` to rows at `out`, checked
  // against the emulation on what the input rows held.
  auto step = [&](DType type, uint64_t w_off, MatmulRole role, uint64_t in, uint64_t out) {
    arena.download();
    const std::vector<float> input(arena.at<float>(in), arena.at<float>(in) + size_t{n} * dim);
    MatmulArgs a = testing::matmul_args(type, w.mem(), w_off, dim, dim, in, out, {0, n});
    a.role = role;
    run(kernels.matmul(arena.mem(), a));
    arena.download();
    const uint8_t* wb = (type == DType::Q4_0 ? w1.data() : w2.data());
    const size_t row_bytes = dtype_row_bytes(type, dim);
    for (uint32_t t = 0; t < n; ++t)
      for (uint32_t r = 0; r < dim; ++r)
        ASSERT_EQ(emulate(type, wb + r * row_bytes, input.data() + size_t{t} * dim, dim,
                          kernels.int8_act_bits(role)),
                  arena.at<float>(out)[size_t{t} * dim + r])
            << matmul_role_name(role) << " token " << t << " row " << r;
  };
  step(DType::Q4_0, 0, MatmulRole::q, arena.x_off, arena.y_off);
  step(DType::Q4_0, 0, MatmulRole::k, arena.x_off, arena.y_off);          // reused
  step(DType::Q8_0, w1.size(), MatmulRole::v, arena.x_off, arena.y_off);  // another zero point
  step(DType::Q4_0, 0, MatmulRole::gate, arena.x_off, arena.y_off);       // 8 bits
  step(DType::Q4_0, 0, MatmulRole::up, arena.x_off, arena.x_off);         // overwrites its input
  step(DType::Q4_0, 0, MatmulRole::gate, arena.x_off, arena.y_off);       // so quantises again
  // An op that writes the input rows through these kernels.
  run(kernels.add(arena.mem(), arena.y_off, dim, arena.y_off, dim, arena.x_off, dim, dim, {0, n}));
  step(DType::Q4_0, 0, MatmulRole::up, arena.x_off, arena.y_off);
}

INSTANTIATE_TEST_SUITE_P(Types, Int8Matmul,
                         ::testing::Combine(::testing::Values(DType::Q4_0, DType::Q8_0),
                                            ::testing::Values(8, 16)),
                         testing::int8_case_name);

}  // namespace
}  // namespace duet::gpu
