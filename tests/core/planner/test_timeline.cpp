// The modelled SoC timeline: schedules built from a shape match the program builder's, ops never
// start before what they wait on, and splitting a matmul over both devices pays off when balanced.
#include <gtest/gtest.h>

#include <numeric>

#include "core/base/error.h"
#include "core/model/model.h"
#include "core/planner/gpu_timing.h"
#include "core/planner/npu_timing.h"
#include "core/planner/timeline.h"
#include "core/program/program.h"
#include "tests/support/soc_profiles.h"

namespace duet {
namespace {

using test_support::sd8gen3;

const LlamaModel& fortune() {
  static const auto m =
      LlamaModel::load(std::string(DUET_SOURCE_DIR) + "/tests/data/tiny-fortune/fortune-q8_0.gguf");
  return *m;
}

// Every strategy the builder knows, on different roles, so every hazard pattern appears.
Plan mixed_plan() {
  Plan p;
  p.name = "mixed";
  p.npu_mode = NpuGraphMode::pipe;
  p.at(MatmulRole::q) = {Strategy::weight_split, 128, 0};
  p.at(MatmulRole::k) = {Strategy::npu_only, 0, 0};
  p.at(MatmulRole::v) = {Strategy::gpu_only, 0, 0};
  p.at(MatmulRole::o) = {Strategy::activation_split, 0, 32};
  p.at(MatmulRole::gate) = {Strategy::hybrid, 352, 32};
  p.at(MatmulRole::up) = {Strategy::padding, 0, 64};
  p.at(MatmulRole::down) = {Strategy::weight_split, 64, 0};
  p.at(MatmulRole::logits) = {Strategy::weight_split, 1024, 0};
  return p;
}

BuiltPrograms build_for(const Plan& plan) {
  ProgramSpec spec;
  spec.model = &fortune();
  spec.plan = plan;
  spec.max_tokens = 64;
  spec.max_ctx = 128;
  spec.name = "timeline-test";
  return build_programs(spec);
}

ShapeTypes fortune_types() {
  const LlamaModel& m = fortune();
  return {m.layers.at(0).wq.type, m.tok_embd.type, m.output.type};
}

TimelineOptions prefill(int64_t n) {
  TimelineOptions t;
  t.n_tokens = n;
  return t;
}

TEST(TimelineSchedule, ShapeScheduleEqualsBuilderOpListOnTinyFortune) {
  for (const Plan& plan : {Plan::gpu_only(), Plan::npu_only(), mixed_plan()}) {
    const Schedule from_file = schedule_from_programs(build_for(plan), plan.npu_mode);
    const Schedule from_shape =
        schedule_from_shape(model_shape("tiny-fortune"), fortune_types(), plan);
    ASSERT_EQ(from_shape.gpu.size(), from_file.gpu.size()) << plan.name;
    ASSERT_EQ(from_shape.npu.size(), from_file.npu.size()) << plan.name;
    for (size_t i = 0; i < from_file.gpu.size(); ++i) {
      EXPECT_EQ(from_shape.gpu[i], from_file.gpu[i])
          << plan.name << " gpu op " << i << " " << op_kind_name(from_file.gpu[i].kind);
    }
    for (size_t i = 0; i < from_file.npu.size(); ++i) {
      EXPECT_EQ(from_shape.npu[i], from_file.npu[i]) << plan.name << " npu op " << i;
    }
  }
  // The mixed plan really crosses devices both ways.
  const Schedule s =
      schedule_from_shape(model_shape("tiny-fortune"), fortune_types(), mixed_plan());
  int gpu_waits = 0, npu_waits = 0;
  for (const ScheduleOp& op : s.gpu) gpu_waits += static_cast<int>(op.waits.size());
  for (const ScheduleOp& op : s.npu) npu_waits += static_cast<int>(op.waits.size());
  EXPECT_GT(gpu_waits, 0);
  EXPECT_GT(npu_waits, 0);
}

TEST(Timeline, NoOpStartsBeforeWhatItWaitsOnEndsPlusSync) {
  const SolverOptions o = solver_options_for(sd8gen3());
  const Schedule s = schedule_from_shape(model_shape("llama3-8b"), {}, mixed_plan());
  for (int64_t n : {1, 40, 256}) {
    const Timeline t = compose_timeline(s, sd8gen3(), o, prefill(n));
    ASSERT_EQ(t.gpu.size(), s.gpu.size());
    ASSERT_EQ(t.npu.size(), s.npu.size());
    for (Device d : {Device::gpu, Device::npu}) {
      const std::vector<TimedOp>& ops = d == Device::gpu ? t.gpu : t.npu;
      for (size_t i = 0; i < ops.size(); ++i) {
        if (i > 0) {
          EXPECT_GE(ops[i].start_us, ops[i - 1].end_us);  // one op at a time per device
        }
        for (const OpRef& w : s.on(d)[i].waits) {
          EXPECT_GE(ops[i].start_us, t.at(w).end_us + o.sync_us - 1e-9)
              << "n=" << n << " op " << i << " starts before op " << w.index << " it waits on";
        }
        EXPECT_GE(ops[i].end_us, ops[i].start_us);
      }
    }
    // The critical path is a chain from time 0 to the step's end.
    ASSERT_FALSE(t.critical_path.empty());
    EXPECT_EQ(t.at(t.critical_path.front()).start_us, 0.0);
    EXPECT_DOUBLE_EQ(t.at(t.critical_path.back()).end_us, t.step_us);
    EXPECT_LE(std::max(t.gpu_busy_us, t.npu_busy_us), t.step_us + 1e-6);
  }
}

TEST(Timeline, GpuOnlyStepIsTheSumOfItsOps) {
  const SocProfile& soc = sd8gen3();
  const ModelShape& shape = model_shape("llama3-8b");
  const Schedule s = schedule_from_shape(shape, {}, Plan::gpu_only());
  EXPECT_TRUE(s.npu.empty());
  const Timeline t = compose_timeline(s, soc, solver_options_for(soc), prefill(128));
  double sum = 0;
  for (const TimedOp& op : t.gpu) sum += op.end_us - op.start_us;
  EXPECT_NEAR(t.step_us, sum, 1e-6 * sum);
  EXPECT_EQ(t.sync_us, 0.0);
  EXPECT_EQ(t.cross_edges, 0);
  // Independently: the matmuls alone at the roofline, 32 layers of q k v o gate up down.
  const int64_t kv_dim = shape.n_embd / shape.n_head * shape.n_head_kv;
  const auto mm = [&](int64_t m, int64_t k) {
    return gpu_modeled_us(soc, OpShape{OpKind::MatMul, DType::Q4_0, m, k, 128, true});
  };
  const double layer_matmuls = mm(shape.n_embd, shape.n_embd) * 2 + mm(kv_dim, shape.n_embd) * 2 +
                               mm(shape.n_ff, shape.n_embd) * 2 + mm(shape.n_embd, shape.n_ff);
  EXPECT_GT(t.step_us, layer_matmuls * shape.n_layer);
  EXPECT_LT(t.step_us, layer_matmuls * shape.n_layer * 1.3);  // the rest is norms, attention, ...
}

TEST(Timeline, AHostProfilesGapBetweenOpsIsChargedOncePerOpWithWork) {
  // [gpu.params] op_gap_us (+ op_gap_us_per_token x the step's tokens beyond the first) /
  // [npu] op_gap_us (a
  // profile fitted from traced steps): each op that
  // computes something is followed by that much of its device's idle time; the SoC files have
  // none, so their steps do not move.
  const ModelShape& shape = model_shape("tiny-fortune");
  const Schedule s = schedule_from_shape(shape, {}, Plan::gpu_only());
  const Timeline base = compose_timeline(s, sd8gen3(), solver_options_for(sd8gen3()), prefill(16));
  EXPECT_EQ(base.gap_us, 0.0);
  SocProfile host = sd8gen3();
  host.gpu.params["op_gap_us"] = 5;
  host.gpu.params["op_gap_us_per_token"] = 0.5;  // 16 tokens: 12.5 us an op
  const Timeline gapped = compose_timeline(s, host, solver_options_for(host), prefill(16));
  size_t with_work = 0;
  for (const TimedOp& op : gapped.gpu) with_work += op.tokens > 0;
  EXPECT_GT(with_work, 20u);
  EXPECT_NEAR(gapped.gap_us, 12.5 * with_work, 1e-9);
  EXPECT_NEAR(gapped.step_us - base.step_us, 12.5 * with_work, 1e-6);
}

TEST(Timeline, OnAHostWhoseDevicesShareTheCoresOverlappingOpsTakeTurns) {
  // [memory] shared_cores (a host profile fitted from traced steps: its "GPU" and "NPU" are
  // processes on the same CPU cores): an op overlapping the other device's ops is lengthened by
  // shared_cores x the overlap. A split down projection's two parts run at once, so at 1 the
  // later part waits out the earlier one; the SoC files have none.
  const ModelShape& shape = model_shape("llama3-8b");
  SocProfile soc = sd8gen3();
  soc.mem.dual_gbps = 0;  // the bandwidth rule off, so only the cores' rule is seen
  const auto schedule = [&](int64_t gpu_rows) {
    Plan plan = Plan::gpu_only();
    plan.at(MatmulRole::down) = {Strategy::weight_split, gpu_rows, 0};
    return schedule_from_shape(shape, {}, plan);
  };
  // The split whose parts take about as long (the shortest step): there the later part's wait
  // lands on the critical path.
  int64_t rows = 0;
  double best = 1e300;
  for (int64_t r = 256; r < shape.n_embd; r += 256) {
    const double us =
        compose_timeline(schedule(r), soc, solver_options_for(soc), prefill(64)).step_us;
    if (us < best) best = us, rows = r;
  }
  const Schedule s = schedule(rows);
  const Timeline apart = compose_timeline(s, soc, solver_options_for(soc), prefill(64));
  EXPECT_EQ(apart.contention_us, 0.0);
  soc.mem.shared_cores = 1;
  const Timeline shared = compose_timeline(s, soc, solver_options_for(soc), prefill(64));
  double overlap = 0;  // of the ops that were placed later, with the other device's ops
  for (const TimedOp& op : shared.gpu) overlap += op.contention_us;
  for (const TimedOp& op : shared.npu) overlap += op.contention_us;
  EXPECT_GT(shared.contention_us, 0.0);
  EXPECT_NEAR(shared.contention_us, overlap, 1e-6);
  EXPECT_GT(shared.step_us, apart.step_us);
  // Taking turns never makes the step longer than running the two devices' work one after the
  // other.
  EXPECT_LE(shared.step_us, apart.gpu_busy_us + apart.npu_busy_us + apart.sync_us + 1e-6);
  // Half a turn lies between.
  soc.mem.shared_cores = 0.5;
  const Timeline half = compose_timeline(s, soc, solver_options_for(soc), prefill(64));
  EXPECT_GT(half.step_us, apart.step_us);
  EXPECT_LT(half.step_us, shared.step_us);
}

TEST(Timeline, BalancedSplitMatmulBeatsEitherDeviceAlone) {
  const SocProfile& soc = sd8gen3();
  const SolverOptions o = solver_options_for(soc);
  const ModelShape& shape = model_shape("llama3-8b");
  auto down_us = [&](Placement p) {
    Plan plan = Plan::gpu_only();
    plan.at(MatmulRole::down) = p;
    const Schedule s = schedule_from_shape(shape, {}, plan);
    const Timeline t = compose_timeline(s, soc, o, prefill(256));
    // The layer-0 down projection: from its first part's start to its last part's end.
    double start = 1e300, end = 0;
    for (const std::vector<TimedOp>* list : {&t.gpu, &t.npu})
      for (const TimedOp& op : *list) {
        const ScheduleOp& so = s.on(op.ref.device)[op.ref.index];
        if (op.layer == 0 && so.kind == OpKind::MatMul && so.role == MatmulRole::down) {
          start = std::min(start, op.start_us);
          end = std::max(end, op.end_us);
        }
      }
    return end - start;
  };
  const double gpu = down_us({Strategy::gpu_only, 0, 0});
  const double npu = down_us({Strategy::npu_only, 0, 0});
  // Balance the rows by the two devices' speeds (NPU tile multiples).
  const double gpu_share = npu / (gpu + npu);
  const int64_t rows = static_cast<int64_t>(gpu_share * shape.n_embd / 32) * 32;
  const double split = down_us({Strategy::weight_split, rows, 0});
  EXPECT_LT(split, gpu) << "gpu " << gpu << " npu " << npu << " split rows " << rows;
  EXPECT_LT(split, npu) << "gpu " << gpu << " npu " << npu << " split rows " << rows;
}

TEST(Timeline, OnlinePrepareCompilesOncePerShapeAndPaddingPaysTheZeroFill) {
  const SocProfile& soc = sd8gen3();
  const SolverOptions o = solver_options_for(soc);
  const ModelShape& shape = model_shape("llama3-8b");
  Plan plan = Plan::npu_only();
  plan.npu_mode = NpuGraphMode::online_prepare;
  const Schedule s = schedule_from_shape(shape, {}, plan);
  const Timeline misaligned = compose_timeline(s, soc, o, prefill(300));
  // Distinct NPU shapes at 300 tokens: q/o (4096x4096), k/v (1024x4096), gate/up, down; the
  // logits run one row, the decode graph, no compile.
  const double expected = [&] {
    double c = 0;
    for (auto [m, k] :
         {std::pair<int64_t, int64_t>{4096, 4096}, {1024, 4096}, {14336, 4096}, {4096, 14336}})
      c += npu_graph_compile_us(soc, OpShape{OpKind::MatMul, DType::Q4_0, m, k, 300, true});
    return c;
  }();
  EXPECT_NEAR(misaligned.compile_us, expected, 1e-6 * expected);
  EXPECT_EQ(compose_timeline(s, soc, o, prefill(256)).compile_us, 0.0);  // a standard graph

  plan.npu_mode = NpuGraphMode::padding;
  const Timeline padded =
      compose_timeline(schedule_from_shape(shape, {}, plan), soc, o, prefill(300));
  EXPECT_GT(padded.copy_us, 0.0);
  EXPECT_EQ(padded.compile_us, 0.0);
}

TEST(Timeline, ContentionSlowsOnlyOverlapsThatOverdrawTheSharedBandwidth) {
  // A decode step with gate and up weight-split: GEMV halves on both devices at once.
  Plan plan = Plan::gpu_only();
  plan.at(MatmulRole::gate) = {Strategy::weight_split, 7168, 0};
  plan.at(MatmulRole::up) = {Strategy::weight_split, 7168, 0};
  const Schedule s = schedule_from_shape(model_shape("llama3-8b"), {}, plan);
  TimelineOptions decode = prefill(1);
  decode.context = 512;
  SocProfile tight = sd8gen3();
  tight.mem.dual_gbps = 30;  // less than GPU GEMV + NPU DMA draw together
  const SolverOptions o = solver_options_for(tight);
  const Timeline with = compose_timeline(s, tight, o, decode);
  decode.contention = false;
  const Timeline without = compose_timeline(s, tight, o, decode);
  EXPECT_GT(with.contention_us, 0.0);
  EXPECT_EQ(without.contention_us, 0.0);
  EXPECT_GT(with.step_us, without.step_us);
  // GPU-only has nothing to contend with.
  decode.contention = true;
  const Timeline alone = compose_timeline(
      schedule_from_shape(model_shape("llama3-8b"), {}, Plan::gpu_only()), tight, o, decode);
  EXPECT_EQ(alone.contention_us, 0.0);
  // A memory system that covers both streams (the pipelined GPU GEMV's memory.single_gbps plus
  // the NPU's DMA) never slows them.
  SocProfile roomy_soc = sd8gen3();
  roomy_soc.mem.dual_gbps = roomy_soc.mem.single_gbps + roomy_soc.npu.dma_gbps;
  const Timeline roomy = compose_timeline(s, roomy_soc, solver_options_for(roomy_soc), decode);
  EXPECT_EQ(roomy.contention_us, 0.0);
  // sd8gen3's is Memory-1's: each processor alone streams 40-45 GB/s, the two together ~60, so
  // the split decode's overlaps are slowed, but by less than the 30 GB/s profile's.
  const Timeline real = compose_timeline(s, sd8gen3(), solver_options_for(sd8gen3()), decode);
  EXPECT_GT(real.contention_us, 0.0);
  EXPECT_LT(real.contention_us, with.contention_us);
}

TEST(Timeline, AMatmulLatencySourceReplacesTheModelsForMatmulsOnly) {
  // host_check composes a step from measured op times: matmuls cost what the source says, the
  // rest stays on the SoC profile's models.
  struct Constant : LatencySource {
    double gpu_us(const OpShape&) const override { return 1000; }
    double npu_us(const OpShape&) const override { return 3000; }
  } constant;
  const SocProfile& soc = sd8gen3();
  const Schedule s = schedule_from_shape(model_shape("llama3.2-1b"), {}, mixed_plan());
  TimelineOptions t = prefill(1);
  const Timeline plain = compose_timeline(s, soc, solver_options_for(soc), t);
  t.matmul_latency = &constant;
  const Timeline measured = compose_timeline(s, soc, solver_options_for(soc), t);
  int matmuls = 0;
  for (const std::vector<TimedOp>* list : {&measured.gpu, &measured.npu})
    for (size_t i = 0; i < list->size(); ++i) {
      const TimedOp& op = (*list)[i];
      const TimedOp& before = (list == &measured.gpu ? plain.gpu : plain.npu)[i];
      if (op.tokens == 0) continue;
      if (op.kind == OpKind::MatMul || op.kind == OpKind::Logits) {
        ++matmuls;
        EXPECT_EQ(op.compute_us, op.ref.device == Device::gpu ? 1000.0 : 3000.0);
      } else {
        EXPECT_EQ(op.compute_us, before.compute_us);
      }
    }
  EXPECT_GT(matmuls, 0);
}

TEST(Timeline, BadInputIsAClearError) {
  const SocProfile& soc = sd8gen3();
  const SolverOptions o = solver_options_for(soc);
  const Schedule s = schedule_from_shape(model_shape("tiny-fortune"), {}, Plan::gpu_only());
  EXPECT_THROW(compose_timeline(s, soc, o, prefill(0)), Error);
  ModelShape bad = model_shape("tiny-fortune");
  bad.n_head = 7;  // 256 is not a multiple of 7
  EXPECT_THROW(schedule_from_shape(bad, {}, Plan::gpu_only()), Error);
  Schedule cycle;
  cycle.gpu.push_back(ScheduleOp{});
  cycle.npu.push_back(ScheduleOp{});
  cycle.gpu[0].waits.push_back({Device::npu, 0});
  cycle.npu[0].device = Device::npu;
  cycle.npu[0].waits.push_back({Device::gpu, 0});
  EXPECT_THROW(compose_timeline(cycle, soc, o, prefill(1)), Error);
  // A program whose op waits on a flag nobody publishes.
  BuiltPrograms built = build_for(mixed_plan());
  built.npu.ops.at(0)->wait_flags.push_back(99999);
  EXPECT_THROW(schedule_from_programs(built, NpuGraphMode::pipe), Error);
}

TEST(Timeline, TtftAndTpotOfLlama3_8bAreInThePapersRange) {
  const SocProfile& soc = sd8gen3();
  const ModelShape& shape = model_shape("llama3-8b");
  const double tpot = modeled_tpot_us(shape, {}, Plan::gpu_only(), soc, 256);
  // W4A16 8B decode streams ~4.6 GB of weights at ~37-43 GB/s: ~100-130 ms a token.
  EXPECT_GT(tpot, 80e3);
  EXPECT_LT(tpot, 200e3);
  const double ttft = modeled_ttft_us(shape, {}, Plan::npu_only(), soc, 256);
  EXPECT_GT(ttft, modeled_ttft_us(shape, {}, Plan::npu_only(), soc, 64));
}

}  // namespace
}  // namespace duet
