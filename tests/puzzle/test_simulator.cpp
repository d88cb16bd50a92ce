// The subgraph profiles against core/timeline, their Merkle keys and cache, and the
// multi-model simulator's rules (priorities, hand-offs, contention, the scores).
#include <gtest/gtest.h>

#include <cmath>

#include "core/base/error.h"
#include "puzzle/simulator.h"
#include "puzzle/subgraph_plan.h"
#include "puzzle/subgraph_profile.h"
#include "tests/support/soc_profiles.h"

namespace duet::puzzle {
namespace {

using test_support::sd8gen3;

double step_us(const ModelShape& shape, const Plan& plan, int64_t n, int64_t context) {
  TimelineOptions t;
  t.n_tokens = n;
  t.context = context;
  SolverOptions o = solver_options_for(sd8gen3());
  o.soc = &sd8gen3();
  return compose_timeline(schedule_from_shape(shape, {}, plan), sd8gen3(), o, t).step_us;
}

TEST(PuzzleProfile, TheWholeModelAsOneSubgraphIsTheTimelinesSchedule) {
  const ModelShape& shape = model_shape("llama3.2-1b");
  ModelCoster c(shape, sd8gen3(), 0);
  for (Proc d : {Proc::gpu, Proc::npu}) {
    const Plan plan = d == Proc::gpu ? Plan::gpu_only() : Plan::npu_only();
    const Schedule whole = schedule_from_shape(shape, {}, plan);
    const Schedule sub = c.subgraph_schedule(0, c.units() - 1, d);
    EXPECT_EQ(sub.gpu, whole.gpu);
    EXPECT_EQ(sub.npu, whole.npu);
  }
}

TEST(PuzzleProfile, SameShapedSubgraphsShareAHashAndAProfile) {
  ModelCoster c(model_shape("llama3.2-1b"), sd8gen3(), 256);
  // Units 2-5 (layers 1-2) and 6-9 (layers 3-4) are the same ops.
  EXPECT_EQ(c.subgraph_hash(2, 5, Proc::npu), c.subgraph_hash(6, 9, Proc::npu));
  EXPECT_NE(c.subgraph_hash(2, 5, Proc::npu), c.subgraph_hash(3, 6, Proc::npu));  // FFN first
  EXPECT_NE(c.subgraph_hash(2, 5, Proc::npu), c.subgraph_hash(2, 5, Proc::gpu));
  EXPECT_NE(c.subgraph_hash(2, 5, Proc::gpu), c.subgraph_hash(2, 7, Proc::gpu));
  EXPECT_NE(c.subgraph_hash(0, 3, Proc::gpu), c.subgraph_hash(2, 5, Proc::gpu));  // embed
  const StageCost a = c.subgraph(2, 5, Proc::npu, 128, 0);
  const StageCost b = c.subgraph(6, 9, Proc::npu, 128, 0);
  EXPECT_EQ(c.stats().misses, 1u);
  EXPECT_EQ(c.stats().hits, 1u);
  EXPECT_EQ(a.span_us, b.span_us);
  // Contexts in one bucket share a profile; another token count does not.
  c.subgraph(2, 5, Proc::gpu, 1, 300);
  c.subgraph(2, 5, Proc::gpu, 1, 400);
  c.subgraph(2, 5, Proc::gpu, 2, 400);
  EXPECT_EQ(c.stats().misses, 3u);
  EXPECT_THROW(c.subgraph(5, 4, Proc::gpu, 1, 0), Error);
  EXPECT_THROW(c.subgraph(0, c.units(), Proc::gpu, 1, 0), Error);
}

TEST(PuzzleProfile, AnNpuSubgraphKeepsItsNonMatmulOpsOnTheGpu) {
  ModelCoster c(model_shape("llama3.2-1b"), sd8gen3(), 0);
  const StageCost s = c.subgraph(2, 3, Proc::npu, 64, 0);
  EXPECT_GT(s.npu_us, 0);
  EXPECT_GT(s.gpu_us, 0);  // norms, RoPE, attention, adds
  EXPECT_GE(s.span_us, s.npu_us);
  EXPECT_GT(s.bytes, 0);
}

// One model alone, wholly on one device: its request's makespan is the timeline's prefill step
// plus each decode step at its context.
TEST(PuzzleSimulator, OneModelOnOneDeviceMatchesTheTimeline) {
  const ModelShape& shape = model_shape("llama3.2-1b");
  ModelCoster c(shape, sd8gen3(), 0);
  const int64_t prompt = 96, output = 4;
  for (Proc d : {Proc::gpu, Proc::npu}) {
    SimModel m;
    double expect = 0;
    for (int64_t s = 0; s < output; ++s) {
      const int64_t n = s == 0 ? prompt : 1, ctx = s == 0 ? 0 : prompt + s - 1;
      m.steps.push_back({c.subgraph(0, c.units() - 1, d, n, ctx)});
      expect += step_us(shape, d == Proc::gpu ? Plan::gpu_only() : Plan::npu_only(), n, ctx);
    }
    SimOptions o;
    o.requests = 1;
    o.dual_gbps = sd8gen3().mem.dual_gbps;
    const SimResult r = simulate({m}, {1e9}, o);
    EXPECT_NEAR(r.makespan_us[0][0], expect, 1e-6 * expect);
    EXPECT_EQ(r.handoffs, 0);
  }
}

// Under Proc::both a subgraph runs the per-op solver's plan for its step: the whole model as one
// is the timeline of that plan.
TEST(PuzzleSimulator, TheTensorPlanSubgraphIsTheTimelinesTensorPlan) {
  const ModelShape& shape = model_shape("llama3.2-1b");
  ModelCoster c(shape, sd8gen3(), 0);
  const Plan& prefill = c.tensor_plan(256);
  EXPECT_TRUE(prefill.uses_npu());
  const StageCost s = c.subgraph(0, c.units() - 1, Proc::both, 256, 0);
  EXPECT_EQ(s.proc, Proc::both);
  EXPECT_NEAR(s.span_us, step_us(shape, prefill, 256, 0), 1e-9 * s.span_us);
  EXPECT_NE(c.subgraph_hash(0, 9, Proc::both, 256), c.subgraph_hash(0, 9, Proc::gpu));
}

TEST(PuzzleSimulator, ADeviceChangeCostsOneSync) {
  ModelCoster c(model_shape("llama3.2-1b"), sd8gen3(), 0);
  const StageCost a = c.subgraph(0, 9, Proc::gpu, 64, 0);
  const StageCost b = c.subgraph(10, 32, Proc::npu, 64, 0);
  SimOptions o;
  o.requests = 1;
  o.sync_us = 30;
  const SimResult r = simulate({{0, 0, {{a, b}}}}, {1e9}, o);
  EXPECT_NEAR(r.makespan_us[0][0], a.span_us + 30 + b.span_us, 1e-6);
  EXPECT_EQ(r.handoffs, 1);
}

StageCost stage(Proc p, double us, double gbps = 0) {
  StageCost s;
  s.proc = p;
  s.span_us = us;
  s.bytes = gbps * us * 1e3;
  (p == Proc::npu ? s.npu_us : s.gpu_us) = us;
  return s;
}

TEST(PuzzleSimulator, TheHigherPriorityGoesFirstWithoutPreemption) {
  SimOptions o;
  o.requests = 1;
  const SimModel low{0, 1, {{stage(Proc::gpu, 10)}}}, high{1, 0, {{stage(Proc::gpu, 5)}}};
  SimResult r = simulate({low, high}, {100, 100}, o);
  EXPECT_DOUBLE_EQ(r.makespan_us[1][0], 5);
  EXPECT_DOUBLE_EQ(r.makespan_us[0][0], 15);
  EXPECT_DOUBLE_EQ(r.latency_us[1][0], 5) << "each model's own latency";
  EXPECT_DOUBLE_EQ(r.latency_us[0][0], 15);
  // One group of both: its makespan is the later model's; each model keeps its latency.
  const SimModel high_g0{0, 0, {{stage(Proc::gpu, 5)}}};
  r = simulate({low, high_g0}, {100}, o);
  EXPECT_DOUBLE_EQ(r.makespan_us[0][0], 15);
  EXPECT_DOUBLE_EQ(r.latency_us[1][0], 5);
  EXPECT_DOUBLE_EQ(r.latency_us[0][0], 15);
  // Two stages: the low-priority model's second stage waits behind the high one's only where
  // both are ready; once started, nothing preempts it.
  const SimModel low2{0, 1, {{stage(Proc::gpu, 10), stage(Proc::gpu, 10)}}};
  const SimModel late{1, 0, {{stage(Proc::gpu, 5)}}};
  r = simulate({low2, late}, {100, 100}, o);
  EXPECT_DOUBLE_EQ(r.makespan_us[1][0], 5);
  EXPECT_DOUBLE_EQ(r.makespan_us[0][0], 25);
  // Models on different devices run at once.
  const SimModel npu{1, 0, {{stage(Proc::npu, 8)}}};
  r = simulate({low, npu}, {100, 100}, o);
  EXPECT_DOUBLE_EQ(r.makespan_us[0][0], 10);
  EXPECT_DOUBLE_EQ(r.makespan_us[1][0], 8);
}

TEST(PuzzleSimulator, RequestsArePeriodicAndSequentialPerModel) {
  SimOptions o;
  o.requests = 3;
  // 30 us of work every 20 us: each request queues 10 us more behind the one before.
  const SimResult r = simulate({{0, 0, {{stage(Proc::gpu, 30)}}}}, {20}, o);
  EXPECT_DOUBLE_EQ(r.makespan_us[0][0], 30);
  EXPECT_DOUBLE_EQ(r.makespan_us[0][1], 40);
  EXPECT_DOUBLE_EQ(r.makespan_us[0][2], 50);
}

TEST(PuzzleSimulator, OverlappingStagesShareTheMemoryBandwidth) {
  SimOptions o;
  o.requests = 1;
  o.dual_gbps = 60;
  // 40 + 40 GB/s over 60 together: the later stage absorbs overlap * (1 - 60/80) = 25 of 100.
  const SimModel g{0, 0, {{stage(Proc::gpu, 100, 40)}}}, n{1, 1, {{stage(Proc::npu, 100, 40)}}};
  const SimResult r = simulate({g, n}, {1000, 1000}, o);
  EXPECT_DOUBLE_EQ(r.makespan_us[0][0], 100);
  EXPECT_DOUBLE_EQ(r.makespan_us[1][0], 125);
  o.dual_gbps = 0;
  EXPECT_DOUBLE_EQ(simulate({g, n}, {1000, 1000}, o).makespan_us[1][0], 100);
}

TEST(PuzzleSimulator, ObjectivesAndXrbenchScore) {
  SimResult r;
  r.makespan_us = {{1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000}};
  const std::vector<double> obj = objectives_ms(r);
  ASSERT_EQ(obj.size(), 2u);
  EXPECT_DOUBLE_EQ(obj[0], 5.5);
  EXPECT_DOUBLE_EQ(obj[1], 9);  // nearest rank: the 9th of 10
  // A period of 20 ms: every request meets it by >= 10 ms, so RtScore ~ 1 and QoE 1.
  EXPECT_NEAR(xrbench_score(r, {20000}), 1.0, 1e-9);
  // A period of 5.5 ms: half meet it; RtScore is 1/(1+e^(15 (m - 5.5))) per request.
  double rt = 0;
  for (int i = 1; i <= 10; ++i) rt += 1.0 / (1.0 + std::exp(15.0 * (i - 5.5)));
  EXPECT_NEAR(xrbench_score(r, {5500}), rt / 10 * 0.5, 1e-12);
  EXPECT_THROW(xrbench_score(r, {1, 2}), Error);
}

TEST(PuzzleSimulator, BadInputsAreRefused) {
  SimOptions o;
  EXPECT_THROW(simulate({{1, 0, {{stage(Proc::gpu, 1)}}}}, {10}, o), Error);  // no group 1
  EXPECT_THROW(simulate({{0, 0, {}}}, {10}, o), Error);                       // no steps
  EXPECT_THROW(simulate({{0, 0, {{}}}}, {10}, o), Error);                     // empty step
  EXPECT_THROW(simulate({{0, 0, {{stage(Proc::gpu, 1)}}}}, {0}, o), Error);   // period 0
}

}  // namespace
}  // namespace duet::puzzle
