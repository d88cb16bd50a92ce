// E0M4 weights (core/quant_e0m4.h; matmul_qx_e0m4.cl) on gpu_svc: the embedding lookup returns
// core's dequantised weights bit for bit (the shift-and-OR dequantisation and one exact
// multiply-add, as dequantize_row_e0m4), and the GEMVs (cooperative and per-row) and GEMMs
// equal the matmul of those weights to float rounding, on odd row counts, rows of one to five
// 128-weight groups, row ranges that start and end inside the tensor, and weights at a 2-byte
// offset.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/model/quant.h"
#include "services/gpu_svc/gpu_kernels.h"
#include "tests/gpu/gpu_test_util.h"

namespace duet::gpu {
namespace {

using testing::HostBuffer;
using testing::random_floats;
using testing::run;

struct Shape {
  uint32_t rows, cols, row_begin, row_end;
};
constexpr uint32_t kBegin = 2;  // the launches' first token

TEST(E0M4Kernels, EmbedIsCoresDequantisationAndMatmulsAreItsDotProducts) {
  ClDevice& dev = shared_device();
  GpuKernels kernels(dev);
  const uint32_t table = kBegin + 64;
  for (const Shape& s : {Shape{1, 128, 0, 1}, Shape{31, 384, 0, 31}, Shape{257, 640, 3, 250}}) {
    SCOPED_TRACE("rows " + std::to_string(s.rows) + " cols " + std::to_string(s.cols));
    const auto wbytes = testing::random_weights(DType::E0M4, s.rows, s.cols, 3 + s.rows);
    HostBuffer w(dev, 2 + wbytes.size());
    std::memcpy(w.at(2), wbytes.data(), wbytes.size());
    w.upload();
    const auto x = random_floats(size_t{table} * s.cols, 4, 2.0f);
    const uint64_t x_off = 4096 + uint64_t{table} * 16, y_off = x_off + x.size() * 4;
    HostBuffer arena(dev, y_off + uint64_t{table} * s.rows * 4);
    std::memcpy(arena.at(x_off), x.data(), x.size() * 4);
    arena.upload();
    std::vector<float> dense(size_t{s.rows} * s.cols);
    dequantize_row(DType::E0M4, wbytes.data(), dense.data(), int64_t{s.rows} * s.cols);
    for (const bool coop : {true, false}) {
      kernels.set_coop_gemv(coop);
      for (const uint32_t n : {1u, 3u, 5u, 20u, 64u}) {
        SCOPED_TRACE(std::to_string(n) + " tokens" + (coop ? ", coop GEMV" : ""));
        MatmulArgs a;
        a.wtype = DType::E0M4;
        a.w = w.mem();
        a.w_off = 2;
        a.k = s.cols;
        a.x_off = x_off;
        a.x_stride = s.cols;
        a.y_off = y_off;
        a.y_stride = s.rows;
        a.row_begin = s.row_begin;
        a.row_end = s.row_end;
        a.tokens = {kBegin, kBegin + n};
        run(kernels.matmul(arena.mem(), a));
        arena.download();
        for (uint32_t t = kBegin; t < kBegin + n; ++t)
          for (uint32_t r = s.row_begin; r < s.row_end; ++r) {
            double dot = 0, magnitude = 0;
            for (uint32_t i = 0; i < s.cols; ++i) {
              const double p = double{dense[size_t{r} * s.cols + i]} * x[size_t{t} * s.cols + i];
              dot += p;
              magnitude += std::fabs(p);
            }
            ASSERT_NEAR(arena.at<float>(y_off)[size_t{t} * s.rows + r], dot, 1e-5 * magnitude)
                << "token " << t << " row " << r;
          }
      }
    }
    const int32_t ids[3] = {0, static_cast<int32_t>(s.rows - 1), static_cast<int32_t>(s.rows / 2)};
    for (uint32_t t = 0; t < 3; ++t) arena.at<int32_t>(0)[4 * t] = ids[t];
    arena.upload();
    run(kernels.embed(arena.mem(), DType::E0M4, w.mem(), 2, s.cols, 0, x_off, s.cols, {0, 3}));
    arena.download();
    for (uint32_t t = 0; t < 3; ++t)
      for (uint32_t i = 0; i < s.cols; ++i)
        ASSERT_EQ(arena.at<float>(x_off)[size_t{t} * s.cols + i],
                  dense[size_t(ids[t]) * s.cols + i])
            << "token " << t << " col " << i;
  }
}

}  // namespace
}  // namespace duet::gpu
