// The matmul kernels at the edges of the CPU path's tricks (PoCL: matmul_t1_* and
// matmul_cpu_gemm_*, which convert fp16 scales with integer ops and pick Q4_0 weights from a
// table): raw Q4_0/Q8_0 blocks with zero, negative, subnormal and large fp16 scales; rows that
// start at 2-byte offsets; row and token ranges that do not fill a GEMM tile; logits rows of -1.
// Every output is checked against ops::matmul relative to its own row's magnitude, so a row of
// subnormal-scale weights is held to the same precision as a row of large ones.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/base/fp16.h"
#include "core/model/ops.h"
#include "core/model/quant.h"
#include "services/gpu_svc/gpu_kernels.h"
#include "tests/gpu/gpu_test_util.h"

namespace duet::gpu {
namespace {

// Scales a block may carry: zero, negative, half subnormals (down to the smallest, 2^-24),
// the smallest normal, ordinary and near the top of the half range.
const float kScales[] = {0.0f,  0x1p-24f, -3.0e-6f, 6.1035156e-5f, -0.0123f,
                         0.75f, -2.5f,    60000.0f, 1.0e-5f,       -0.001f};

// rows x cols weights as raw blocks with random quants. A row's blocks share one magnitude of
// scale (kScales, cycling over rows) with alternating signs, so no row hides its tiny-scale
// blocks behind large ones.
std::vector<uint8_t> raw_blocks(DType type, uint32_t rows, uint32_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t block_bytes = type == DType::Q4_0 ? sizeof(BlockQ4_0) : sizeof(BlockQ8_0);
  const size_t row_blocks = cols / kQK, blocks = size_t{rows} * row_blocks;
  std::vector<uint8_t> out(blocks * block_bytes);
  for (size_t b = 0; b < blocks; ++b) {
    uint8_t* p = out.data() + b * block_bytes;
    const float scale = kScales[(b / row_blocks + seed) % std::size(kScales)];
    const uint16_t d = fp32_to_fp16(b % 2 ? -scale : scale);
    std::memcpy(p, &d, 2);
    for (size_t i = 2; i < block_bytes; ++i) {
      const auto v = static_cast<uint8_t>(rng());
      p[i] = type == DType::Q8_0 && v == 0x80 ? 0x81 : v;  // Q8_0 quants are in [-127, 127]
    }
  }
  return out;
}

struct Case {
  DType type;
  uint32_t tokens;
  uint64_t w_off;
  int logits_rows;  // 0: every token writes its row; 1: every third none, reversed; 2: last only
};

TEST(GpuCpuMatmul, ExtremeScalesUnalignedRowsPartialTilesMatchReference) {
  ClDevice& dev = shared_device();
  GpuKernels kernels(dev);
  // The fp32 kernels (tests/gpu_svc tests the integer ones).
  kernels.set_int8_matmul(false);
  const uint32_t rows = 37, cols = 160;              // 5 blocks a row: an odd count
  const uint32_t row_begin = 2, row_end = rows - 1;  // 34 rows: not a whole number of tiles
  const uint32_t t_begin = 1;                        // the range starts inside the table
  for (const Case& c :
       {Case{DType::Q4_0, 1, 0, 0}, Case{DType::Q4_0, 2, 2, 0}, Case{DType::Q4_0, 13, 18, 1},
        Case{DType::Q4_0, 6, 6, 0}, Case{DType::Q4_0, 20, 0, 2}, Case{DType::Q8_0, 1, 34, 0},
        Case{DType::Q8_0, 13, 2, 1}}) {
    SCOPED_TRACE(std::string(dtype_name(c.type)) + " tokens=" + std::to_string(c.tokens) +
                 " w_off=" + std::to_string(c.w_off));
    const auto wbytes = raw_blocks(c.type, rows, cols, c.tokens + 3);
    HostBuffer w(dev, c.w_off + wbytes.size());
    std::memcpy(w.at(c.w_off), wbytes.data(), wbytes.size());
    w.upload();

    const uint32_t n = t_begin + c.tokens;  // tokens in the table; the op runs [t_begin, n)
    const auto x = random_floats(size_t{n} * cols, c.tokens, 3.0f);
    const uint64_t tok_off = 0, x_off = 4096, y_off = x_off + uint64_t{n} * cols * 4;
    HostBuffer arena(dev, y_off + uint64_t{n} * rows * 4);
    auto* tok = arena.at<int32_t>(tok_off);
    std::vector<int32_t> out_row(n);
    for (uint32_t t = 0; t < n; ++t) {
      // Logits rows (mode 1): every third token has none (-1), the others write in reverse
      // order; mode 2: only the last token has one, as in a prefill's Logits op.
      out_row[t] = c.logits_rows == 0   ? static_cast<int32_t>(t)
                   : c.logits_rows == 2 ? (t + 1 == n ? 0 : -1)
                   : t % 3 == 2         ? -1
                                        : static_cast<int32_t>(n - 1 - t);
      tok[4 * t + 3] = out_row[t];
    }
    std::memcpy(arena.at(x_off), x.data(), x.size() * 4);
    const float kUntouched = -7.0f;
    std::fill(arena.at<float>(y_off), arena.at<float>(y_off) + size_t{n} * rows, kUntouched);
    arena.upload();

    MatmulArgs a{c.type,
                 w.mem(),
                 c.w_off,
                 cols,
                 x_off,
                 cols,
                 y_off,
                 rows,
                 row_begin,
                 row_end,
                 {t_begin, n},
                 tok_off,
                 c.logits_rows != 0};
    run(kernels.matmul(arena.mem(), a));
    arena.download();

    const ops::Matrix m{c.type, rows, cols, wbytes.data()};
    std::vector<float> want(size_t{n} * rows), dense(size_t{rows} * cols);
    ops::matmul(m, x.data(), static_cast<int>(n), want.data());
    dequantize_row(c.type, wbytes.data(), dense.data(), int64_t{rows} * cols);
    std::vector<bool> written(size_t{n} * rows, false);
    for (uint32_t t = t_begin; t < n; ++t) {
      if (out_row[t] < 0) continue;
      for (uint32_t r = row_begin; r < row_end; ++r) {
        double magnitude = 0;  // sum of |w x|: the scale of this output's rounding error
        for (uint32_t i = 0; i < cols; ++i)
          magnitude += std::fabs(double{dense[size_t{r} * cols + i]} * x[size_t{t} * cols + i]);
        const size_t at = size_t{static_cast<uint32_t>(out_row[t])} * rows + r;
        written[at] = true;
        EXPECT_LE(std::fabs(double{arena.at<float>(y_off)[at]} - want[size_t{t} * rows + r]),
                  1e-5 * magnitude)
            << "token " << t << " row " << r;
      }
    }
    for (size_t i = 0; i < written.size(); ++i) {
      if (!written[i]) {
        EXPECT_EQ(arena.at<float>(y_off)[i], kUntouched) << "wrote outside at " << i;
      }
    }
  }
}

}  // namespace
}  // namespace duet::gpu
