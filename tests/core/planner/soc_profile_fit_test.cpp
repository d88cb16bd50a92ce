// Fitting a SoC profile to a measured profile (issue 23 item 4, core/planner/soc_profile_fit.h): a
// profile "measured" on a known machine (the timing models with other parameters) is fitted back
// from sd8gen3's starting point, and the fitted profile's TOML reads back as the same profile.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/base/error.h"
#include "core/model/shapes.h"
#include "core/planner/gpu_timing.h"
#include "core/planner/npu_timing.h"
#include "core/planner/profiler.h"
#include "core/planner/soc_profile_fit.h"
#include "tests/support/soc_profiles.h"

namespace duet {
namespace {

using test_support::sd8gen3;

// A slower, differently shaped machine: a third of the GPU's bandwidth and rate, a slower NPU
// clock with a dearer launch.
SocProfile other_machine() {
  SocProfile m = sd8gen3();
  m.gpu.bandwidth_gbps /= 3;
  m.gpu.achievable_gflops /= 3;
  m.gpu.params["matmul_fixed_us"] = 40;
  m.npu.clock_ghz /= 4;
  m.npu.launch_us = 60;
  return m;
}

Profile profile_of(const SocProfile& machine) {
  ModeledOpTimer timer(machine);
  ProfileSpec spec;
  spec.weights = model_weight_shapes(model_shape("tiny-fortune"));
  spec.lengths = {1, 16, 64};
  spec.row_steps = 2;
  Profile p = run_profile(spec, timer, "measured", "other", "tiny-fortune");
  p.contention = 1.0;
  return p;
}

// The same shapes timed inside steps (core/planner/trace_profile.h): each what the machine's
// pipelined models say.
Profile in_steps_profile_of(const SocProfile& machine) {
  Profile steps = profile_of(machine);
  steps.timing = "steps";
  for (ProfileEntry& e : steps.entries) {
    const OpShape s{e.kind, e.wtype, e.m, e.k, e.n, true};
    e.us = e.device == Device::gpu ? gpu_pipelined_us(machine, s) : npu_pipelined_us(machine, s);
  }
  return steps;
}

TEST(SocProfileFit, RecoversTheTimesOfTheMachineItWasMeasuredOn) {
  const SocProfile machine = other_machine();
  const Profile measured = profile_of(machine);
  const SocFitReport r = fit_soc_profile(measured, sd8gen3(), "other", 12.0);
  EXPECT_GT(r.gpu_points, 10u);
  EXPECT_GT(r.npu_points, 10u);
  // Before the fit sd8gen3 is far off; after it, the points within 5% on average and 20% at
  // worst (the models' kinks leave the descent a little short of the exact parameters).
  double before = 0;
  for (const ProfileEntry& e : measured.entries)
    if (e.device == Device::gpu)
      before = std::max(
          before, std::abs(std::log(
                      gpu_modeled_us(sd8gen3(), {e.kind, e.wtype, e.m, e.k, e.n, true}) / e.us)));
  EXPECT_GT(before, std::log(1.5));
  EXPECT_LT(r.gpu_rms_log, 0.05);
  EXPECT_LT(r.npu_rms_log, 0.05);
  EXPECT_LT(std::abs(std::log(r.gpu_worst)), std::log(1.2));
  EXPECT_LT(std::abs(std::log(r.npu_worst)), std::log(1.2));
  // The host-side terms go in as measured: fast sync, and contention 1 (the two share the same
  // cores) means they stream no more together than one alone.
  EXPECT_EQ(r.soc.gpu.param("fast_sync_us"), 12.0);
  EXPECT_DOUBLE_EQ(r.soc.mem.dual_gbps, r.soc.mem.single_gbps);
}

TEST(SocProfileFit, OpsTimedInsideStepsAreFittedWithThePipelinedModels) {
  // A profile of in-step times (core/planner/trace_profile.h): the same shapes, each costing
  // what the other machine's pipelined models say. Fitted as such it comes back close; read as
  // isolated times (the old profile's kind) it would not.
  const Profile steps = in_steps_profile_of(other_machine());
  const SocFitReport r = fit_soc_profile(steps, sd8gen3(), "steps", 0);
  EXPECT_LT(r.gpu_rms_log, 0.1);
  EXPECT_LT(r.npu_rms_log, 0.1);
  for (const ProfileEntry& e : steps.entries) {
    if (e.device != Device::gpu || e.n != 1) continue;
    EXPECT_NEAR(gpu_pipelined_us(r.soc, {e.kind, e.wtype, e.m, e.k, e.n, true}) / e.us, 1.0, 0.3)
        << e.m << "x" << e.k;
  }
}

TEST(SocProfileFit, AnNpuThatReadsItsWeightsThenComputesIsFittedInThatForm) {
  // This host's "NPU" is a CPU GEMM (npu_timing.h): a call, the weights read, then the products,
  // one after the other. Points measured on such a machine come back in the processor form (no
  // systolic array size fits them as closely), and its TOML reads back the same.
  SocProfile machine = other_machine();
  machine.npu.cpu_gflops = 25;
  machine.npu.cpu_weight_gbps = 12;
  machine.npu.cpu_call_us = 9;
  const SocFitReport r = fit_soc_profile(in_steps_profile_of(machine), sd8gen3(), "cpu-npu", 0);
  EXPECT_GT(r.soc.npu.cpu_gflops, 0);
  EXPECT_LT(r.npu_rms_log, 0.02);
  EXPECT_NEAR(r.soc.npu.cpu_gflops / 25, 1.0, 0.05);
  EXPECT_NEAR(r.soc.npu.cpu_call_us / 9, 1.0, 0.05);
  const SocProfile back = parse_soc_profile(soc_profile_toml(r.soc, "fitted"), "test");
  EXPECT_NEAR(back.npu.cpu_weight_gbps, r.soc.npu.cpu_weight_gbps,
              1e-6 * r.soc.npu.cpu_weight_gbps);
  // Fitted from steps it is a host's profile, whose two devices take turns on the same cores
  // where their ops overlap; the file says so, and a value outside [0, 1] is refused.
  EXPECT_EQ(r.soc.mem.shared_cores, 1.0);
  EXPECT_EQ(back.mem.shared_cores, 1.0);
  EXPECT_EQ(sd8gen3().mem.shared_cores, 0.0);
  std::string bad = soc_profile_toml(r.soc, "fitted");
  bad.replace(bad.find("shared_cores = 1"), 16, "shared_cores = 2");
  EXPECT_THROW(parse_soc_profile(bad, "test"), Error);
  // The SoC files have no such key: their NPU stays the systolic model.
  EXPECT_EQ(sd8gen3().npu.cpu_gflops, 0);
}

TEST(SocProfileFit, TheTomlReadsBackAsTheSameProfile) {
  const SocFitReport r = fit_soc_profile(profile_of(other_machine()), sd8gen3(), "other", 0);
  const std::string text = soc_profile_toml(r.soc, "fitted\nin a test");
  const SocProfile back = parse_soc_profile(text, "test");
  EXPECT_EQ(back.name, "other");
  for (const ProfileEntry& e : profile_of(other_machine()).entries) {
    const OpShape s{e.kind, e.wtype, e.m, e.k, e.n, true};
    const double a = e.device == Device::gpu ? gpu_modeled_us(r.soc, s) : npu_modeled_us(r.soc, s);
    const double b = e.device == Device::gpu ? gpu_modeled_us(back, s) : npu_modeled_us(back, s);
    EXPECT_NEAR(a, b, 1e-6 * a);
  }
}

TEST(SocProfileFit, AProfileWithoutBothDevicesIsAClearError) {
  Profile p = profile_of(other_machine());
  std::erase_if(p.entries, [](const ProfileEntry& e) { return e.device == Device::npu; });
  EXPECT_THROW(fit_soc_profile(p, sd8gen3(), "x", 0), Error);
}

}  // namespace
}  // namespace duet
