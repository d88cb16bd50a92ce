// A measured profile from real steps (core/planner/trace_profile.h): the matmul spans of a
// `duet trace` file become profile points with the shapes of the model's weights.
#include "core/planner/trace_profile.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "core/base/error.h"
#include "tests/support/error_code.h"

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
              const std::vector<std::pair<std::string, double>>& gpu_ops) {
  events.push_back(span(1, "step", "step", frontend_us,
                        {{"step", step}, {"plan", plan}, {"tokens", tokens}, {"sequences", 1}}));
  events.push_back(span(2, "step", "step", device_us, {{"step", step}}));
  for (const auto& [name, us] : gpu_ops)
    events.push_back(span(2, name, "op", us, {{"step", step}, {"measured_us", us}}));
}

TEST(TraceProfile, MatmulSpansOfUnsplitStepsBecomeProfilePoints) {
  nlohmann::json events = nlohmann::json::array();
  add_step(events, 1, "gpu-only", 16, 1000, 800,
           {{"MatMul q L0", 10},
            {"MatMul q L1", 12},
            {"MatMul q L2", 30},
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
      EXPECT_EQ(e.us, 12);  // the median of the three layers' q
    } else if (e.m == l0.w_down.rows && e.k == l0.w_down.cols) {
      down = true;
      EXPECT_EQ(e.n, 1);
    }
  }
  EXPECT_TRUE(q && down && logits);
  // The frontend's time around the device's span, median over the steps: 200, 150, 200.
  EXPECT_DOUBLE_EQ(r.profile.handoff_us, 200);
  EXPECT_EQ(r.handoff_sync_us, 0);  // no op waited on the other device
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
