// The packed weight layout of discrete GPUs (services/gpu_svc/weight_pack.h) and the kernels
// that read it (kernels/matmul_gpu.cl), here on PoCL: packing puts every byte where the layout
// says; GEMV (every tuning variant), GEMM, row and token ranges, Logits and embedding lookup
// over packed Q4_0/Q8_0 equal core/model/ops on the file's bytes; the fast F16/F32 GEMV too; the
// runner's packing record refuses overlapping tensors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/base/error.h"
#include "core/model/ops.h"
#include "core/model/quant.h"
#include "services/gpu_svc/gpu_kernels.h"
#include "services/gpu_svc/weight_pack.h"
#include "tests/gpu/gpu_test_util.h"

namespace duet::gpu {
namespace {

float max_abs(const std::vector<float>& v) {
  float m = 1;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

TEST(WeightPack, PutsQuantsThenScalesRowMajor) {
  for (DType type : {DType::Q4_0, DType::Q8_0}) {
    const uint32_t rows = 3, cols = 96, nb = cols / kQK;
    const auto file = random_weights(type, rows, cols, 3);
    std::vector<uint8_t> packed(file.size(), 0xEE);
    pack_weights(type, rows, cols, file.data(), packed.data());
    const uint32_t q = packed_quant_bytes(type);
    EXPECT_EQ(q, type == DType::Q4_0 ? 16u : 32u);
    for (uint32_t blk = 0; blk < rows * nb; ++blk) {
      const uint8_t* block = file.data() + blk * (q + 2);
      EXPECT_EQ(std::memcmp(packed.data() + blk * q, block + 2, q), 0) << blk;
      EXPECT_EQ(std::memcmp(packed.data() + rows * nb * q + blk * 2, block, 2), 0) << blk;
    }
  }
  std::vector<uint8_t> buf(128);
  EXPECT_THROW(pack_weights(DType::F16, 1, 32, buf.data(), buf.data()), Error);
  EXPECT_THROW(pack_weights(DType::Q4_0, 1, 48, buf.data(), buf.data()), Error);
  EXPECT_FALSE(has_packed_layout(DType::F32));
}

class PackedKernelsTest : public ::testing::Test {
 protected:
  ClDevice& dev = shared_device();
  GpuKernels k{dev};
};

// y = W x over packed weights at a 16-byte aligned, non-zero offset: every GEMV variant (1 and
// 3 tokens), the tiled kernels (5 and 33 tokens), a row range and a token range; x rows both
// 16-byte aligned and not (the kernels' vload path).
TEST_F(PackedKernelsTest, MatmulOverPackedWeightsMatchesReference) {
  const uint32_t w_off = 48;
  for (DType type : {DType::Q4_0, DType::Q8_0}) {
    for (uint32_t rows : {1u, 31u, 33u, 257u}) {
      for (uint32_t k_in : {96u, 1024u}) {
        const auto file = random_weights(type, rows, k_in, rows + k_in);
        HostBuffer w(dev, w_off + file.size());
        pack_weights(type, rows, k_in, file.data(), w.at(w_off));
        w.upload();
        const ops::Matrix m{type, rows, k_in, file.data()};
        for (uint32_t n : {1u, 3u, 5u, 33u}) {
          for (uint64_t x_off : {uint64_t{4096}, uint64_t{4100}}) {
            const auto x = random_floats(size_t{n} * k_in, n + k_in);
            const uint64_t y_off = 8192 + uint64_t{n} * k_in * 4;
            HostBuffer arena(dev, y_off + uint64_t{n} * rows * 4);
            std::memcpy(arena.at(x_off), x.data(), x.size() * 4);
            std::vector<float> want(size_t{n} * rows);
            ops::matmul(m, x.data(), static_cast<int>(n), want.data());
            const float tol = 2e-5f * max_abs(want);
            // Rows [r0, r1) and tokens [t0, n): the rest of y must stay untouched.
            const uint32_t r0 = rows > 2 ? 1 : 0, r1 = rows > 2 ? rows - 1 : rows;
            const uint32_t t0 = n > 2 ? 1 : 0;
            for (bool coop : {false, true}) {
              for (const char* variant : GpuKernels::kGemvVariants) {
                if (!coop && std::string(variant) != GpuKernels::kGemvVariants[0]) continue;
                k.set_coop_gemv(coop);
                k.set_gemv_variant(variant);
                std::fill(arena.at<float>(y_off), arena.at<float>(y_off) + n * rows, -7.0f);
                arena.upload();
                MatmulArgs a =
                    testing::matmul_args(type, w.mem(), w_off, rows, k_in, x_off, y_off, {t0, n});
                a.row_begin = r0;
                a.row_end = r1;
                a.packed_rows = rows;
                run(k.matmul(arena.mem(), a));
                arena.download();
                const float* y = arena.at<float>(y_off);
                float worst = 0;
                bool outside_written = false;
                for (uint32_t t = 0; t < n; ++t)
                  for (uint32_t r = 0; r < rows; ++r) {
                    const float got = y[size_t{t} * rows + r];
                    if (t >= t0 && r >= r0 && r < r1)
                      worst = std::max(worst, std::fabs(got - want[size_t{t} * rows + r]));
                    else if (got != -7.0f)
                      outside_written = true;
                  }
                EXPECT_LT(worst, tol)
                    << dtype_name(type) << " rows=" << rows << " k=" << k_in << " n=" << n
                    << " x_off=" << x_off << " coop=" << coop << " " << variant;
                EXPECT_FALSE(outside_written) << dtype_name(type) << " rows=" << rows << " n=" << n
                                              << " coop=" << coop << " " << variant;
              }
            }
          }
        }
      }
    }
  }
  k.set_gemv_variant("");  // back to the choice by shape
  EXPECT_THROW(k.set_gemv_variant("l7r3"), Error);
  // A tuning variant GpuKernels never picks is only in a program built for gpu_bench.
  EXPECT_THROW(k.set_gemv_variant("l32r4"), Error);
}

// The fast GEMV for F16/F32 rows at a 16-byte aligned offset (the file's layout).
TEST_F(PackedKernelsTest, AlignedFloatGemvMatchesReference) {
  k.set_coop_gemv(true);
  for (DType type : {DType::F16, DType::F32}) {
    const uint32_t rows = 33, k_in = 160, n = 3;
    const auto file = random_weights(type, rows, k_in, 21);
    HostBuffer w(dev, 32 + file.size());
    std::memcpy(w.at(32), file.data(), file.size());
    w.upload();
    const auto x = random_floats(size_t{n} * k_in, 22);
    const uint64_t x_off = 4096, y_off = x_off + uint64_t{n} * k_in * 4;
    HostBuffer arena(dev, y_off + uint64_t{n} * rows * 4);
    std::memcpy(arena.at(x_off), x.data(), x.size() * 4);
    arena.upload();
    std::vector<float> want(size_t{n} * rows);
    ops::matmul(ops::Matrix{type, rows, k_in, file.data()}, x.data(), n, want.data());
    for (const char* variant : GpuKernels::kGemvVariants) {
      k.set_gemv_variant(variant);
      MatmulArgs a{type, w.mem(), 32, k_in, x_off, k_in, y_off, rows, 0, rows, {0, n}, 0, false};
      run(k.matmul(arena.mem(), a));
      arena.download();
      float worst = 0;
      for (size_t i = 0; i < want.size(); ++i)
        worst = std::max(worst, std::fabs(arena.at<float>(y_off)[i] - want[i]));
      EXPECT_LT(worst, 2e-5f * max_abs(want)) << dtype_name(type) << " " << variant;
    }
  }
}

// Logits over a packed table with the GPU GEMV: only tokens with a logits row write, there.
TEST_F(PackedKernelsTest, PackedLogitsWriteOnlyTokensWithALogitsRow) {
  const uint32_t vocab = 257, k_in = 64, n = 3;
  const auto file = random_weights(DType::Q4_0, vocab, k_in, 9);
  HostBuffer w(dev, file.size());
  pack_weights(DType::Q4_0, vocab, k_in, file.data(), w.at(0));
  w.upload();
  const auto x = random_floats(n * k_in, 10);
  const uint64_t x_off = 4096, y_off = x_off + n * k_in * 4;
  HostBuffer arena(dev, y_off + 2 * vocab * 4);
  const int32_t table[n][4] = {{0, 0, 0, 1}, {0, 1, 0, -1}, {0, 2, 0, 0}};  // token 2 -> row 0
  std::memcpy(arena.at(0), table, sizeof table);
  std::memcpy(arena.at(x_off), x.data(), x.size() * 4);
  arena.upload();
  k.set_coop_gemv(true);
  MatmulArgs a{DType::Q4_0, w.mem(), 0, k_in, x_off, k_in, y_off, vocab, 0, vocab, {0, n}, 0, true};
  a.packed_rows = vocab;
  run(k.matmul(arena.mem(), a));
  arena.download();
  const ops::Matrix m{DType::Q4_0, vocab, k_in, file.data()};
  std::vector<float> want(vocab);
  for (auto [token, row] : {std::pair{2u, 0u}, std::pair{0u, 1u}}) {
    ops::matmul(m, x.data() + token * k_in, 1, want.data());
    float worst = 0;
    for (uint32_t r = 0; r < vocab; ++r)
      worst = std::max(worst, std::fabs(arena.at<float>(y_off)[row * vocab + r] - want[r]));
    EXPECT_LT(worst, 1e-4f) << "token " << token;
  }
}

TEST_F(PackedKernelsTest, EmbedFromPackedTableMatchesDequantisedRows) {
  const uint32_t vocab = 61, cols = 96, n = 33;
  for (DType type : {DType::Q4_0, DType::Q8_0}) {
    const auto file = random_weights(type, vocab, cols, 4);
    HostBuffer w(dev, 16 + file.size());
    pack_weights(type, vocab, cols, file.data(), w.at(16));
    w.upload();
    HostBuffer arena(dev, 4096 + n * cols * 4);
    for (uint32_t t = 0; t < n; ++t) arena.at<int32_t>(0)[4 * t] = (t * 17 + 5) % vocab;
    arena.upload();
    run(k.embed(arena.mem(), type, w.mem(), 16, cols, 0, 4096, cols, {0, n}, vocab));
    arena.download();
    std::vector<float> want(cols);
    for (uint32_t t = 0; t < n; ++t) {
      const uint32_t id = (t * 17 + 5) % vocab;
      dequantize_row(type, file.data() + id * dtype_row_bytes(type, cols), want.data(), cols);
      EXPECT_EQ(std::memcmp(arena.at<float>(4096) + t * cols, want.data(), cols * 4), 0)
          << dtype_name(type) << " token " << t;
    }
  }
}

// The runner's record packs each tensor once and refuses one overlapping a packed tensor.
TEST_F(PackedKernelsTest, PackedWeightsPackOnceAndRefuseOverlaps) {
  const uint32_t rows = 4, cols = 64;
  const uint64_t tensor_bytes = rows * dtype_row_bytes(DType::Q8_0, cols);
  const auto file = random_weights(DType::Q8_0, 2 * rows, cols, 8);
  HostBuffer w(dev, file.size());
  std::memcpy(w.at(0), file.data(), file.size());
  w.upload();
  auto program_with = [&](uint64_t offset, uint32_t n_rows, DType type) {
    fb::ProgramT p;
    auto op = std::make_unique<fb::OpT>();
    op->kind = fb::OpKind::MatMul;
    op->weight = std::make_unique<fb::TensorRef>(
        fb::SegmentKind::Weights, static_cast<fb::DTypeCode>(type), offset, n_rows, cols, 0);
    p.ops.push_back(std::move(op));
    return p;
  };
  PackedWeights packed;
  packed.pack_program(dev, w.mem(), file.data(), program_with(0, rows, DType::Q8_0));
  packed.pack_program(dev, w.mem(), file.data(), program_with(0, rows, DType::Q8_0));  // again
  EXPECT_EQ(packed.rows(w.mem(), 0), rows);
  EXPECT_EQ(packed.rows(w.mem(), tensor_bytes), 0u);
  EXPECT_THROW(packed.pack_program(dev, w.mem(), file.data(), program_with(0, 2, DType::Q8_0)),
               Error);
  EXPECT_THROW(packed.pack_program(dev, w.mem(), file.data(), program_with(64, 2, DType::Q8_0)),
               Error);
  // Unaligned tensors and F16 weights keep the file's layout.
  packed.pack_program(dev, w.mem(), file.data(), program_with(tensor_bytes + 8, 1, DType::Q8_0));
  EXPECT_EQ(packed.rows(w.mem(), tensor_bytes + 8), 0u);
  packed.pack_program(dev, w.mem(), file.data(), program_with(tensor_bytes + 16, 1, DType::F16));
  EXPECT_EQ(packed.rows(w.mem(), tensor_bytes + 16), 0u);
  // The packed bytes are on the device, the rest untouched.
  w.download();
  std::vector<uint8_t> want(tensor_bytes);
  pack_weights(DType::Q8_0, rows, cols, file.data(), want.data());
  EXPECT_EQ(std::memcmp(w.at(0), want.data(), tensor_bytes), 0);
  EXPECT_EQ(std::memcmp(w.at(tensor_bytes), file.data() + tensor_bytes, tensor_bytes), 0);
}

}  // namespace
}  // namespace duet::gpu
