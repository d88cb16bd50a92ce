// E0M4 weights (core/quant_e0m4.h; matmul_qx_e0m4.cl) on gpu_svc: the embedding lookup returns
// core's dequantised weights bit for bit (the shift-and-OR dequantisation and one exact
// multiply-add, as dequantize_row_e0m4), and the GEMVs (cooperative and per-row) and GEMMs
// equal the matmul of those weights to float rounding, on odd row counts, rows of one to five
// 128-weight groups, row ranges that start and end inside the tensor, and weights at a 2-byte
// offset.
#include <gtest/gtest.h>

#include <string>

#include "services/gpu_svc/gpu_kernels.h"
#include "tests/gpu/gpu_test_util.h"

namespace duet::gpu {
namespace {

TEST(E0M4Kernels, EmbedIsCoresDequantisationAndMatmulsAreItsDotProducts) {
  ClDevice& dev = shared_device();
  GpuKernels kernels(dev);
  for (const testing::MatmulShape& s :
       {testing::MatmulShape{1, 128, 0, 1}, testing::MatmulShape{31, 384, 0, 31},
        testing::MatmulShape{257, 640, 3, 250}}) {
    SCOPED_TRACE("rows " + std::to_string(s.rows) + " cols " + std::to_string(s.cols));
    testing::expect_dequantised_matmuls_and_embed(dev, kernels, DType::E0M4, s,
                                                  /*embed_exact=*/true);
  }
}

}  // namespace
}  // namespace duet::gpu
