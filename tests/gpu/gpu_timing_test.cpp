// The GPU timing model on the default sd8gen3 profile reproduces the GPU column of
// HeteroInfer's Table 3 (W4A16 weights) within +-25%, and behaves like a roofline.
#include <gtest/gtest.h>

#include <cmath>

#include "core/base/error.h"
#include "core/planner/gpu_timing.h"

namespace duet {
namespace {

OpShape matmul(int64_t m, int64_t k, int64_t n) {
  return OpShape{OpKind::MatMul, DType::Q4_0, m, k, n};
}

TEST(GpuTiming, Sd8Gen3ReproducesTable3GpuColumn) {
  const SocProfile soc = load_soc_profile("sd8gen3");
  struct Row {
    int64_t m, k, n;
    double paper_us;
  };
  const Row table3[] = {
      {4096, 4096, 1, 511},    {28672, 4096, 1, 1903},   {4096, 14336, 1, 1467},
      {4096, 4096, 128, 7306}, {4096, 4096, 256, 10841}, {4096, 14336, 256, 35231},
  };
  for (const Row& r : table3) {
    const double us = gpu_modeled_us(soc, matmul(r.m, r.k, r.n));
    EXPECT_NEAR(us / r.paper_us, 1.0, 0.25) << "[" << r.m << "," << r.k << "]x" << r.n
                                            << ": modelled " << us << " us, paper " << r.paper_us;
  }
}

TEST(GpuTiming, LinearInTokensOnceComputeBoundAndMemoryBoundForDecode) {
  const SocProfile soc = load_soc_profile("sd8gen3");
  // GPU-1: beyond the GEMV range, every extra 64 tokens costs the same.
  const double t128 = gpu_modeled_us(soc, matmul(4096, 4096, 128));
  const double t192 = gpu_modeled_us(soc, matmul(4096, 4096, 192));
  const double t256 = gpu_modeled_us(soc, matmul(4096, 4096, 256));
  EXPECT_NEAR(t256 - t192, t192 - t128, 1e-6 * t256);
  // Decode is memory-bound: Q8_0 weights (34 B / 32) cost more than Q4_0 (18 B / 32).
  OpShape q8 = matmul(4096, 4096, 1);
  q8.wtype = DType::Q8_0;
  EXPECT_GT(gpu_modeled_us(soc, q8), 1.5 * gpu_modeled_us(soc, matmul(4096, 4096, 1)));
  // The sync cost is the paper's ~400 us blocking clFinish.
  EXPECT_NEAR(gpu_sync_us(soc), 400.0, 100.0);
}

TEST(GpuTiming, ElementwiseOpsAreCheapAndScaleWithTokens) {
  const SocProfile soc = load_soc_profile("sd8gen3");
  const OpShape norm1{OpKind::RmsNorm, DType::F32, 4096, 0, 1};
  const OpShape norm256{OpKind::RmsNorm, DType::F32, 4096, 0, 256};
  EXPECT_LT(gpu_modeled_us(soc, norm1), 50.0);
  EXPECT_GT(gpu_modeled_us(soc, norm256), gpu_modeled_us(soc, norm1));
  EXPECT_EQ(gpu_modeled_us(soc, OpShape{OpKind::Add, DType::F32, 4096, 0, 0}), 0.0);
}

TEST(GpuTiming, RejectsNegativeShapesAndProfilesWithoutItsParameters) {
  const SocProfile soc = load_soc_profile("sd8gen3");
  EXPECT_THROW(gpu_modeled_us(soc, matmul(-1, 4096, 1)), Error);
  SocProfile broken = soc;
  broken.gpu.params.clear();
  try {
    gpu_modeled_us(broken, matmul(4096, 4096, 1));
    FAIL() << "a profile without [gpu.params] must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gemv_half_rows"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace duet
