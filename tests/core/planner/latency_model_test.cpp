// Latency functions (core/planner/latency_model): GPU-1 piecewise linear, NPU-1 steps, and how well
// each predicts profile points it was not fitted on.
#include "core/planner/latency_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/base/error.h"
#include "core/planner/profiler.h"
#include "core/planner/soc_profile.h"

namespace duet {
namespace {

TEST(GpuLatencyFn, InterpolatesLinearlyAndExtendsTheEndSegments) {
  const GpuLatencyFn f = GpuLatencyFn::fit({{128, 700}, {1, 100}, {32, 200}});
  EXPECT_DOUBLE_EQ(f(1), 100);
  EXPECT_DOUBLE_EQ(f(32), 200);
  EXPECT_DOUBLE_EQ(f(80), 450);    // halfway from 32 to 128
  EXPECT_DOUBLE_EQ(f(224), 1200);  // past the end along the last segment
  EXPECT_EQ(f.points().front().n, 1);
}

TEST(GpuLatencyFn, AveragesRepeatedLengths) {
  const GpuLatencyFn f = GpuLatencyFn::fit({{64, 100}, {64, 300}, {128, 400}});
  EXPECT_DOUBLE_EQ(f(64), 200);
}

TEST(NpuLatencyFn, IsFlatWithinATileAndStepsAtTheNext) {
  const NpuLatencyFn f = NpuLatencyFn::fit({{1, 90}, {32, 100}, {64, 180}, {128, 300}});
  EXPECT_DOUBLE_EQ(f(1), 90);  // the decode graph is its own point
  for (int64_t n : {2, 17, 31, 32}) EXPECT_DOUBLE_EQ(f(n), 100) << n;
  for (int64_t n : {33, 50, 64}) EXPECT_DOUBLE_EQ(f(n), 180) << n;
  EXPECT_DOUBLE_EQ(f(65), 240);  // the 96-token step, between the profiled 64 and 128
  EXPECT_DOUBLE_EQ(f(96), 240);
}

TEST(LatencyFns, RejectBadProfilePoints) {
  EXPECT_THROW(GpuLatencyFn::fit({}), Error);
  EXPECT_THROW(GpuLatencyFn::fit({{0, 10}}), Error);
  EXPECT_THROW(NpuLatencyFn::fit({{32, -1}}), Error);
  EXPECT_THROW(NpuLatencyFn::fit({{32, 1}}, 0), Error);
  try {
    GpuLatencyFn::fit({{32, std::nan("")}});
    FAIL() << "NaN accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("n=32"), std::string::npos) << e.what();
  }
}

// Fit on the paper's standard lengths, predict the sweep between them: the modelled sd8gen3
// profile of every Llama-3-8B weight (full rows).
TEST(LatencyFns, HeldOutErrorOnTheModelledProfile) {
  ModeledOpTimer timer(load_soc_profile("sd8gen3"));
  ProfileSpec spec;
  // q and o share a shape: profile each shape once.
  for (const WeightShape& w : model_weight_shapes(model_shape("llama3-8b")))
    if (w.name != "o" && w.name != "v") spec.weights.push_back(w);
  spec.row_steps = 1;
  const Profile p = run_profile(spec, timer, "modeled", "sd8gen3", "llama3-8b");
  const std::vector<int64_t> standard = standard_profile_lengths();
  auto is_standard = [&](int64_t n) {
    return std::find(standard.begin(), standard.end(), n) != standard.end();
  };
  double gpu_worst = 0, npu_worst = 0, gpu_mean = 0, npu_mean = 0;
  for (const WeightShape& w : spec.weights)
    for (Device d : {Device::gpu, Device::npu}) {
      std::vector<LatencyPoint> fit, held;
      for (const ProfileEntry& e : p.entries)
        if (e.device == d && e.m == w.m && e.k == w.k && e.kind == w.kind)
          (is_standard(e.n) ? fit : held).push_back({e.n, e.us});
      ASSERT_EQ(fit.size(), standard.size());
      ASSERT_FALSE(held.empty());
      const FitError err = d == Device::gpu ? held_out_error(GpuLatencyFn::fit(fit), held)
                                            : held_out_error(NpuLatencyFn::fit(fit), held);
      std::printf("%-7s %s held-out: mean %.1f%% max %.1f%% (worst at n=%lld)\n", w.name.c_str(),
                  d == Device::gpu ? "GPU-1" : "NPU-1", 100 * err.mean_rel, 100 * err.max_rel,
                  static_cast<long long>(err.worst_n));
      double& worst = d == Device::gpu ? gpu_worst : npu_worst;
      double& mean = d == Device::gpu ? gpu_mean : npu_mean;
      worst = std::max(worst, err.max_rel);
      mean += err.mean_rel / static_cast<double>(spec.weights.size());
    }
  std::printf("GPU-1 mean %.1f%% worst %.1f%%; NPU-1 mean %.1f%% worst %.1f%%\n", 100 * gpu_mean,
              100 * gpu_worst, 100 * npu_mean, 100 * npu_worst);
  EXPECT_LT(gpu_mean, 0.15);
  EXPECT_LT(npu_mean, 0.15);
}

}  // namespace
}  // namespace duet
