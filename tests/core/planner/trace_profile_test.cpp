// A measured profile from real steps (core/planner/trace_profile.h): the matmul spans of a
// `duet trace` file become profile points with the shapes of the model's weights.
#include "core/planner/trace_profile.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "core/base/error.h"
#include "core/program/program.h"
#include "tests/support/error_code.h"
#include "tests/support/soc_profiles.h"

namespace duet {
namespace {

using test_support::error_code_of;

const LlamaModel& fortune() {
  static const auto m =
      LlamaModel::load(std::string(DUET_SOURCE_DIR) + "/tests/data/tiny-fortune/fortune-q8_0.gguf");
  return *m;
}

nlohmann::json span(int tid, const std::string& name, const char* cat, double dur,
                    nlohmann::json args) {
  return {{"ph", "X"},  {"pid", 1}, {"tid", tid}, {"name", name},
          {"cat", cat}, {"ts", 0},  {"dur", dur}, {"args", std::move(args)}};
}

// A step as frontend_trace.cpp writes it: the frontend's step span, the device's step span and
// its op spans (tid 1 frontend, 2 gpu_svc, 3 npu_svc).
void add_step(nlohmann::json& events, int step, const std::string& plan, int tokens,
              double frontend_us, double device_us,
              const std::vector<std::pair<std::string, double>>& gpu_ops, double begin_us = 0,
              int context = 0) {
  nlohmann::json fe = span(
      1, "step", "step", frontend_us,
      {{"step", step}, {"plan", plan}, {"tokens", tokens}, {"sequences", 1}, {"context", context}});
  fe["ts"] = begin_us;
  events.push_back(fe);
  events.push_back(span(2, "step", "step", device_us, {{"step", step}}));
  for (const auto& [name, us] : gpu_ops)
    events.push_back(span(2, name, "op", us, {{"step", step}, {"measured_us", us}}));
}

TEST(TraceProfile, MatmulSpansOfUnsplitStepsBecomeProfilePoints) {
  nlohmann::json events = nlohmann::json::array();
  add_step(events, 1, "gpu-only", 16, 1000, 800,
           {{"MatMul q L0", 10},
            {"MatMul q L1", 12},
            {"MatMul q L2", 80},  // past 3x the median: a preempted worker, left out
            {"RmsNorm L0", 2},
            {"Logits logits", 40}});
  add_step(events, 2, "gpu-only", 1, 500, 350, {{"MatMul down L0", 5}});
  add_step(events, 3, "tensor", 16, 900, 700, {{"MatMul q L0", 99}});  // split: rows unknown
  const TraceProfileReport r =
      profile_from_traces({nlohmann::json{{"traceEvents", events}}}, fortune(), "fortune");
  EXPECT_EQ(r.profile.timing, "steps");
  EXPECT_EQ(r.steps, 3u);
  EXPECT_EQ(r.op_spans, 5u);
  EXPECT_EQ(r.skipped_ops, 1u);
  ASSERT_EQ(r.profile.entries.size(), 3u);
  const LlamaLayer& l0 = fortune().layers[0];
  bool q = false, down = false, logits = false;
  for (const ProfileEntry& e : r.profile.entries) {
    EXPECT_EQ(e.device, Device::gpu);
    if (e.kind == OpKind::Logits) {
      logits = true;
      EXPECT_EQ(e.n, 1);  // one row per sequence, whatever the step's tokens
      EXPECT_EQ(e.m, fortune().output.rows);
      EXPECT_EQ(e.us, 40);
    } else if (e.m == l0.wq.rows && e.n == 16) {
      q = true;
      EXPECT_EQ(e.k, l0.wq.cols);
      EXPECT_EQ(e.wtype, l0.wq.type);
      EXPECT_EQ(e.us, 11);  // the mean of the layers' q within 3x their median
    } else if (e.m == l0.w_down.rows && e.k == l0.w_down.cols) {
      down = true;
      EXPECT_EQ(e.n, 1);
    }
  }
  EXPECT_TRUE(q && down && logits);
  // The frontend's time around the device's span, typical over the steps: 200, 150, 200.
  EXPECT_NEAR(r.profile.handoff_us, 550.0 / 3, 1e-9);
  EXPECT_EQ(r.handoff_sync_us, 0);  // no op waited on the other device
}

TEST(TraceProfile, AMatmulSpanThatAlsoTimedItsSiblingsIsNoProfilePoint) {
  // gpu_svc's sibling matmuls (op_fusion.h): q, k and v as one launch, its time on q's span, k
  // and v without time of their own. That span is not q's shape: it is left out.
  nlohmann::json events = nlohmann::json::array();
  add_step(events, 1, "gpu-only", 1, 500, 400,
           {{"MatMul q L0", 30}, {"MatMul k L0", 0}, {"MatMul v L0", 0}, {"MatMul o L0", 12}});
  add_step(events, 2, "gpu-only", 1, 500, 400, {{"MatMul q L1", 14}, {"MatMul o L1", 12}});
  const TraceProfileReport r =
      profile_from_traces({nlohmann::json{{"traceEvents", events}}}, fortune(), "fortune");
  EXPECT_EQ(r.op_spans, 3u);  // q L1, o L0, o L1
  const LlamaLayer& l0 = fortune().layers[0];
  ASSERT_EQ(l0.wo.rows, l0.wq.rows);  // q and o have one shape here: one profile point
  bool q = false;
  for (const ProfileEntry& e : r.profile.entries)
    if (e.m == l0.wq.rows && e.k == l0.wq.cols && e.n == 1) {
      q = true;
      EXPECT_NEAR(e.us, (14.0 + 12 + 12) / 3, 1e-9);  // without the 30 of q, k and v together
    }
  EXPECT_TRUE(q);
}

TEST(TraceProfile, TheHandOffIsTheDeviceSpanLeftOverPerFlagWait) {
  // An npu-only step: the GPU's norm, then two NPU matmuls that each waited on the GPU's flag,
  // 600 us of ops in an 1000 us span: 200 us per hand-off.
  nlohmann::json events = nlohmann::json::array();
  add_step(events, 1, "npu-only", 16, 1200, 1000, {{"RmsNorm L0", 100}});
  for (const char* name : {"MatMul q L0", "MatMul k L0"})
    events.push_back(
        span(3, name, "op", 250, {{"step", 1}, {"measured_us", 250}, {"wait_us", 80}}));
  const TraceProfileReport r =
      profile_from_traces({nlohmann::json{{"traceEvents", events}}}, fortune(), "fortune");
  EXPECT_DOUBLE_EQ(r.handoff_sync_us, 200);
  EXPECT_EQ(r.profile.entries.size(), 2u);  // q and k on the NPU
}

TEST(TraceProfile, TheGapsBetweenOpsAndBetweenStepsAreRecovered) {
  // Steps made with known costs: each GPU op is followed by 3.5 us of idle time and 0.25 us
  // more per token of the step beyond the first, each NPU op by 2 us, each flag wait costs 120 us,
  // and the frontend starts a step 9 us after the last one.
  constexpr double kGpuGap = 3.5, kGpuGapPerToken = 0.25, kNpuGap = 2.0, kHandOff = 120,
                   kBetween = 9;
  auto gpu_gap = [&](int tokens) { return kGpuGap + kGpuGapPerToken * (tokens - 1); };
  nlohmann::json events = nlohmann::json::array();
  double at = 0;
  auto gpu_only = [&](int step, int tokens, double matmul_us, double norm_us) {
    const std::vector<std::pair<std::string, double>> ops = {
        {"RmsNorm L0", norm_us}, {"MatMul q L0", matmul_us}, {"Rope L0", 0}, {"Add L0", norm_us}};
    const double span_us = matmul_us + 2 * norm_us + gpu_gap(tokens) * ops.size();
    add_step(events, step, "gpu-only", tokens, span_us + 40, span_us, ops, at, 64);
    at += span_us + 40 + kBetween;
  };
  gpu_only(1, 1, 10, 2);
  gpu_only(2, 1, 12, 3);
  gpu_only(3, 16, 90, 20);
  // An npu-only step: the GPU's norm, then two NPU matmuls that each waited for its flag.
  const double npu_ops = 2 * 250, gpu_ops = 100;
  const double npu_span = npu_ops + 2 * kNpuGap + 2 * kHandOff + gpu_ops + gpu_gap(16);
  add_step(events, 4, "npu-only", 16, npu_span + 50, npu_span, {{"RmsNorm L0", gpu_ops}}, at);
  events.push_back(span(3, "step", "step", npu_span, {{"step", 4}}));
  for (const char* name : {"MatMul q L0", "MatMul k L0"})
    events.push_back(span(
        3, name, "op", 250,
        {{"step", 4}, {"measured_us", 250}, {"wait_us", (npu_span - npu_ops - 2 * kNpuGap) / 2}}));
  const TraceProfileReport r =
      profile_from_traces({nlohmann::json{{"traceEvents", events}}}, fortune(), "fortune");
  EXPECT_NEAR(r.gpu_op_gap_us, kGpuGap, 1e-9);
  EXPECT_NEAR(r.gpu_op_gap_us_per_token, kGpuGapPerToken, 1e-9);
  EXPECT_NEAR(r.npu_op_gap_us, kNpuGap, 1e-9);
  EXPECT_NEAR(r.handoff_sync_us, kHandOff, 1e-9);
  EXPECT_NEAR(r.between_steps_us, kBetween, 1e-9);
  // The GPU-only steps' non-matmul time (the norm and the add; the fused rope has none).
  ASSERT_EQ(r.gpu_steps.size(), 3u);
  EXPECT_EQ(r.gpu_steps[2].tokens, 16);
  EXPECT_EQ(r.gpu_steps[2].context, 64);
  EXPECT_DOUBLE_EQ(r.gpu_steps[2].other_us, 40);

  // Into a profile: the gaps as measured, which the timeline then charges per op.
  SocProfile soc = test_support::sd8gen3();
  fit_step_costs(r, fortune(), soc);
  EXPECT_DOUBLE_EQ(soc.gpu.param("op_gap_us"), kGpuGap);
  EXPECT_DOUBLE_EQ(soc.gpu.param("op_gap_us_per_token"), kGpuGapPerToken);
  EXPECT_DOUBLE_EQ(soc.npu.op_gap_us, kNpuGap);
}

// What the timeline charges the non-matmul ops of tiny-fortune's GPU-only step.
double other_ops_us(const SocProfile& soc, int64_t tokens, int64_t context) {
  ProgramSpec spec;
  spec.model = &fortune();
  spec.plan = Plan::fixed("gpu-only");
  spec.max_tokens = 64;
  spec.max_ctx = 512;
  return gpu_other_ops_us(schedule_from_programs(build_programs(spec), spec.plan.npu_mode), soc,
                          tokens, context);
}

TEST(TraceProfile, TheNonMatmulKernelsAreFittedToTheStepsTheyRanIn) {
  // A machine whose non-matmul kernels cost 6 us each beyond the launch, move activations at
  // 4 GB/s and run attention at 3 GFLOPS: its steps' non-matmul times, decode and prefill (one
  // point per token count: the fit takes the median step of each).
  SocProfile machine = test_support::sd8gen3();
  machine.gpu.params["op_fixed_us"] = 6;
  machine.gpu.params["elementwise_gbps"] = 4;
  machine.gpu.params["attention_gflops"] = 3;
  TraceProfileReport r;
  for (const auto& [tokens, context] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 64}, {4, 400}, {16, 0}, {32, 200}, {48, 0}, {64, 128}})
    r.gpu_steps.push_back({tokens, context, other_ops_us(machine, tokens, context)});
  SocProfile soc = test_support::sd8gen3();
  const StepCostFit fit = fit_step_costs(r, fortune(), soc);
  EXPECT_EQ(fit.points, 6u);
  EXPECT_LT(fit.rms_log, 0.01);
  EXPECT_NEAR(soc.gpu.param("op_fixed_us") / 6, 1.0, 0.03);
  EXPECT_NEAR(soc.gpu.param("elementwise_gbps") / 4, 1.0, 0.03);
  EXPECT_NEAR(soc.gpu.param("attention_gflops") / 3, 1.0, 0.03);
  // sd8gen3 itself has none of them: its non-matmul ops stay the launch and the roofline.
  EXPECT_EQ(test_support::sd8gen3().gpu.param_or("op_fixed_us", -1), -1);
}

TEST(TraceProfile, WhatIsNotATraceOrHoldsNoUsableSpanIsAClearError) {
  EXPECT_EQ(error_code_of([] {
              profile_from_traces({nlohmann::json{{"x", 1}}}, fortune(), "f");
            }),
            Errc::bad_format);
  nlohmann::json events = nlohmann::json::array();
  add_step(events, 1, "tensor", 16, 900, 700, {{"MatMul q L0", 99}});
  EXPECT_EQ(error_code_of([&] {
              profile_from_traces({nlohmann::json{{"traceEvents", events}}}, fortune(), "f");
            }),
            Errc::invalid_argument);
  nlohmann::json bad = nlohmann::json::array();
  add_step(bad, 1, "gpu-only", 16, 900, 700, {{"MatMul q L99", 9}});
  EXPECT_EQ(error_code_of([&] {
              profile_from_traces({nlohmann::json{{"traceEvents", bad}}}, fortune(), "f");
            }),
            Errc::bad_format);
}

}  // namespace
}  // namespace duet
