// Every gpu_svc kernel against its core reference op (core/model/ops.h), over odd sizes (1, 31, 33,
// 257 tokens or rows) and every weight type the kernels read.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/model/ops.h"
#include "services/gpu_svc/gpu_kernels.h"
#include "tests/gpu/gpu_test_util.h"

namespace duet::gpu {
namespace {

const DType kTypes[] = {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0};
const uint32_t kOddCounts[] = {1, 31, 33, 257};
constexpr uint64_t kActs = 8192;  // activations start after the token table (257 x 16 bytes)

float max_abs_diff(const float* a, const float* b, size_t n) {
  float d = 0;
  for (size_t i = 0; i < n; ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

// The token table: id, position, sequence, logits row.
void fill_tokens(int32_t* tok, uint32_t n, uint32_t vocab, int32_t first_pos) {
  for (uint32_t t = 0; t < n; ++t) {
    tok[4 * t + 0] = static_cast<int32_t>((t * 7919u + 3u) % vocab);
    tok[4 * t + 1] = first_pos + static_cast<int32_t>(t);
    tok[4 * t + 2] = 0;
    tok[4 * t + 3] = static_cast<int32_t>(t);
  }
}

class GpuKernelsTest : public ::testing::Test {
 protected:
  using GatedKernel = cl_event (GpuKernels::*)(cl_mem, uint64_t, uint32_t, uint64_t, uint32_t,
                                               uint64_t, uint32_t, uint32_t, TokenRange);
  using GatedOp = void (*)(const float*, const float*, int64_t, float*);
  // A gated activation out = act(g) * u of n tokens x cols (g at 0 of `arena`, u after it, out
  // after u) against the reference op: the largest difference.
  float gated_diff(HostBuffer& arena, GatedKernel kernel, GatedOp reference,
                   const std::vector<float>& g, const std::vector<float>& u, uint32_t cols,
                   uint32_t n) {
    const size_t count = g.size();
    std::memcpy(arena.at(0), g.data(), count * 4);
    std::memcpy(arena.at(count * 4), u.data(), count * 4);
    arena.upload();
    run((k.*kernel)(arena.mem(), 0, cols, count * 4, cols, 2 * count * 4, cols, cols, {0, n}));
    arena.download();
    std::vector<float> want(count);
    reference(g.data(), u.data(), static_cast<int64_t>(count), want.data());
    return max_abs_diff(arena.at<float>(2 * count * 4), want.data(), count);
  }

  ClDevice& dev = shared_device();
  GpuKernels k{dev};
};

TEST_F(GpuKernelsTest, EmbedMatchesReferenceForEveryType) {
  const uint32_t vocab = 61, cols = 96;
  for (DType type : kTypes) {
    const auto table = random_weights(type, vocab, cols, 1);
    HostBuffer w(dev, table.size());
    std::memcpy(w.at(0), table.data(), table.size());
    w.upload();
    for (uint32_t n : kOddCounts) {
      HostBuffer arena(dev, kActs + n * cols * 4);
      fill_tokens(arena.at<int32_t>(0), n, vocab, 0);
      arena.upload();
      run(k.embed(arena.mem(), type, w.mem(), 0, cols, 0, kActs, cols, {0, n}));
      arena.download();
      std::vector<int32_t> ids(n);
      for (uint32_t t = 0; t < n; ++t) ids[t] = arena.at<int32_t>(0)[4 * t];
      std::vector<float> want(n * cols);
      ops::embed(ops::Matrix{type, vocab, cols, table.data()}, ids.data(), static_cast<int>(n),
                 want.data());
      EXPECT_EQ(max_abs_diff(arena.at<float>(kActs), want.data(), want.size()), 0.0f)
          << dtype_name(type) << " n=" << n;
    }
  }
}

TEST_F(GpuKernelsTest, RmsNormMatchesReferenceIncludingOddWidths) {
  for (uint32_t dim : {256u, 33u, 1u}) {
    for (uint32_t n : kOddCounts) {
      const auto x = random_floats(n * dim, n + dim, 3.0f);
      const auto weight = random_floats(dim, 7);
      HostBuffer arena(dev, 2 * n * dim * 4 + 64);
      HostBuffer w(dev, dim * 4);
      std::memcpy(arena.at(0), x.data(), x.size() * 4);
      std::memcpy(w.at(0), weight.data(), dim * 4);
      arena.upload();
      w.upload();
      const uint64_t out = uint64_t{n} * dim * 4;
      run(k.rmsnorm(arena.mem(), 0, dim, out, dim, w.mem(), 0, dim, 1e-5f, {0, n}));
      arena.download();
      std::vector<float> want(n * dim);
      ops::rmsnorm(x.data(), weight.data(), static_cast<int>(n), static_cast<int>(dim), 1e-5f,
                   want.data());
      EXPECT_LT(max_abs_diff(arena.at<float>(out), want.data(), want.size()), 2e-5f)
          << "dim=" << dim << " n=" << n;
    }
  }
}

TEST_F(GpuKernelsTest, RopeMatchesReferenceAtLongPositions) {
  const uint32_t n_heads = 3, head_dim = 64, width = n_heads * head_dim;
  for (uint32_t n : kOddCounts) {
    HostBuffer arena(dev, kActs + n * width * 4);
    fill_tokens(arena.at<int32_t>(0), n, 100, 300);  // positions 300..
    const auto x = random_floats(n * width, n);
    std::memcpy(arena.at(kActs), x.data(), x.size() * 4);
    arena.upload();
    run(k.rope(arena.mem(), kActs, width, n_heads, head_dim,
               RopeArgs{10000.0f, 1.0f, 0, arena.mem(), 0, false}, 0, {0, n}));
    arena.download();
    std::vector<float> want = x;
    std::vector<int32_t> pos(n);
    for (uint32_t t = 0; t < n; ++t) pos[t] = arena.at<int32_t>(0)[4 * t + 1];
    ops::rope(want.data(), static_cast<int>(n), n_heads, head_dim, pos.data(),
              ops::RopeParams{10000.0f});
    EXPECT_LT(max_abs_diff(arena.at<float>(kActs), want.data(), want.size()), 1e-5f) << "n=" << n;
  }
}

// Qwen2's NEOX pairing, Llama 3's rope_freqs (read from the weights buffer) and linear scaling,
// alone and together.
TEST_F(GpuKernelsTest, RopeModesScalesAndFreqFactorsMatchReference) {
  const uint32_t n_heads = 2, head_dim = 32, width = n_heads * head_dim;
  std::vector<float> factors(head_dim / 2);
  for (uint32_t i = 0; i < head_dim / 2; ++i) factors[i] = 1.0f + 31.0f * i / (head_dim / 2 - 1);
  HostBuffer weights(dev, 64 + factors.size() * 4);
  std::memcpy(weights.at(64), factors.data(), factors.size() * 4);
  weights.upload();
  for (ops::RopeMode mode : {ops::RopeMode::normal, ops::RopeMode::neox}) {
    for (bool scaled : {false, true}) {
      for (uint32_t n : kOddCounts) {
        HostBuffer arena(dev, kActs + n * width * 4);
        fill_tokens(arena.at<int32_t>(0), n, 100, 700);
        const auto x = random_floats(n * width, n + 5);
        std::memcpy(arena.at(kActs), x.data(), x.size() * 4);
        arena.upload();
        const RopeArgs r{
            500000.0f, scaled ? 0.25f : 1.0f, static_cast<uint32_t>(mode), weights.mem(), 64,
            scaled};
        run(k.rope(arena.mem(), kActs, width, n_heads, head_dim, r, 0, {0, n}));
        arena.download();
        std::vector<float> want = x;
        std::vector<int32_t> pos(n);
        for (uint32_t t = 0; t < n; ++t) pos[t] = arena.at<int32_t>(0)[4 * t + 1];
        ops::rope(
            want.data(), static_cast<int>(n), n_heads, head_dim, pos.data(),
            ops::RopeParams{500000.0f, r.freq_scale, scaled ? factors.data() : nullptr, mode});
        EXPECT_LT(max_abs_diff(arena.at<float>(kActs), want.data(), want.size()), 1e-5f)
            << "mode=" << static_cast<int>(mode) << " scaled=" << scaled << " n=" << n;
      }
    }
  }
}

TEST_F(GpuKernelsTest, AddBiasAddsTheWeightsVectorToEveryTokenRow) {
  const uint32_t cols = 96;
  const auto bias = random_floats(cols, 3, 2.0f);
  HostBuffer weights(dev, 32 + cols * 4);
  std::memcpy(weights.at(32), bias.data(), cols * 4);
  weights.upload();
  for (uint32_t n : kOddCounts) {
    const auto x = random_floats(size_t{n} * cols, n);
    HostBuffer arena(dev, x.size() * 4);
    std::memcpy(arena.at(0), x.data(), x.size() * 4);
    arena.upload();
    run(k.add_bias(arena.mem(), 0, cols, weights.mem(), 32, cols, {0, n}));
    arena.download();
    std::vector<float> want = x;
    ops::add_bias(want.data(), bias.data(), static_cast<int>(n), cols);
    EXPECT_LT(max_abs_diff(arena.at<float>(0), want.data(), want.size()), 1e-6f) << "n=" << n;
  }
}

// 96 columns: CPU devices with the integer path run SwiGLU by 32-value blocks (swiglu_blocks).
TEST_F(GpuKernelsTest, SwiGluAndAddMatchReference) {
  for (uint32_t cols : {33u, 96u})
    for (uint32_t n : kOddCounts) {
      const size_t count = size_t{n} * cols;
      const auto g = random_floats(count, 1, 4.0f), u = random_floats(count, 2, 4.0f);
      HostBuffer arena(dev, 3 * count * 4);
      EXPECT_LT(gated_diff(arena, &GpuKernels::swiglu, ops::swiglu, g, u, cols, n), 1e-5f)
          << "swiglu cols=" << cols << " n=" << n;

      // Residual add in place: out = in0.
      run(k.add(arena.mem(), 0, cols, count * 4, cols, 0, cols, cols, {0, n}));
      arena.download();
      std::vector<float> want = g;
      ops::add(want.data(), u.data(), static_cast<int64_t>(count));
      EXPECT_EQ(max_abs_diff(arena.at<float>(0), want.data(), count), 0.0f) << "add n=" << n;
    }
}

// Gemma's GeGLU and embedding scale against ops::geglu / ops::scale.
TEST_F(GpuKernelsTest, GegluAndScaleMatchReference) {
  const uint32_t cols = 33;
  for (uint32_t n : kOddCounts) {
    const size_t count = size_t{n} * cols;
    const auto g = random_floats(count, 3, 6.0f), u = random_floats(count, 4, 4.0f);
    HostBuffer arena(dev, 3 * count * 4);
    EXPECT_LT(gated_diff(arena, &GpuKernels::geglu, ops::geglu, g, u, cols, n), 1e-5f)
        << "geglu n=" << n;

    // Tokens [1, n) only: token 0 keeps its values.
    const float s = std::sqrt(2048.0f);
    run(k.scale(arena.mem(), 0, cols, s, cols, {1, n}));
    arena.download();
    std::vector<float> want = g;
    ops::scale(want.data() + cols, s, static_cast<int64_t>(count - cols));
    EXPECT_EQ(max_abs_diff(arena.at<float>(0), want.data(), count), 0.0f) << "scale n=" << n;
  }
}

// y = W x over every type, odd row and token counts, a row range (weight-centric split) and a
// token range (activation-centric split), checked against ops::matmul.
TEST_F(GpuKernelsTest, MatmulMatchesReferenceForTypesSizesAndSplits) {
  const uint32_t k_in = 96;
  for (bool coop : {false, true}) {
    k.set_coop_gemv(coop);  // the GPU GEMV (tokens <= 4) runs here too, whatever the device
    for (DType type : kTypes) {
      for (uint32_t rows : kOddCounts) {
        const auto wbytes = random_weights(type, rows, k_in, rows);
        HostBuffer w(dev, wbytes.size() + 64);
        std::memcpy(w.at(0), wbytes.data(), wbytes.size());
        w.upload();
        const ops::Matrix m{type, rows, k_in, wbytes.data()};
        for (uint32_t n : kOddCounts) {
          if (rows == 257 && n == 257 && type != DType::Q4_0) continue;  // one large case is enough
          const auto x = random_floats(size_t{n} * k_in, n + 11);
          const uint64_t x_off = 4096, y_off = x_off + uint64_t{n} * k_in * 4;
          HostBuffer arena(dev, y_off + uint64_t{n} * rows * 4);
          std::memcpy(arena.at(x_off), x.data(), x.size() * 4);
          arena.upload();
          run(k.matmul(arena.mem(),
                       testing::matmul_args(type, w.mem(), 0, rows, k_in, x_off, y_off, {0, n})));
          arena.download();
          std::vector<float> want(size_t{n} * rows);
          ops::matmul(m, x.data(), static_cast<int>(n), want.data());
          float scale = 1;
          for (float v : want) scale = std::max(scale, std::fabs(v));
          EXPECT_LT(max_abs_diff(arena.at<float>(y_off), want.data(), want.size()), 2e-5f * scale)
              << dtype_name(type) << " rows=" << rows << " n=" << n << " coop=" << coop;
        }
      }
    }
  }
}

TEST_F(GpuKernelsTest, MatmulWritesOnlyItsRowAndTokenRanges) {
  const uint32_t rows = 33, k_in = 64, n = 31;
  const auto wbytes = random_weights(DType::Q4_0, rows, k_in, 5);
  HostBuffer w(dev, wbytes);
  const auto x = random_floats(n * k_in, 6);
  HostBuffer arena(dev, 4096 + (n * k_in + n * rows) * 4);
  const uint64_t y_off = 4096 + n * k_in * 4;
  std::memcpy(arena.at(4096), x.data(), x.size() * 4);
  std::fill(arena.at<float>(y_off), arena.at<float>(y_off) + n * rows, -7.0f);
  arena.upload();
  MatmulArgs a{DType::Q4_0, w.mem(), 0, k_in, 4096, k_in, y_off, rows, 5, 20, {3, 17}, 0, false};
  k.set_int8_matmul(false);  // fp32 numerics here; tests/gpu_svc covers the integer kernels
  run(k.matmul(arena.mem(), a));
  k.set_coop_gemv(true);  // and the GPU GEMV on a single token of the range
  a.tokens = {16, 17};
  run(k.matmul(arena.mem(), a));
  arena.download();
  std::vector<float> want(n * rows);
  ops::matmul(ops::Matrix{DType::Q4_0, rows, k_in, wbytes.data()}, x.data(), n, want.data());
  const float* y = arena.at<float>(y_off);
  for (uint32_t t = 0; t < n; ++t)
    for (uint32_t r = 0; r < rows; ++r) {
      const bool inside = r >= 5 && r < 20 && t >= 3 && t < 17;
      if (inside)
        EXPECT_NEAR(y[t * rows + r], want[t * rows + r], 1e-4f) << t << "," << r;
      else
        EXPECT_EQ(y[t * rows + r], -7.0f) << "wrote outside its split at " << t << "," << r;
    }
}

TEST_F(GpuKernelsTest, LogitsWritesOnlyTokensWithALogitsRow) {
  const uint32_t vocab = 257, k_in = 64, n = 33;
  const auto wbytes = random_weights(DType::Q8_0, vocab, k_in, 9);
  HostBuffer w(dev, wbytes);
  const auto x = random_floats(n * k_in, 10);
  const uint64_t x_off = 4096, y_off = x_off + n * k_in * 4;
  HostBuffer arena(dev, y_off + 2 * vocab * 4);
  fill_tokens(arena.at<int32_t>(0), n, vocab, 0);
  for (uint32_t t = 0; t < n; ++t) arena.at<int32_t>(0)[4 * t + 3] = -1;
  arena.at<int32_t>(0)[4 * 12 + 3] = 1;  // token 12 -> logits row 1, token 32 -> row 0
  arena.at<int32_t>(0)[4 * 32 + 3] = 0;
  std::memcpy(arena.at(x_off), x.data(), x.size() * 4);
  arena.upload();
  MatmulArgs a{DType::Q8_0, w.mem(), 0, k_in, x_off, k_in, y_off, vocab, 0, vocab, {0, n}, 0, true};
  k.set_int8_matmul(false);  // fp32 numerics here; tests/gpu_svc covers the integer kernels
  run(k.matmul(arena.mem(), a));
  arena.download();
  k.set_coop_gemv(true);  // the GPU GEMV: token 32 alone must land in row 0 again
  std::fill(arena.at<float>(y_off), arena.at<float>(y_off) + vocab, 0.0f);
  arena.upload();
  a.tokens = {32, 33};
  run(k.matmul(arena.mem(), a));
  arena.download();
  const ops::Matrix m{DType::Q8_0, vocab, k_in, wbytes.data()};
  std::vector<float> want(vocab);
  ops::matmul(m, x.data() + 32 * k_in, 1, want.data());
  EXPECT_LT(max_abs_diff(arena.at<float>(y_off), want.data(), vocab), 1e-4f);
  ops::matmul(m, x.data() + 12 * k_in, 1, want.data());
  EXPECT_LT(max_abs_diff(arena.at<float>(y_off + vocab * 4), want.data(), vocab), 1e-4f);
}

}  // namespace
}  // namespace duet::gpu
